"""Small Triton kernels with torch references (EchoRL replay, prefix matching, bandwidth metrics).

Each module pairs a torch reference (the documented meaning) with an ``@triton.jit`` kernel, defined only when
triton imports, and a dispatcher: the kernel runs on CUDA tensors, or on CPU under ``TRITON_INTERPRET=1`` /
``ECHORL_USE_TRITON=1`` / ``use_triton=True``; the reference runs otherwise. See :mod:`._dispatch`.
"""

from __future__ import annotations

from echorl_agent.kernels._dispatch import HAS_TRITON, use_kernel
from echorl_agent.kernels.bandwidth import (
    attention_bandwidth_cost,
    bandwidth_efficiency,
    bandwidth_priority,
    effective_bandwidth_cost,
)
from echorl_agent.kernels.plan import ema_plan_update, plan_surprise
from echorl_agent.kernels.prefix_match import longest_common_prefix
from echorl_agent.kernels.sampling import PrioritySample, priority_sample

__all__ = [
    "HAS_TRITON",
    "use_kernel",
    "ema_plan_update",
    "plan_surprise",
    "longest_common_prefix",
    "PrioritySample",
    "priority_sample",
    "attention_bandwidth_cost",
    "effective_bandwidth_cost",
    "bandwidth_priority",
    "bandwidth_efficiency",
]
