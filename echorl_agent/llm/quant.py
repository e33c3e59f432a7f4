"""Quantized projections for the rollout engine's decode (``EngineConfig.weight_dtype``).

A decode step reads every projection weight once per token; at float32 that is ~540 MB per token for
SmolLM2-135M, so on a CPU decode speed is set by memory traffic. ``"int8"`` and ``"int4"`` keep packed copies of
the attention projections, MLP and LM head next to the float32 model (which stays the source of truth: the learner
updates it and :meth:`QuantizedLinear.requantize` re-packs from it; embeddings and norms stay float32).

Kernels, chosen by measurement on the reference machine (AMD EPYC, AVX2 + FMA + F16C, no AVX-512/VNNI, torch
2.13 CPU; all 211 SmolLM2 matrices, one decode row, 1 thread, busy machine, ratios of one alternating run; see
``benchmarks/RESULTS.md``, "Quantized decode"):

=====================================================  =================  ======================================
candidate                                              vs float32 linear  verdict
=====================================================  =================  ======================================
fbgemm ``quantized::linear_dynamic`` (int8 weights,    2.1x faster        **int8**: AVX2 ``vpmaddubsw`` kernels,
per-token int8 activations)                            (2.5x at 8 rows)   1 byte/weight read
fbgemm ``quantized::linear_dynamic_fp16``              0.9-1.5x           not worth a mode
plain int8 dequantize-in-chunks + ``F.linear``         0.3-0.5x           the dequantize pass costs more than
                                                                          the 3 saved bytes/weight
``aten._weight_int8pack_mm``                           ~16x slower        no AVX2 fast path in torch 2.13
``aten._weight_int4pack_mm_for_cpu``                   ~20-40x slower     no AVX2 fast path in torch 2.13
int4 nibble-unpack + dequantize-in-chunks              0.1-0.3x           **int4** (the fastest 4-bit option)
torchao 0.18.0 (installs without touching torch)       --                 its wheel has no CPU kernels: CPU
                                                                          layouts call the same aten ops above
=====================================================  =================  ======================================

So ``"int8"`` is the fast mode; ``"int4"`` is a memory/quality mode (projections at 1/8 of float32's bytes in
GGUF-Q4_1-style asymmetric groups of 32 along the input dimension, the LM head int8) that decodes *slower* than
float32 on AVX2 CPUs until torch ships an AVX2 int4 kernel. The int4 path dequantizes 256-row slices and runs
``F.linear``: on the full model it measured about as fast as ``_weight_int4pack_mm_for_cpu`` for one row, and
prefill (hundreds of rows) amortizes the dequantization over the rows where the aten kernel does not.

For the embedded SmolLM2 (a Q4_1 GGUF) int4 groups coincide with the GGUF blocks, so int4 reproduces those
weights almost exactly, while int8's error is dominated by its 7-bit per-token activations (teacher-forced
top-1 agreement with float32 on 6 prompts x 32 tokens: int8 0.84, int4 0.94).

int8 details. fbgemm quantizes the activation per tensor (one scale for all rows), which would make a row's result
depend on which other rows share the batch (prefill with vs without a cached prefix). Each row is therefore first
scaled to max-abs 1 and given two extra columns ``+1, -1`` (multiplied by two zero weight columns): every batch then
has min -1 and max +1, the same activation scale, and each row's result is independent of the batch -- the
prefix cache stays bit-exact within the int8 mode. In effect the activations are quantized per token (7 bits,
fbgemm's ``reduce_range`` for AVX2), so this is W8A8-dynamic rather than strictly weight-only.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
import torch.nn.functional as F

__all__ = [
    "WEIGHT_DTYPES", "QuantizedLinear", "quantize_model_linears", "linear_names", "check_weight_dtype", "lm_head_dtype"
]

WEIGHT_DTYPES = ("float32", "int8", "int4")
"""Values of ``EngineConfig.weight_dtype``."""

INT4_GROUP = 32
"""Input features per int4 scale/min group (as GGUF Q4_0/Q4_1 blocks)."""
REDUCE_RANGE = True
"""fbgemm's 7-bit activation range, which avoids int16 saturation of AVX2 ``vpmaddubsw`` (no VNNI here)."""
_INT4_CHUNK = 256
"""Output features dequantized at once by the int4 path (a [256, K] float32 slice stays in L2)."""


