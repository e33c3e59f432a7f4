"""Qwen2 (Qwen2 / Qwen2.5): Llama's module tree, with biases on the query, key and value projections.

``Qwen2Attention`` builds ``q_proj``, ``k_proj`` and ``v_proj`` with ``bias=True`` (``o_proj`` and the MLP have
none), whatever the config says; the engine's float32, quantized, W8A8 and fused paths all add those biases.
Sliding-window attention is used only when the config sets ``use_sliding_window`` (off in the released Qwen2/2.5
checkpoints); then :attr:`~echorl_agent.llm.models.base.ModelLayout.sliding_window` says so.
"""

from __future__ import annotations

from typing import Any

from echorl_agent.llm.models import llama
from echorl_agent.llm.models.base import ModelLayout, layout_from_config

__all__ = ["MODEL_TYPES", "NAMES", "layout"]

MODEL_TYPES = ("qwen2",)

NAMES = llama.NAMES
"""``Qwen2ForCausalLM`` keeps its modules where Llama does (``modeling_qwen2.py`` is generated from Llama's)."""

BIAS_PROJECTIONS = ("q", "k", "v")
"""The projections ``Qwen2Attention`` always gives a bias."""


def layout(config: Any) -> ModelLayout:
    """The layout of a Qwen2 config."""
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", False) else None
    if window and "sliding_attention" not in (getattr(config, "layer_types", None) or ["sliding_attention"]):
        window = None  # transformers 5: the window applies to the layers marked sliding_attention only
    return layout_from_config(config, NAMES, BIAS_PROJECTIONS, sliding_window=window)
