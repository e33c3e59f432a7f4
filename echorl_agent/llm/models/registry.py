"""Which layout describes a model: one table from ``config.model_type`` to its family's file."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from echorl_agent.llm.models import llama, mistral, qwen2
from echorl_agent.llm.models.base import ModelLayout

__all__ = ["LAYOUTS", "SUPPORTED_MODEL_TYPES", "layout_for"]

LAYOUTS: dict[str, Callable[[Any], ModelLayout]] = {
    model_type: family.layout for family in (llama, qwen2, mistral) for model_type in family.MODEL_TYPES
}
"""``config.model_type`` -> the function building that family's :class:`ModelLayout` from a config. A new family is
one file in this package (its ``MODEL_TYPES``, ``NAMES`` and ``layout``) and one entry in the tuple above."""

SUPPORTED_MODEL_TYPES = tuple(LAYOUTS)
"""The model types the engine and the learner's forward run (``"llama"`` covers SmolLM2)."""


def layout_for(config_or_model: Any) -> ModelLayout:
    """The :class:`ModelLayout` of an HF config, an HF ``*ForCausalLM`` or a peft model wrapping one.

    Raises:
        ValueError: the ``model_type`` is not one of :data:`SUPPORTED_MODEL_TYPES` (the message names both).
    """
    config = getattr(config_or_model, "config", config_or_model)
    model_type = getattr(config, "model_type", None)
    if model_type not in LAYOUTS:
        close = difflib.get_close_matches(str(model_type), SUPPORTED_MODEL_TYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"no model layout for model_type={model_type!r}; supported model types are "
                         f"{SUPPORTED_MODEL_TYPES}{hint} (add a family file under echorl_agent/llm/models/, or serve "
                         "other models with vLLM/SGLang and use OpenAICompatibleBackend)")
    return LAYOUTS[model_type](config)