def check_weight_dtype(weight_dtype: str) -> str:
    """Return ``weight_dtype`` or raise a ValueError naming the field and the allowed values."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(
            f"weight_dtype must be one of {WEIGHT_DTYPES}, got weight_dtype={weight_dtype!r}; "
            "use 'float32' for exact decoding, 'int8' for fast CPU decoding or 'int4' for the smallest weights"
        )
    return weight_dtype


class QuantizedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` held as int8 (per output channel) or int4 (groups of 32) codes.

    Args:
        weight: float weight ``[out, in]``.
        bias: optional float bias ``[out]`` (kept in float32, added after the matmul).
        dtype: ``"int8"`` or ``"int4"``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: str) -> None:
        super().__init__()
        if dtype not in ("int8", "int4"):
            raise ValueError(f"QuantizedLinear dtype must be 'int8' or 'int4', got dtype={dtype!r}")
        if weight.device.type != "cpu":
            raise ValueError(f"weight_dtype={dtype!r} runs on CPU only, got a weight on {weight.device}; use float32")
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        if dtype == "int4" and self.in_features % (2 * INT4_GROUP):
            raise ValueError(f"int4 needs in_features divisible by {2 * INT4_GROUP}, got {self.in_features}")
        self.bias = None if bias is None else bias.detach().float().clone()
        self.requantize(weight)

    def requantize(self, weight: torch.Tensor) -> None:
        """Re-pack from a new float weight of the same shape (after a learner update)."""
        w = weight.detach().float()
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {tuple(w.shape)} != {(self.out_features, self.in_features)}")
        if self.dtype == "int8":
            self._pack_int8(w)
        else:
            self._pack_int4(w)

    # ------------------------------------------------------------------ int8 (fbgemm)
    def _pack_int8(self, w: torch.Tensor) -> None:
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()  # symmetric, per output channel
        w = F.pad(w, (0, 2))  # two zero columns for the +1/-1 range pins (module docstring)
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized-tensor creation is deprecated upstream, still the fbgemm API
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qw, None)
        self.scale = scale.float()

    def _forward_int8(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)  # [N, 1]
        pins = torch.tensor([1.0, -1.0], dtype=x.dtype).expand(x.shape[0], 2)
        xn = torch.cat([x / amax, pins], dim=-1)  # [N, K + 2], every row spans exactly [-1, 1]
        return torch.ops.quantized.linear_dynamic(xn, self._packed, REDUCE_RANGE) * amax

    # ------------------------------------------------------------------ int4 (groups of 32, asymmetric)
    def _pack_int4(self, w: torch.Tensor) -> None:
        n, k = w.shape
        g = w.view(n, k // INT4_GROUP, INT4_GROUP)
        lo = g.amin(dim=-1, keepdim=True)
        scale = ((g.amax(dim=-1, keepdim=True) - lo) / 15.0).clamp(min=1e-12)
        q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.uint8).view(n, k)
        half = k // 2
        self.codes = (q[:, :half] | (q[:, half:] << 4)).contiguous()  # [N, K/2]: low nibble j, high j + K/2
        self.scale = scale  # [N, K/32, 1]
        self.lo = lo

    def dequantized_weight(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """float32 ``W[start:stop]`` as the quantized codes represent it (int4 path and tests)."""
        if self.dtype == "int8":
            w = self._packed.unpack()[0] if hasattr(self._packed, "unpack") else torch.ops.quantized.linear_unpack(
                self._packed
            )[0]
            return w.dequantize()[start:stop, : self.in_features]
        b = self.codes[start:stop]
        u = torch.cat([b & 15, b >> 4], dim=1).view(b.shape[0], -1, INT4_GROUP).float()
        return torch.addcmul(self.lo[start:stop], u, self.scale[start:stop]).view(b.shape[0], self.in_features)

    def _forward_int4(self, x: torch.Tensor) -> torch.Tensor:
        parts = [
            F.linear(x, self.dequantized_weight(i, i + _INT4_CHUNK)) for i in range(0, self.out_features, _INT4_CHUNK)
        ]
        return torch.cat(parts, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()
        y = self._forward_int8(x2) if self.dtype == "int8" else self._forward_int4(x2)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def linear_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the linears the engine quantizes: every layer's projections + MLP, and the LM head."""
    n = len(model.model.layers)
    return [f"model.layers.{i}.{p}" for i in range(n) for p in _PROJECTIONS] + ["lm_head"]


def quantize_model_linears(
    model: torch.nn.Module, dtype: str, names: Iterable[str] | None = None
) -> dict[str, QuantizedLinear]:
    """Quantized copies of the model's linears, keyed by qualified name; the model itself is not modified.

    Args:
        model: a Llama-family causal LM (the layout :class:`~echorl_agent.llm.runner.ModelRunner` supports).
        dtype: ``"int8"`` or ``"int4"`` (``"float32"`` returns ``{}``: nothing to quantize).
        names: subset of :func:`linear_names` (default: all).
    """
    check_weight_dtype(dtype)
    if dtype == "float32":
        return {}
    out = {}
    for name in linear_names(model) if names is None else names:
        lin = model.get_submodule(name)
        out[name] = QuantizedLinear(lin.weight, lin.bias, lm_head_dtype(dtype) if name == "lm_head" else dtype)
    return out


def lm_head_dtype(dtype: str) -> str:
    """The LM head stays int8 in int4 mode, as GGUF Q4 files keep ``output``/``token_embd`` at Q8_0.

    Measured on SmolLM2-135M (teacher-forced top-1 agreement with float32 over 6 prompts x 32 tokens): int4
    everywhere 0.90, int4 projections + int8 head 0.94; the embedded GGUF's tied embedding is Q8_0 itself.
    """
    return "int8" if dtype == "int4" else dtype
