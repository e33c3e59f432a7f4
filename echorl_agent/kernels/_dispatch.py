"""Shared dispatch rule for the small Triton kernels of ``echorl_agent.kernels``.

Every kernel module pairs a torch reference (the documented meaning) with an ``@triton.jit`` kernel that is only
defined when :mod:`triton` imports. The dispatcher picks the kernel when

* ``use_triton=True`` is passed explicitly, or
* ``use_triton is None`` and either the inputs live on a CUDA device, or the environment asks for it:
  ``ECHORL_USE_TRITON=1`` or ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests),

and the torch reference otherwise. Nothing here touches global torch/triton configuration.
"""

from __future__ import annotations

import os

import torch

try:  # pragma: no cover - exercised only where triton is installed (the `kernels` extra)
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except Exception:  # ImportError, or a broken triton build raising at import time
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "triton", "tl", "use_kernel", "next_power_of_2"]


def _env_requests_triton() -> bool:
    return os.environ.get("ECHORL_USE_TRITON", "0") == "1" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_kernel(use_triton: bool | None, *tensors: torch.Tensor) -> bool:
    """Decide whether a dispatcher runs the Triton kernel (True) or the torch reference (False).

    Args:
        use_triton: True forces the kernel (ValueError-free only if triton imports), False forces the reference,
            None decides from the device of ``tensors`` and the environment (see module docstring).
        *tensors: the kernel inputs.

    Raises:
        RuntimeError: ``use_triton=True`` but triton is not importable.
    """
    if use_triton is False:
        return False
    if use_triton is True:
        if not HAS_TRITON:
            raise RuntimeError(
                "use_triton=True but triton is not importable; install the `kernels` extra "
                "(pip install 'echorl[kernels]') or pass use_triton=None to fall back to the torch reference"
            )
        return True
    if not HAS_TRITON:
        return False
    if any(t.is_cuda for t in tensors):
        return True
    return _env_requests_triton()


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= max(n, 1) (Triton block sizes must be powers of two)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()
