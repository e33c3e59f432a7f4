"""Models of the inference engine: loading, and one layout adapter per architecture family.

:mod:`~echorl_agent.llm.models.loading` loads the embedded SmolLM2-135M or any HF causal LM.
:func:`layout_for` gives a model's :class:`ModelLayout` (module names and architecture facts): one file per family
-- :mod:`~echorl_agent.llm.models.llama` (Llama, SmolLM2), :mod:`~echorl_agent.llm.models.qwen2` (q/k/v biases),
:mod:`~echorl_agent.llm.models.mistral` (sliding window noted) -- through which the engine runner, the calibration,
the quantized linears, the fused decode and the learner's forward reach the model's modules.
"""

from __future__ import annotations

from echorl_agent.llm.models.base import PROJECTIONS, ModelLayout, ModuleNames
from echorl_agent.llm.models.loading import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    LoadedModel,
    cache_dir,
    embedded_gguf,
    load_model,
)
from echorl_agent.llm.models.registry import LAYOUTS, SUPPORTED_MODEL_TYPES, layout_for

__all__ = ["LoadedModel", "load_model", "cache_dir", "embedded_gguf", "DEFAULT_MODEL", "EMBEDDED_MODELS",
           "ModelLayout", "ModuleNames", "PROJECTIONS", "LAYOUTS", "SUPPORTED_MODEL_TYPES", "layout_for"]
