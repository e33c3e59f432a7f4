"""The inference engine of echorl: model loading, the KV-aware rollout engine, and OpenAI-compatible serving.

The agents built on it (``ReActAgent``, ``ScoringAgent``, ``ChatReActAgent``, tree-of-thought) live in
:mod:`echorl_agent.agents`; this package never imports the envs or an agent (docs/architecture.md).

Layout (nano-vllm's shape): :mod:`~echorl_agent.llm.engine` (engine, scheduler, prefix cache, runner, scoring,
config, metrics), :mod:`~echorl_agent.llm.quant` (quantized projections beside their C kernel),
:mod:`~echorl_agent.llm.serving` (the OpenAI-compatible server and client backend) and :mod:`~echorl_agent.llm.models`.
The public names of all of them are exported here, and only here (the subpackages export nothing of their own).

Heavy dependencies (transformers, fastapi) load lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_model": "models.loading",
    "LoadedModel": "models.loading",
    "DEFAULT_MODEL": "models.loading",
    "ModelLayout": "models.base",
    "layout_for": "models.registry",
    "SUPPORTED_MODEL_TYPES": "models.registry",
    "LLMEngine": "engine.llm_engine",
    "WEIGHT_DTYPES": "engine.config",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.config",
    "GenerationResult": "engine.config",
    "ScoreResult": "engine.config",
    "PrefixCache": "engine.prefix_cache",
    "PrefixCacheConfig": "engine.prefix_cache",
    "CacheStats": "engine.prefix_cache",
    "Scheduler": "engine.scheduler",
    "SchedulerConfig": "engine.scheduler",
    "ModelRunner": "engine.runner",
    "BandwidthEfficiencyTracker": "engine.metrics",
    "BandwidthSnapshot": "engine.metrics",
    "speedup_bound": "engine.metrics",
    "QuantizedLinear": "quant.linear",
    "quantize_model_linears": "quant.linear",
    "check_weight_dtype": "engine.config",
    "OpenAICompatibleBackend": "serving.openai_backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        mod = importlib.import_module(f"echorl_agent.llm.{_EXPORTS[name]}")
        return getattr(mod, name)
    raise AttributeError(f"module 'echorl_agent.llm' has no attribute {name!r}")
