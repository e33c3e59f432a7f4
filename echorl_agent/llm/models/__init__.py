"""Models of the inference engine: loading (the embedded SmolLM2 or any HF causal LM)."""

from __future__ import annotations

from echorl_agent.llm.models.loading import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    LoadedModel,
    cache_dir,
    embedded_gguf,
    load_model,
)

__all__ = ["LoadedModel", "load_model", "cache_dir", "embedded_gguf", "DEFAULT_MODEL", "EMBEDDED_MODELS"]
