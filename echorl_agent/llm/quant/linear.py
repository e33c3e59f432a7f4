"""Quantized projections for the rollout engine's decode (``EngineConfig.weight_dtype``).

A decode step reads every projection weight once per token; at float32 that is ~540 MB per token for
SmolLM2-135M, so on a CPU decode speed is set by memory traffic. ``"int8"`` and ``"int4"`` keep packed copies of
the attention projections, MLP and LM head next to the float32 model (which stays the source of truth: the learner
updates it and :meth:`QuantizedLinear.requantize` re-packs from it; embeddings and norms stay float32).

The weights are quantized in groups of 32 inputs with a scale and an offset each, GGUF's block size:
int4 is Q4_1's scheme and int8 picks per group the better of Q8_0's symmetric scheme and an asymmetric one. The
embedded SmolLM2 *is* a Q4_1 GGUF (Q8_0 embedding/LM head), so both modes reproduce its weights exactly (up to
float rounding) and decode the same tokens as float32 up to float summation order; a model trained away from
those grids (or loaded from float weights) pays a real quantization error, which the learner's truncated
importance weights correct (:mod:`echorl_agent.llm_rl.policy`).

Kernels, chosen by measurement on the reference machine (AMD EPYC, AVX2 + FMA + F16C, no AVX-512/VNNI, torch
2.13 CPU, 1 thread; ``docs/results/engine-speed.md``):

* ``aten._weight_int8pack_mm`` / ``_weight_int4pack_mm_for_cpu``: 4-7x *slower* than float32 ``F.linear`` for
  one row (no AVX2 fast path in torch 2.13); torchao 0.18 ships no CPU kernels (its CPU layouts call these).
* fbgemm ``quantized::linear_dynamic`` (int8 weights *and* 7-bit per-token activations): 2.2x faster than
  float32, but the activation rounding cost 16% of the next-token choices (teacher-forced agreement 0.84) and
  every 32-token greedy text of 50 diverged; it was this module's first int8 mode and was dropped.
* our C kernel (:mod:`echorl_agent.llm.quant.qkernel`, ``qlinear.c``): int8 dequantizes each group in AVX2
  registers once for up to 8 rows and multiplies float32 activations; int4 rounds the activations to int16 per
  group of 32 (~1e-5 of the group's largest input; int8 activations, llama.cpp's choice, cost 7-12% of the
  teacher-forced next tokens here) and multiplies with integer dot products, 1.4-1.6x faster than unpacking
  nibbles to float for one row. Decode steps run the whole layer stack in C
  (:mod:`echorl_agent.llm.quant.fused_decode`), which removed the per-op Python overhead that had held int8 decode
  at 0.53x llama.cpp's speed (now 0.92x int8, 1.17x int4: docs/results/engine-speed.md).

Up to ``KERNEL_ROWS`` rows (decode steps, short prefill chunks) run the kernel; long prefill chunks are
compute-bound and dequantize ``_CHUNK`` outputs at a time for ``F.linear`` (int4 with the kernel's int16
activation rounding, :func:`int16_activations`), so they cost about what float32's do. A row's result is
bit-identical for every batch of up to ``KERNEL_ROWS`` rows; between the kernel and the long prefill path it
differs only by summation order (for int4, plus the rounding flips that can cause), so with a quantized
weight_dtype the prefix cache can change logits slightly, not bitwise (float32 stays the exact mode).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from echorl_agent.llm.engine.config import QUANTIZED_BITS, WEIGHT_DTYPES, check_weight_dtype
from echorl_agent.llm.models.registry import layout_for
from echorl_agent.llm.quant import qkernel

__all__ = [
    "WEIGHT_DTYPES", "QuantizedLinear", "quantize_model_linears", "linear_names", "check_weight_dtype", "lm_head_dtype"
]

GROUP = 32
"""Input features per scale/offset group (as GGUF Q4_1 / Q8_0 blocks)."""
KERNEL_ROWS = 128
"""Up to this many rows (decode steps, short prefill chunks) run the C kernel; more rows (long prefill) dequantize
and use ``F.linear``. Measured on the reference machine (1 thread, a [1536, 576] weight): the kernel is 3.8x faster
at 16 rows, 1.45x at 60, 1.25x at 128 and 0.9x at 512 (the dequantization pass is paid once per call, the kernel
re-reads the packed weights for every 8 rows)."""
_CHUNK = 256
"""Output features dequantized at once on the prefill path (a [256, K] float32 slice stays in L2)."""
_HALF_MAX = float(torch.finfo(torch.float16).max)


def _half(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to float16 precision, kept as float32 for the arithmetic that follows."""
    return t.to(torch.float16).float()


