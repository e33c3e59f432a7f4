"""Fused decode steps for quantized weights: the whole decoder stack in one C call.

With ``weight_dtype`` int8/int4 the projections run in a C kernel (:mod:`echorl_agent.llm.quant.qkernel`) that is as fast
per token as llama.cpp's matmuls, but a Python decode step still dispatches ~20 torch ops per layer (norms, RoPE,
KV writes, attention, MLP glue): on SmolLM2-135M (30 layers) that was ~45 % of a step. :class:`FusedDecoder` runs
every layer of a pure decode step (one new token per sequence, at most ``KERNEL_ROWS`` sequences) in
``q_decode_layers`` (``qlinear.c``): RMSNorm, q/k/v with RoPE (cos/sin from the model's own rotary
embedding, so any RoPE scaling is honoured), the paged KV write and attention over each sequence's blocks, the
output projection, the gated SiLU MLP and both residuals (projection biases included: Qwen2's q/k/v). The embedding, the final norm and the LM head stay in Python.

The arithmetic is the model's (same weights, same formulas) in a different float summation order, so logits agree
with the unfused path to ~1e-5 (tested); each row's result is independent of the other rows in its batch. The path
is used only when it applies exactly: CPU, float32 activations, a quantized weight_dtype, SiLU MLPs, RMSNorms with
a weight, and every projection still the engine's quantized copy (a LoRA-wrapped module falls back to Python).
Modules are found through the model's :class:`~echorl_agent.llm.models.base.ModelLayout`.
With ``EngineConfig.float32_top_layers`` the C call runs the packed layers below and the runner's torch path the
float32 layers on top (the rows and their KV continue where the C call left them).
"""

from __future__ import annotations

import torch

from echorl_agent.llm.quant import qkernel
from echorl_agent.llm.quant.linear import QuantizedLinear

__all__ = ["FusedDecoder"]

_TAB = 30
"""int64 entries per layer in the table the C function reads: ln1, ln2, then (codes, d, m, bias) per linear."""


class FusedDecoder:
    """Runs all decoder layers of a decode step in one C call (see the module docstring).

    Build with :meth:`create`, which returns None when the model or the machine does not allow the fused path.
    Call :meth:`refresh` after the quantized weights were re-packed (``ModelRunner.refresh_weights``).
    """

    def __init__(self, runner) -> None:
        self.runner = runner
        layout = self.layout = runner.layout
        self.hidden = layout.hidden_size
        self.inter = layout.intermediate_size
        self.eps = layout.norm_eps_of(layout.input_norm(runner.layers[0]))
        self.bits = runner.quantized[layout.projection_name(0, "q")].bits
        self.num_layers = runner.num_packed_layers
        """Layers ``0..num_layers-1`` (the packed ones) run in the C call."""
        layers = runner.layers[: self.num_layers]
        # of every projection: its parent's _modules dict, its key there, the module the quantized copy was made from
        self._slots = [(parent, key, mod) for layer in layers
                       for (parent, key), mod in zip(layout.projection_slots(layer), layout.projections(layer),
                                                     strict=True)]
        self.refresh()

    @classmethod
    def create(cls, runner) -> FusedDecoder | None:
        """A fused decoder for ``runner``, or None when its model/weights/machine are not covered."""
        layout = runner.layout
        if not runner.num_packed_layers or runner.device.type != "cpu" or runner.dtype != torch.float32:
            return None
        if layout.hidden_act != "silu" or runner.head_dim % 8 or qkernel.load() is None:
            return None
        eps = {layout.norm_eps_of(norm) for layer in runner.layers
               for norm in (layout.input_norm(layer), layout.post_attention_norm(layer))}
        weighted = all(getattr(norm, "weight", None) is not None for layer in runner.layers
                       for norm in (layout.input_norm(layer), layout.post_attention_norm(layer)))
        if not weighted or len(eps) != 1 or None in eps:  # the C call takes one epsilon for every norm
            return None
        bits = {q.bits for name, q in runner.quantized.items() if name != layout.names.lm_head}
        if len(bits) != 1:
            return None
        return cls(runner)

    def refresh(self) -> None:
        """Rebuild the pointer table (the quantized copies are new tensors after a re-pack)."""
        r, layout = self.runner, self.layout
        rows, keep = [], []
        for li, layer in enumerate(r.layers[: self.num_layers]):
            ln1 = layout.input_norm(layer).weight.detach().float().contiguous()
            ln2 = layout.post_attention_norm(layer).weight.detach().float().contiguous()
            keep += [ln1, ln2]
            row = [ln1.data_ptr(), ln2.data_ptr()]
            for name in layout.projection_names(li):
                q: QuantizedLinear = r.quantized[name]
                row += [q.codes.data_ptr(), q.d.data_ptr(), q.m.data_ptr(), 0 if q.bias is None else q.bias.data_ptr()]
                keep.append(q)
            rows.append(row)
        self._keep = keep  # the table holds raw pointers: keep their tensors alive
        self.table = torch.tensor(rows, dtype=torch.int64)
        assert self.table.shape[1] == _TAB

    def applies(self) -> bool:
        """True while every projection of every layer is still the module the quantized copies were made from."""
        # plain dict lookups: ~25 us per decode step over SmolLM2's 30 layers x 7 modules (nn.Module.__getattr__
        # would cost ~1 ms)
        return all(parent[key] is mod for parent, key, mod in self._slots)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
        """Run the packed layers (``0..num_layers-1``) on ``x [M, hidden]`` (the token embeddings), writing their new
        K/V; returns the residual stream after them (``x`` itself, updated in place)."""
        r = self.runner
        x = x.float().contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        slots = slots.to(torch.int64).contiguous()
        tables = tables.to(torch.int64).contiguous()
        ctx_lens = ctx_lens.to(torch.int64).contiguous()
        m = x.shape[0]
        layer_stride = r.num_blocks * r.block_size * r.num_kv_heads * r.head_dim
        capture = r.capture_layer if r.h_pool is not None and r.capture_layer is not None else -1
        capture = capture if capture < self.num_layers else -1  # a float32 layer's input: captured by the runner
        rc = qkernel.load().q_decode_layers(
            self.num_layers, self.table.data_ptr(), self.bits, m, self.hidden, r.num_heads, r.num_kv_heads, r.head_dim,
            self.inter, self.eps, r.scale, x.data_ptr(), cos.data_ptr(), sin.data_ptr(), r.k_pool.data_ptr(),
            r.v_pool.data_ptr(), layer_stride, slots.data_ptr(), tables.data_ptr(), tables.shape[1],
            ctx_lens.data_ptr(), r.block_size, r.h_pool.data_ptr() if capture >= 0 else None, capture,
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"q_decode_layers failed (rc={rc}): unsupported shapes for the fused decode")
        return x
