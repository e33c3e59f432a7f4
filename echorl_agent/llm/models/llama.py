"""Llama (and SmolLM2, which is a Llama): ``transformers.LlamaForCausalLM``'s module tree.

Pre-norm decoder layers (RMSNorm -> grouped-query attention with RoPE -> residual; RMSNorm -> gated SiLU MLP ->
residual), a final RMSNorm and an LM head that may share the embedding (SmolLM2 ties them). Biases only where the
config asks: ``attention_bias`` on q/k/v/o, ``mlp_bias`` on gate/up/down (both off in Llama 2/3 and SmolLM2).
"""

from __future__ import annotations

from typing import Any

from echorl_agent.llm.models.base import (
    ATTENTION_PROJECTIONS,
    MLP_PROJECTIONS,
    ModelLayout,
    ModuleNames,
    layout_from_config,
)

__all__ = ["MODEL_TYPES", "NAMES", "layout"]

MODEL_TYPES = ("llama",)
"""``config.model_type`` values this file describes."""

NAMES = ModuleNames(
    layers="model.layers",
    embedding="model.embed_tokens",
    final_norm="model.norm",
    rotary="model.rotary_emb",
    lm_head="lm_head",
    attention="self_attn",
    mlp="mlp",
    input_norm="input_layernorm",
    post_attention_norm="post_attention_layernorm",
    q="q_proj",
    k="k_proj",
    v="v_proj",
    o="o_proj",
    gate="gate_proj",
    up="up_proj",
    down="down_proj",
    activation="act_fn",
    norm_eps="variance_epsilon",
    rope_function="apply_rotary_pos_emb",
)
"""Where ``LlamaForCausalLM`` keeps its modules (``modeling_llama.py``)."""


def layout(config: Any) -> ModelLayout:
    """The layout of a Llama config (no sliding window)."""
    biases = (ATTENTION_PROJECTIONS if getattr(config, "attention_bias", False) else ()) + (
        MLP_PROJECTIONS if getattr(config, "mlp_bias", False) else ())
    return layout_from_config(config, NAMES, biases, sliding_window=None)