def _nonzero(d: torch.Tensor) -> torch.Tensor:
    """Scales safe to divide by: a zero scale (a constant group, or one below float16's range) divides by 1 and
    its codes then do not matter, since every weight of the group dequantizes to the offset."""
    return torch.where(d > 0, d, torch.ones_like(d))


def _q4_grid(g: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Q4_1's grid for groups ``g [N, G, 32]``: 16 levels from the min, float16 ``d, m``; float codes 0..15."""
    d, m = _half((hi - lo) / 15.0), _half(lo)
    return torch.round((g - m) / _nonzero(d)).clamp(0, 15), d, m


def int16_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int4 kernel's activation rounding for float32 ``x [M, K]``: per row and group of 32 inputs,
    ``round(x / dx) * dx`` with ``dx = max|x| / 32767``; also returns the exact group sums ``[M, K / 32]``."""
    g = x.view(x.shape[0], -1, GROUP)
    dx = g.abs().amax(dim=-1, keepdim=True) / 32767.0
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    return (torch.round(g * inv) * dx).view_as(x), g.sum(dim=-1)


class QuantizedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` held as int8 or int4 codes in groups of 32 inputs.

    Each group of 32 inputs of one output has its own scale ``d`` and offset ``m`` (``w = d * q + m``), stored as
    float16 like GGUF's blocks (a decode step reads 0.625 bytes per int4 weight, 1.125 per int8 weight):

    * int4: ``q`` in 0..15 with ``d, m`` from the group's min/max (GGUF Q4_1's scheme and nibble layout).
    * int8: per group the best (smallest squared error) of symmetric ``q`` in -127..127 with ``m = 0`` (GGUF
      Q8_0's scheme), asymmetric ``q`` in -128..127 over the group's min/max, and Q4_1's 16-level grid. Both
      modes reproduce a GGUF Q4_1 block exactly and int8 a Q8_0 block, so the embedded SmolLM2 (a Q4_1 GGUF
      with a Q8_0 embedding) loses nothing by going back to int8 or int4.

    Activations stay float32 (int4 rounds them to int16 per group inside the product). Up to ``KERNEL_ROWS``
    rows (decode steps, short prefills) run the C kernel of :mod:`echorl_agent.llm.quant.qkernel`, which reads each
    packed weight once; more rows (prefill) dequantize ``_CHUNK`` outputs at a time and use ``F.linear``. Both
    compute the same arithmetic, so a row's result differs between the two paths only by float summation order.

    Args:
        weight: float weight ``[out, in]`` with ``in`` a multiple of 32.
        bias: optional float bias ``[out]`` (kept in float32, added after the matmul).
        dtype: ``"int8"`` or ``"int4"``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: str) -> None:
        super().__init__()
        if dtype not in QUANTIZED_BITS:
            raise ValueError(f"QuantizedLinear dtype must be one of {tuple(QUANTIZED_BITS)}, got dtype={dtype!r}")
        if weight.device.type != "cpu":
            raise ValueError(f"weight_dtype={dtype!r} runs on CPU only, got a weight on {weight.device}; use float32")
        self.dtype = dtype
        self.bits = QUANTIZED_BITS[dtype]
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP:
            raise ValueError(f"{dtype} needs in_features divisible by {GROUP}, got in_features={self.in_features}")
        self.bias = None if bias is None else bias.detach().float().contiguous().clone()
        self.requantize(weight)

    def requantize(self, weight: torch.Tensor) -> None:
        """Re-pack from a new float weight of the same shape (after a learner update)."""
        w = weight.detach().float()
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {tuple(w.shape)} != {(self.out_features, self.in_features)}")
        g = w.reshape(self.out_features, -1, GROUP)  # [N, G, 32]
        lo, hi = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
        finite = bool(torch.isfinite(lo).all() and torch.isfinite(hi).all())
        if not finite or max(-lo.min(), hi.max()) > _HALF_MAX / 2:
            raise ValueError(
                f"{self.dtype} stores group scales as float16: weights must be finite and below {_HALF_MAX / 2:g} "
                f"in magnitude, got range [{lo.min():g}, {hi.max():g}]; use float32"
            )
        # Scales and offsets are rounded to float16 first (GGUF's block format) and the codes chosen for the
        # rounded values, so the kernel's half-precision scales reproduce exactly what the codes were fitted to.
        if self.bits == 4:
            q, d, m = _q4_grid(g, lo, hi)
            q = q.to(torch.uint8)
            codes = q[..., :16] | (q[..., 16:] << 4)  # [N, G, 16]: low nibble input j, high nibble j + 16
        else:
            d_s = _half(torch.maximum(hi, -lo) / 127.0)
            q_s = torch.round(g / _nonzero(d_s)).clamp(-127, 127)
            d_a = _half((hi - lo) / 255.0)
            m_a = _half(lo + 128.0 * d_a)
            q_a = torch.round((g - m_a) / _nonzero(d_a)).clamp(-128, 127)
            # Q4_1's own grid (16 levels from the min): a 4-bit block's d/17 and lo + 128 d are not float16 values,
            # so without this candidate int8 would round the embedded model's Q4_1 blocks.
            q_4, d_4, m_4 = _q4_grid(g, lo, hi)
            qs, ds = torch.stack([q_s, q_a, q_4]), torch.stack([d_s, d_a, d_4])  # candidates first
            ms = torch.stack([torch.zeros_like(m_a), m_a, m_4])
            best = (qs * ds + ms - g).square().sum(-1, keepdim=True).argmin(dim=0, keepdim=True)  # [1, N, G, 1]
            codes = qs.gather(0, best.expand(1, *qs.shape[1:]))[0].to(torch.int8)
            d, m = ds.gather(0, best)[0], ms.gather(0, best)[0]
        self.codes = codes.reshape(self.out_features, -1).contiguous()
        self.d = d.reshape(self.out_features, -1).to(torch.float16).contiguous()
        self.m = m.reshape(self.out_features, -1).to(torch.float16).contiguous()

    def dequantized_weight(self, start: int = 0, stop: int | None = None, offsets: bool = True) -> torch.Tensor:
        """float32 ``W[start:stop]`` as the quantized codes represent it (``offsets=False``: ``d * q`` only)."""
        c = self.codes[start:stop]
        n = c.shape[0]
        if self.bits == 4:
            c = c.view(n, -1, GROUP // 2)
            q = torch.cat([c & 15, c >> 4], dim=-1)
        else:
            q = c.view(n, -1, GROUP)
        if not offsets:
            return (q.float() * self.d[start:stop, :, None].float()).view(n, self.in_features)
        w = torch.addcmul(self.m[start:stop, :, None].float(), q.float(), self.d[start:stop, :, None].float())
        return w.view(n, self.in_features)

    def reproduces(self, weight: torch.Tensor) -> bool:
        """True when the packed codes dequantize to exactly ``weight`` (a weight already on this grid, such as the
        embedded GGUF's Q4_1/Q8_0 blocks): then this linear computes the float32 one up to summation order."""
        return tuple(weight.shape) == (self.out_features, self.in_features) and torch.equal(
            self.dequantized_weight(), weight.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if x2.shape[0] <= KERNEL_ROWS and qkernel.load() is not None:
            y = qkernel.q_linear(self.bits, x2, self.codes, self.d, self.m, self.bias)
        else:
            # int8: float x times the dequantized weights; int4: the kernel's arithmetic, int16-rounded x times
            # d * q plus the offsets times x's exact group sums
            xr, sx = (x2, None) if self.bits == 8 else int16_activations(x2)
            y = torch.cat([F.linear(xr, self.dequantized_weight(i, i + _CHUNK, offsets=sx is None))
                           for i in range(0, self.out_features, _CHUNK)], dim=-1)
            if sx is not None:
                y = y + sx @ self.m.float().T
            if self.bias is not None:
                y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def linear_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the linears the engine quantizes: every layer's projections + MLP, and the LM head
    (:meth:`~echorl_agent.llm.models.base.ModelLayout.linear_names`)."""
    return layout_for(model.config).linear_names()


def quantize_model_linears(
    model: torch.nn.Module, dtype: str, names: Iterable[str] | None = None
) -> dict[str, QuantizedLinear]:
    """Quantized copies of the model's linears, keyed by qualified name; the model itself is not modified.

    Args:
        model: a causal LM of a family in :mod:`echorl_agent.llm.models` (what
            :class:`~echorl_agent.llm.engine.runner.ModelRunner` runs).
        dtype: ``"int8"`` or ``"int4"`` (``"float32"`` returns ``{}``: nothing to quantize).
        names: subset of :func:`linear_names` (default: all).
    """
    check_weight_dtype(dtype)
    if dtype == "float32":
        return {}
    layout = layout_for(model.config)
    out = {}
    for name in layout.linear_names() if names is None else names:
        lin = model.get_submodule(name)
        out[name] = QuantizedLinear(lin.weight, lin.bias,
                                    lm_head_dtype(dtype) if name == layout.names.lm_head else dtype)
    return out


def lm_head_dtype(dtype: str) -> str:
    """The LM head stays int8 in int4 mode, as GGUF Q4 files keep ``output``/``token_embd`` at Q8_0.

    The embedded GGUF's tied embedding is Q8_0 itself, which int8's groups of 32 reproduce exactly (int4 groups
    would round it: with the old per-channel scheme, int4 everywhere agreed with float32 on 0.90 of next tokens
    and int4 projections + int8 head on 0.94).
    """
    return "int8" if dtype == "int4" else dtype
