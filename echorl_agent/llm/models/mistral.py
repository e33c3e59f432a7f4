"""Mistral: Llama's module tree without biases, and sliding-window attention when the config sets a window.

Mistral 7B v0.1 attends only to the last ``sliding_window`` (4096) tokens; v0.2 and later set ``sliding_window``
to null (full attention). The layout reports the window
(:attr:`~echorl_agent.llm.models.base.ModelLayout.sliding_window`); the paged-KV engine attends to the whole
context, so it refuses a model with a window rather than compute something else than the model does.
"""

from __future__ import annotations

from typing import Any

from echorl_agent.llm.models import llama
from echorl_agent.llm.models.base import ModelLayout, layout_from_config

__all__ = ["MODEL_TYPES", "NAMES", "layout"]

MODEL_TYPES = ("mistral",)

NAMES = llama.NAMES
"""``MistralForCausalLM`` keeps its modules where Llama does (``modeling_mistral.py`` is generated from Llama's)."""


def layout(config: Any) -> ModelLayout:
    """The layout of a Mistral config (no biases)."""
    return layout_from_config(config, NAMES, (), sliding_window=getattr(config, "sliding_window", None))
