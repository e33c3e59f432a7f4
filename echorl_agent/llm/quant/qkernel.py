"""The C kernel behind quantized decode (``qlinear.c``): compiled on first use, loaded with ctypes.

torch 2.13's CPU int8/int4 weight-only kernels have no AVX2 fast path (``docs/results/engine-speed.md``) and torchao
ships no CPU kernels, so the engine carries one small C file: a quantized linear for a few rows (int8: each 32-weight
group dequantized in registers and multiplied into float32 activations; int4: integer dot products with the
activations rounded to int16 per group, see :mod:`echorl_agent.llm.quant.linear`) and the fused decode step of
:mod:`echorl_agent.llm.quant.fused_decode`. It is built
once per machine with the system C compiler (``cc``/``gcc``, AVX2 + FMA when the CPU has them, portable C
otherwise) into ``$ECHORL_CACHE`` (default ``~/.cache/echorl``)/kernels and reused from there. ctypes releases
the GIL during the call; large matrices are split over ``torch.get_num_threads()`` threads.

Without a C compiler :func:`load` returns ``None`` (one warning) and :class:`~echorl_agent.llm.quant.QuantizedLinear`
falls back to dequantize-and-``F.linear``, which gives the same values more slowly.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import torch

from echorl_agent.kernels.cbuild import build_shared_library

__all__ = ["load", "q_linear"]

MT_MIN_WEIGHTS = 1 << 20
"""Calls with at least this many weights x rows use ``torch.get_num_threads()`` threads (each thread its own output
features, so a row's result does not depend on the thread count); smaller ones are not worth a thread start."""
_SRC = Path(__file__).with_name("qlinear.c")
_lib: ctypes.CDLL | None = None
_tried = False


def _flags() -> list[str]:
    simd = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return ["-O3", "-shared", "-fPIC", "-std=gnu99", "-pthread"] + (["-mavx2", "-mfma", "-mf16c"] if simd else [])


def _build() -> Path:
    return build_shared_library(_SRC, _flags(), libs=["-lm"])


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, or ``None`` (after one warning) when it cannot be built on this machine."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    try:
        lib = ctypes.CDLL(str(_build()))
    except OSError as exc:
        warnings.warn(f"quantized decode kernel unavailable ({exc}); using the slower dequantize + F.linear path",
                      RuntimeWarning, stacklevel=2)
        return None
    args = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    for fn in (lib.q4_linear, lib.q8_linear):
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.qlinear_simd.restype = ctypes.c_int
    lib.q_linear_mt.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_int]
    lib.q_linear_mt.restype = ctypes.c_int
    p, i, f, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
    lib.q_decode_layers.argtypes = [i, p, i, i, i, i, i, i, i, f, f, p, p, p, p, p, i64, p, p, i, p, i, p, i, i]
    lib.q_decode_layers.restype = ctypes.c_int
    _lib = lib
    return lib


def q_linear(bits: int, x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
             bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + bias`` for contiguous float32 ``x [M, K]`` with ``W`` as group-32 codes (see the C file).

    Raises:
        RuntimeError: the kernel is not available (check :func:`load` first).
    """
    lib = load()
    if lib is None:
        raise RuntimeError("quantized decode kernel unavailable; check echorl_agent.llm.quant.qkernel.load() first")
    M, K = x.shape
    N = d.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    threads = torch.get_num_threads() if N * K * M >= MT_MIN_WEIGHTS else 1
    if threads > 1:
        rc = lib.q_linear_mt(bits, x.data_ptr(), M, K, codes.data_ptr(), d.data_ptr(), m.data_ptr(), bias_ptr,
                             y.data_ptr(), N, threads)
    else:
        fn = lib.q4_linear if bits == 4 else lib.q8_linear
        rc = fn(x.data_ptr(), M, K, codes.data_ptr(), d.data_ptr(), m.data_ptr(), bias_ptr, y.data_ptr(), N, 0, N)
    if rc != 0:
        raise ValueError(f"in_features must be a multiple of 32, got K={K}")
    return y
