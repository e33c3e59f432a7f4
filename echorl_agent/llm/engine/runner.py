"""Model runner: a varlen, paged-KV forward pass of Llama-like models built from the HF modules.

transformers' own forward keeps one contiguous cache per batch row, which makes continuous batching of sequences of
different lengths (and sharing prefix blocks between them) awkward. The runner reuses the HF model's modules
(embeddings, RMSNorms, projections, rotary embedding, MLPs, LM head) so the arithmetic is the model's own, and
replaces only the attention bookkeeping: all new tokens of a step (prefill chunks and decode tokens of many
sequences) are flattened into one ``[N, hidden]`` batch, their K/V written into a block pool, and attention reads
each sequence's prefix + rolling blocks through :func:`echorl_agent.kernels.attention.paged_attention`.

Supported: the families of :mod:`echorl_agent.llm.models` (pre-norm RMSNorm, RoPE, grouped-query attention, gated
MLP): Llama, SmolLM2, Qwen2 (q/k/v biases), Mistral (no sliding window). The runner reaches every module through the
model's :class:`~echorl_agent.llm.models.base.ModelLayout`, never by name.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from echorl_agent.kernels.attention import (
    PrefixPlan,
    decode_plan,
    paged_attention,
    paged_decode_attention,
    prefix_plan,
)
from echorl_agent.llm.engine.calibration import (
    LayerMaxima,
    W8A8Layer,
    activation_maxima,
    pack_layer,
    pack_layer_bf16,
)
from echorl_agent.llm.engine.config import check_prefill_dtype
from echorl_agent.llm.models.registry import layout_for
from echorl_agent.llm.quant.bf16 import cpu_has_native_bf16
from echorl_agent.llm.quant.fused_decode import FusedDecoder
from echorl_agent.llm.quant.linear import (
    KERNEL_ROWS,
    QuantizedLinear,
    quantize_model_linears,
)

__all__ = ["ModelRunner", "SeqChunk"]

_SMALL_BATCH_ROWS = 32
"""Up to this many token rows (decode steps) the projections run in output-dimension slices, see
:meth:`ModelRunner._linear`."""
_OUT_SLICE = 256
"""Output features per slice."""


@dataclass
class SeqChunk:
    """New tokens of one sequence for one forward step."""

    token_ids: list[int]
    """The tokens to run (prefill chunk or the one decode token)."""
    start_pos: int
    """Absolute position of ``token_ids[0]`` (= tokens already in the KV)."""
    block_table: list[int]
    """Pool blocks of the whole sequence (must cover ``start_pos + len(token_ids)`` tokens)."""
    all_logits: bool = False
    """Return logits for every new token (scoring) instead of only the last one."""
    embeds: torch.Tensor | None = None
    """``[len(token_ids), hidden]``: added to the residual stream of these tokens entering layer ``embeds_layer``
    (soft tokens such as EchoRL's plan embeddings; the layers below see only ``token_ids``)."""
    embeds_layer: int = 0
    """Layer whose input ``embeds`` is added to (0 = the token embeddings)."""
    prefix_group: int | None = None
    """Chunks of one step with the same ``prefix_group`` promise the same KV before ``start_pos`` (equal in all of
    them, e.g. the candidates of one scoring context): attention reads that prefix once for the group."""


class FlatBatch(NamedTuple):
    """The new tokens of one step's chunks, laid out as one flat batch of ``N`` tokens over ``B`` chunks."""

    ids: torch.Tensor
    """``[N]`` token ids."""
    pos: torch.Tensor
    """``[N]`` absolute positions."""
    slots: torch.Tensor
    """``[N]`` KV pool slot of each token (``block * block_size + offset``)."""
    cu: list[int]
    """``B + 1`` chunk boundaries in the flat batch (chunk ``i`` is ``cu[i]:cu[i + 1]``)."""
    cu_t: torch.Tensor
    """``[B + 1]`` the same boundaries on the device."""
    tables: torch.Tensor
    """``[B, max_blocks]`` block tables, zero-padded."""
    ctx: torch.Tensor
    """``[B]`` context length of each sequence after this step."""
    n: int
    """``N``, the number of new tokens."""
    prefix: PrefixPlan | None = None
    """Attention plan of the chunks that share a prefix (``SeqChunk.prefix_group``), built once for every layer."""


class ModelRunner:
    """Runs paged-KV forward steps for an HF model of a family in :mod:`echorl_agent.llm.models`.

    Args:
        model: a ``transformers`` causal LM of a type in :data:`~echorl_agent.llm.models.registry.SUPPORTED_MODEL_TYPES`.
        num_blocks: KV pool size in blocks.
        block_size: tokens per block.
        attention_backend: ``"auto"`` (Triton on CUDA, torch reference otherwise), ``"torch"`` or ``"triton"``.
        weight_dtype: ``"float32"`` (the model's own weights, exact), ``"int8"`` or ``"int4"`` (packed copies of
            the projections, MLP and LM head, see :mod:`echorl_agent.llm.quant.linear`).
        float32_top_layers: with a quantized ``weight_dtype``, the top k decoder layers are not packed and run on
            the model's float32 weights (decode steps: the fused C call for the layers below, torch for these);
            with ``prefill_dtype`` "int8" or "bfloat16" they also keep float32 prefill.
        prefill_dtype: ``"float32"``, ``"int8"`` or ``"bfloat16"``: the layers below the float32 top layers run
            their projections as W8A8 (:mod:`echorl_agent.llm.quant.w8a8`, once :meth:`calibrate_prefill` has run;
            the engine calls it when it is built) or in bfloat16 (:mod:`echorl_agent.llm.quant.bf16`; their
            attention too, ``paged_attention(compute_dtype=torch.bfloat16)``) on forward steps with more tokens than
            sequences.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        attention_backend: str = "auto",
        weight_dtype: str = "float32",
        float32_top_layers: int = 0,
        prefill_dtype: str = "float32",
    ):
        layout = self.layout = layout_for(model.config)  # raises on a model type without a layout
        if layout.sliding_window is not None:
            raise ValueError(
                f"the paged-KV engine attends to the whole context, the {layout.model_type} model has sliding-window "
                f"attention (sliding_window={layout.sliding_window}); load a model without a window, or set "
                "config.sliding_window=None when every context stays shorter than the window"
            )
        if attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton', got {attention_backend!r}")
        self.model = model
        self.layers = layout.decoder_layers(model)
        self.num_layers = len(self.layers)
        self.num_heads = layout.num_heads
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = layout.head_dim
        self.scale = self.head_dim**-0.5
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.attention_backend = attention_backend
        if not 0 <= float32_top_layers <= self.num_layers:
            raise ValueError(f"float32_top_layers must be in [0, {self.num_layers}], got "
                             f"float32_top_layers={float32_top_layers}")
        self.num_packed_layers = self.num_layers - float32_top_layers if weight_dtype != "float32" else 0
        """Decoder layers ``0..num_packed_layers-1`` run packed weights; the layers above run float32."""
        self.quantized: dict[str, QuantizedLinear] = quantize_model_linears(  # checks the name
            model, weight_dtype, layout.linear_names(range(self.num_packed_layers)))
        self.weight_dtype = weight_dtype
        self._quant_of = {model.get_submodule(name): q for name, q in self.quantized.items()}  # module -> packed
        self._apply_rope = layout.rope_function(model)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # [L, num_blocks, block_size, H_kv, D]
        shape = (self.num_layers, num_blocks, block_size, self.num_kv_heads, self.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.capture_layer: int | None = None
        self.h_pool: torch.Tensor | None = None  # [num_blocks * block_size, hidden], see enable_capture
        self.fused = FusedDecoder.create(self)
        """Runs whole decode steps in C with quantized weights (:mod:`echorl_agent.llm.quant.fused_decode`); None when
        it does not apply. ``use_fused_decode = False`` keeps the per-op Python path (for comparisons)."""
        self.use_fused_decode = True
        self.prefill_dtype = check_prefill_dtype(prefill_dtype)
        self.num_w8a8_layers = self.num_layers - float32_top_layers if prefill_dtype == "int8" else 0
        """Decoder layers ``0..num_w8a8_layers-1`` run W8A8 projections in prefill (after calibration)."""
        if self.num_w8a8_layers and self.device.type != "cpu":
            raise ValueError(f"prefill_dtype='int8' runs on CPU only, got a model on {self.device}; use float32")
        self.prefill_maxima: dict[int, LayerMaxima] = {}
        """Calibrated per-channel activation maxima of each W8A8 layer (:meth:`calibrate_prefill`)."""
        self.w8a8: dict[int, W8A8Layer] = {}
        """Layer index -> its low-precision prefill projections: W8A8 (empty until :meth:`calibrate_prefill`) or,
        with ``prefill_dtype="bfloat16"``, bfloat16 copies of the frozen layers' weights (built here)."""
        if prefill_dtype == "bfloat16":
            if self.device.type == "cpu" and not cpu_has_native_bf16():
                warnings.warn("prefill_dtype='bfloat16' on a CPU without AMX or AVX-512 BF16 (/proc/cpuinfo): its "
                              "bfloat16 products are emulated and slower than float32; keep prefill_dtype='float32'",
                              stacklevel=3)
            self.w8a8 = {i: self._pack_prefill_layer(i) for i in range(self.num_layers - float32_top_layers)}

    def calibrate_prefill(self, token_lists: list[list[int]]) -> None:
        """Take the W8A8 layers' activation maxima from the float32 model on ``token_lists`` and (re-)pack them.

        KV computed before this call came from the old packing: the caller invalidates its prefix cache.
        """
        if not self.num_w8a8_layers:
            raise ValueError(f"calibrate_prefill needs prefill_dtype='int8' and a layer below the float32 top "
                             f"layers, got prefill_dtype={self.prefill_dtype!r}, {self.num_w8a8_layers} W8A8 layers")
        layers = list(range(self.num_w8a8_layers))
        self.prefill_maxima = activation_maxima(self.model, layers, token_lists)
        self.w8a8 = {i: self._pack_prefill_layer(i) for i in layers}

    def _pack_prefill_layer(self, i: int) -> W8A8Layer:
        """Layer ``i``'s low-precision prefill projections from its current weights (W8A8 with its calibrated
        maxima, or bfloat16)."""
        if self.prefill_dtype == "bfloat16":
            return pack_layer_bf16(self.layout, self.layers[i])
        return pack_layer(self.layout, self.layers[i], self.prefill_maxima.get(i))

    def enable_capture(self, layer: int | None) -> None:
        """Keep every token's residual stream entering ``layer`` in a pool beside the KV (None: stop).

        The pool is indexed by the same slots as the KV, so a prefix-cached block carries the activations of its
        tokens as well; :meth:`gather_hidden` reads them back. A learner that trains only layers ``>= layer``
        starts from these activations instead of recomputing the frozen layers below (exact: same weights, same
        arithmetic as the rollout).
        """
        if layer is None:
            self.capture_layer, self.h_pool = None, None
            return
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"capture layer must be in [0, {self.num_layers}), got layer={layer}")
        self.capture_layer = int(layer)
        hidden = self.layout.hidden_size
        self.h_pool = torch.zeros(self.num_blocks * self.block_size, hidden, dtype=self.dtype, device=self.device)

    def gather_hidden(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Captured activations ``[end - start, hidden]`` of tokens ``start..end-1`` of a sequence (a copy)."""
        if self.h_pool is None:
            raise RuntimeError("activation capture is off; call enable_capture(layer) first")
        bs = self.block_size
        slots = [block_table[p // bs] * bs + p % bs for p in range(start, end)]
        return self.h_pool[torch.tensor(slots, dtype=torch.long, device=self.device)].clone()

    @staticmethod
    def kv_bytes_per_token(model: torch.nn.Module) -> int:
        """Bytes of K+V one token occupies across all layers."""
        layout = layout_for(model.config)
        elt = next(model.parameters()).element_size()
        return 2 * layout.num_layers * layout.num_kv_heads * layout.head_dim * elt

    def _use_triton(self) -> bool:
        if self.attention_backend == "triton":
            return True
        if self.attention_backend == "torch":
            return False
        return self.device.type == "cuda"

    def refresh_weights(self, names: list[str] | None = None) -> list[str]:
        """Re-pack the quantized linears after the float32 weights changed (a learner update).

        Args:
            names: changed parameter names (``model.named_parameters()``'s) or linear names; None = all.
                The tied embedding (:attr:`ModelLayout.embedding_weight_name`) refreshes the LM head that shares it.

        Returns:
            The linears re-packed (empty in float32 mode, which reads the model's weights directly). A W8A8
            prefill layer (:meth:`calibrate_prefill`) is re-packed whole when any of its weights changed, with its
            calibrated maxima; its seven projections are listed.
        """
        w8a8 = sorted(self.w8a8) if names is None else self._w8a8_layers_of(names)
        for i in w8a8:
            self.w8a8[i] = self._pack_prefill_layer(i)
        repacked = [n for i in w8a8 for n in self.layout.projection_names(i)]
        if not self.quantized:
            return repacked
        todo = list(self.quantized) if names is None else self._linears_of(names)
        for name in todo:
            lin = self.model.get_submodule(name)
            self.quantized[name].requantize(lin.weight)
            if lin.bias is not None:
                self.quantized[name].bias = lin.bias.detach().float().clone()
        if self.fused is not None:
            self.fused.refresh()
        return todo + [n for n in repacked if n not in self.quantized]

    def _w8a8_layers_of(self, names: list[str]) -> list[int]:
        """Low-precision prefill layers holding one of the parameter/linear ``names`` (:meth:`ModelLayout.layer_of`)."""
        return sorted({i for i in map(self.layout.layer_of, names) if i is not None and i in self.w8a8})

    def reproduces_layers(self, stop: int) -> bool:
        """True when decoder layers ``0..stop-1`` compute what the float32 model computes, up to float summation
        order: always in float32 mode; with int8/int4, when every packed projection of those layers dequantizes to
        exactly the model's float weight (:meth:`QuantizedLinear.reproduces`; the embedded SmolLM2 GGUF's layers
        do; int4 also rounds activations to int16, ~1e-5 of a group's largest input). Activations captured entering
        layer ``stop`` are then valid for a float32 learner of the layers above.
        """
        prefixes = tuple(self.layout.layer_prefix(i) for i in range(stop))
        return all(q.reproduces(self.model.get_submodule(name).weight)
                   for name, q in self.quantized.items() if name.startswith(prefixes))

    def _linears_of(self, names: list[str]) -> list[str]:
        known = set(self.quantized)
        tied = self.layout.tied(self.model)
        lm_head = self.layout.names.lm_head
        out: dict[str, None] = {}
        for n in names:
            base = n.rsplit(".", 1)[0] if n.endswith((".weight", ".bias")) else n
            if base in known:
                out[base] = None
            elif tied and n in (self.layout.embedding_weight_name, self.layout.names.embedding):
                out[lm_head] = None
        return list(out)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's KV in every layer (copy-on-write of a shared partial block)."""
        self.k_pool[:, dst] = self.k_pool[:, src]
        self.v_pool[:, dst] = self.v_pool[:, src]
        if self.h_pool is not None:
            bs = self.block_size
            self.h_pool[dst * bs : (dst + 1) * bs] = self.h_pool[src * bs : (src + 1) * bs]

    def _linear(self, x: torch.Tensor, lin: torch.nn.Module) -> torch.Tensor:
        """``lin(x)`` (``x W^T + b``); for a few rows, computed over slices of the output features.

        With ``weight_dtype`` int8/int4 the packed copy of ``lin`` runs instead (:mod:`echorl_agent.llm.quant.linear`).

        Each output element is the same dot product either way, but with a handful of rows (a decode step) the
        CPU BLAS is markedly faster on narrow weight slices than on one wide weight (measured on SmolLM2-135M:
        the ``[8, 576] x [576, 49152]`` LM head takes about half the time in 256-row slices), so decode steps
        use slices and prefill keeps the single GEMM.
        """
        q = self._quant_of.get(lin)
        if q is not None:
            return q(x).to(x.dtype)
        n_out = lin.weight.shape[0]
        if x.device.type != "cpu" or not 1 < x.shape[0] <= _SMALL_BATCH_ROWS or n_out <= _OUT_SLICE:
            return lin(x)
        w, b = lin.weight, lin.bias
        parts = [
            F.linear(x, w[i : i + _OUT_SLICE], None if b is None else b[i : i + _OUT_SLICE])
            for i in range(0, n_out, _OUT_SLICE)
        ]
        return torch.cat(parts, dim=-1)

    def _mlp_w8a8(self, packed: W8A8Layer, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """:meth:`_mlp` with W8A8 or bfloat16 projections (gate and up in one product)."""
        gate, up = packed.gate_up(x).split(packed.gate_up.splits, dim=-1)
        return packed.down(self.layout.activation(layer)(gate) * up)

    def _mlp(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The gated MLP of one layer (``down(act(gate(x)) * up(x))``, as HF's ``LlamaMLP.forward``)."""
        if not self._quant_of and (x.device.type != "cpu" or not 1 < x.shape[0] <= _SMALL_BATCH_ROWS):
            return self.layout.mlp(layer)(x)
        return self.layout.mlp_forward(layer, x, self._linear)

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk], return_hidden: bool = False):
        """Run one step over the new tokens of several sequences; writes their KV into the pool.

        Args:
            chunks: the new tokens of each sequence.
            return_hidden: also return the final (normed) hidden states of the rows whose logits are returned.

        Returns:
            Per chunk, float32 logits ``[vocab]`` of its last token, or ``[T, vocab]`` when ``all_logits``; with
            ``return_hidden``, a pair ``(logits, hidden)`` of such lists.
        """
        batch = self._flat_batch(chunks)
        x = self._run_layers(chunks, batch)  # [N, hidden]
        out, hid = self._gather_logits(chunks, batch, x)
        return (out, hid) if return_hidden else out

    def _flat_batch(self, chunks: list[SeqChunk]) -> FlatBatch:
        """Lay the chunks' new tokens out as one flat batch (validating each chunk against its block table)."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        cu = [0]
        ctx_lens = []
        max_blocks = 1
        for c in chunks:
            if not c.token_ids:
                raise ValueError("a SeqChunk needs at least one token")
            end = c.start_pos + len(c.token_ids)
            if len(c.block_table) * bs < end:
                raise ValueError(f"block_table covers {len(c.block_table) * bs} tokens, the chunk ends at {end}")
            ids.extend(c.token_ids)
            for p in range(c.start_pos, end):
                pos.append(p)
                slots.append(c.block_table[p // bs] * bs + p % bs)
            cu.append(len(ids))
            ctx_lens.append(end)
            max_blocks = max(max_blocks, len(c.block_table))
        dev = self.device
        tables = torch.zeros(len(chunks), max_blocks, dtype=torch.long)
        for i, c in enumerate(chunks):
            tables[i, : len(c.block_table)] = torch.tensor(c.block_table, dtype=torch.long)
        tables = tables.to(dev)
        cu_t = torch.tensor(cu, dtype=torch.long, device=dev)
        ctx = torch.tensor(ctx_lens, dtype=torch.long, device=dev)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            if c.prefix_group is not None:
                groups.setdefault(c.prefix_group, []).append(i)
        plan = None
        if groups and len(ids) > len(chunks) and not self._use_triton():  # not a decode step; the kernel needs none
            plan = prefix_plan(tables, ctx, cu_t, list(groups.values()), bs)
        return FlatBatch(
            ids=torch.tensor(ids, dtype=torch.long, device=dev),
            pos=torch.tensor(pos, dtype=torch.long, device=dev),
            slots=torch.tensor(slots, dtype=torch.long, device=dev),
            cu=cu,
            cu_t=cu_t,
            tables=tables,
            ctx=ctx,
            n=len(ids),
            prefix=plan,
        )

    def _run_layers(self, chunks: list[SeqChunk], batch: FlatBatch) -> torch.Tensor:
        """Embed the flat batch, add soft tokens, run every decoder layer (writing its KV); the residual ``[N, hidden]``.

        A pure decode step runs the fused C path when it applies, else the torch/Triton layers below. Any other step
        runs the frozen layers' projections in int8 when ``prefill_dtype="int8"`` (:meth:`calibrate_prefill`) or in
        bfloat16 when ``prefill_dtype="bfloat16"``.
        """
        bs = self.block_size
        dev = self.device
        ids_t, pos_t, slots_t, cu, cu_t = batch.ids, batch.pos, batch.slots, batch.cu, batch.cu_t
        tables, ctx_t, n = batch.tables, batch.ctx, batch.n
        use_triton = self._use_triton()

        # a scoring step (candidate tokens, all logits read) runs as prefill even when every chunk has one token (a
        # two-token candidate without its last token): the prefill arithmetic whatever the candidates' lengths, and
        # the candidates of one context read its KV once (SeqChunk.prefix_group) instead of once each
        scoring = any(c.all_logits for c in chunks)
        # a pure decode step (one new token per sequence) on the torch path: the gather rows and padding mask
        # depend only on the block tables, so they are built once here instead of once per layer
        pure_decode = not use_triton and n == len(chunks) and not scoring

        layout = self.layout
        x = layout.embedding(self.model)(ids_t)  # [N, hidden]
        injections: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for i, c in enumerate(chunks):
            if c.embeds is not None:
                if tuple(c.embeds.shape) != (len(c.token_ids), x.shape[-1]):
                    raise ValueError(
                        f"SeqChunk.embeds must be [{len(c.token_ids)}, {x.shape[-1]}], got {tuple(c.embeds.shape)}"
                    )
                injections.setdefault(c.embeds_layer, []).append((i, c.embeds))
        cos, sin = layout.rotary(self.model)(x, pos_t[None, :])  # [1, N, D]
        cos, sin = cos[0], sin[0]
        flat = (self.num_layers, self.num_blocks * bs, self.num_kv_heads, self.head_dim)
        k_flat, v_flat = self.k_pool.view(flat), self.v_pool.view(flat)
        fused = (self.fused is not None and self.use_fused_decode and pure_decode and n <= KERNEL_ROWS
                 and not injections and self.fused.applies())
        first = self.fused.num_layers if fused else 0  # layers below run in C; the float32 top layers in torch
        plan = decode_plan(tables, ctx_t, bs, self.num_kv_heads) if pure_decode and first < self.num_layers else None
        if fused:
            x = self.fused.run(x, cos, sin, slots_t, tables, ctx_t)
        w8a8 = self.w8a8 if n > len(chunks) or scoring else {}  # prefill / scoring rows: low precision in the frozen layers
        # a bfloat16 prefill also attends in bfloat16 in those layers (the int8 path's attention stays float32)
        attn_dtype = torch.bfloat16 if self.prefill_dtype == "bfloat16" else torch.float32
        for li, layer in enumerate(self.layers[first:], start=first):
            if li == self.capture_layer:  # before injection: captured activations never depend on soft tokens
                self.h_pool[slots_t] = x
            for i, e in injections.get(li, ()):
                x[cu[i] : cu[i + 1]] += e.to(device=dev, dtype=x.dtype)
            wq, wk, wv, wo = layout.attention_projections(layer)
            h = layout.input_norm(layer)(x)
            packed = w8a8.get(li)
            if packed is not None:
                q, k, v = packed.qkv(h).split(packed.qkv.splits, dim=-1)
                q = q.reshape(n, self.num_heads, self.head_dim)
                k = k.reshape(n, self.num_kv_heads, self.head_dim)
                v = v.reshape(n, self.num_kv_heads, self.head_dim)
            else:
                q = self._linear(h, wq).view(n, self.num_heads, self.head_dim)
                k = self._linear(h, wk).view(n, self.num_kv_heads, self.head_dim)
                v = self._linear(h, wv).view(n, self.num_kv_heads, self.head_dim)
            q, k = self._apply_rope(q, k, cos, sin, unsqueeze_dim=1)
            k_flat[li, slots_t] = k
            v_flat[li, slots_t] = v
            if plan is not None:
                o = paged_decode_attention(q, self.k_pool[li], self.v_pool[li], plan, self.scale)
            else:
                o = paged_attention(q, self.k_pool[li], self.v_pool[li], tables, ctx_t, cu_t, self.scale,
                                    use_triton=use_triton, prefix=batch.prefix,
                                    compute_dtype=attn_dtype if packed is not None else torch.float32)
            o = o.reshape(n, self.num_heads * self.head_dim)
            if packed is not None:
                x = x + packed.o(o)
                x = x + self._mlp_w8a8(packed, layer, layout.post_attention_norm(layer)(x))
            else:
                x = x + self._linear(o, wo)
                x = x + self._mlp(layer, layout.post_attention_norm(layer)(x))
        return x

    def _gather_logits(
        self, chunks: list[SeqChunk], batch: FlatBatch, x: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Final norm and LM head only where needed: the last token of each chunk, or all tokens of scoring chunks."""
        cu = batch.cu
        rows: list[int] = []
        spans: list[tuple[int, int]] = []
        for i, c in enumerate(chunks):
            lo = len(rows)
            if c.all_logits:
                rows.extend(range(cu[i], cu[i + 1]))
            else:
                rows.append(cu[i + 1] - 1)
            spans.append((lo, len(rows)))
        hidden = self.layout.final_norm(self.model)(x[torch.tensor(rows, device=self.device)])
        logits = self._linear(hidden, self.layout.lm_head(self.model)).float()
        out, hid = [], []
        for c, (lo, hi) in zip(chunks, spans, strict=True):
            out.append(logits[lo:hi] if c.all_logits else logits[lo])
            hid.append(hidden[lo:hi] if c.all_logits else hidden[lo])
        return out, hid
