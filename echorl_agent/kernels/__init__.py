"""Triton kernels with torch references: paged decode attention for the engine (:mod:`.attention`) and the
latent-plan EMA / plan surprise of EchoRL Eq. 6-7 (:mod:`.plan`).

Each module pairs a torch reference (the documented meaning) with an ``@triton.jit`` kernel, defined only when
triton imports, and a dispatcher: the kernel runs on CUDA tensors, or on CPU under ``TRITON_INTERPRET=1`` /
``ECHORL_USE_TRITON=1`` / ``use_triton=True``; the reference runs otherwise. See :mod:`._dispatch`.
"""

from __future__ import annotations

from echorl_agent.kernels._dispatch import HAS_TRITON, use_kernel
from echorl_agent.kernels.plan import ema_plan_update, plan_surprise

__all__ = [
    "HAS_TRITON",
    "use_kernel",
    "ema_plan_update",
    "plan_surprise",
]
