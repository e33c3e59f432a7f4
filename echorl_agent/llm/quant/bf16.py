"""bfloat16 projections for the engine's prefill of frozen layers (``EngineConfig.prefill_dtype="bfloat16"``).

Prefill is compute-bound on a CPU. Where the CPU multiplies bfloat16 natively -- AMX tiles (``amx_bf16``) or
AVX-512 BF16 (``avx512_bf16``) -- a bfloat16 GEMM with float32 accumulation runs several times faster than a float32
one (measured on a 2-core AMX Xeon: ``[512, 576] x [576, 1536]`` 3.6 ms vs 14.0 ms, docs/results/engine-speed.md).
Rounding activations and weights to bfloat16 (8 mantissa bits) moves SmolLM2's policy far less than int8 does (KL
0.0001 over GoToLocal's admissible actions vs 0.003 for smoothed W8A8) and needs no calibration. On a CPU without
those instructions (AVX2 only) bfloat16 products are emulated and slower than float32: keep float32 there
(:func:`cpu_has_native_bf16` says which).

:class:`BF16Linear` holds one or more projections that read the same input (q/k/v, or gate/up) as one bfloat16
weight; its interface is :class:`~echorl_agent.llm.quant.w8a8.W8A8Linear`'s (``splits``, float32 output), so the
engine runs either kind of layer with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["BF16Linear", "pack_bf16", "cpu_has_native_bf16"]


@cache
def cpu_has_native_bf16() -> bool:
    """True when ``/proc/cpuinfo`` lists ``amx_bf16`` or ``avx512_bf16`` (False where it cannot be read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


class BF16Linear(torch.nn.Module):
    """``[x W_1^T + b_1, x W_2^T + b_2, ...]`` with ``x`` and the weights rounded to bfloat16: the GEMM accumulates in
    float32 and returns bfloat16 (a CPU GEMM has no float32 output for bfloat16 inputs), which is widened to float32
    before the float32 biases are added; the residual stream the result is added to stays float32.

    Args:
        weights: float weights ``[out_i, in]`` of the projections that read the same input.
        biases: their biases (None entries allowed).
    """

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None = None) -> None:
        super().__init__()
        ws = [w.detach() for w in weights]
        if not ws or len({w.shape[1] for w in ws}) != 1:
            raise ValueError(f"weights must share in_features, got shapes {[tuple(w.shape) for w in ws]}")
        w = torch.cat(ws)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.splits = [x.shape[0] for x in ws]
        self.weight = w.to(torch.bfloat16).contiguous()
        bs = list(biases) if biases is not None else [None] * len(ws)
        if len(bs) != len(ws):
            raise ValueError(f"biases must have one entry per weight: {len(bs)} for {len(ws)}")
        self.bias = None if all(b is None for b in bs) else torch.cat(
            [torch.zeros(n, device=w.device) if b is None else b.detach().float()
             for n, b in zip(self.splits, bs, strict=True)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        if self.bias is not None:
            y += self.bias
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, splits={self.splits}"


def pack_bf16(linears: Sequence[torch.nn.Module]) -> BF16Linear:
    """A :class:`BF16Linear` of ``linears`` (``nn.Linear``-like: ``.weight``, ``.bias``) reading one input."""
    return BF16Linear([lin.weight for lin in linears], [lin.bias for lin in linears])
