"""LLM side of echorl: model loading, the KV-aware rollout engine, agents, and OpenAI-compatible serving.

Heavy dependencies (transformers, fastapi) load lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_model": "models",
    "LoadedModel": "models",
    "DEFAULT_MODEL": "models",
    "LLMEngine": "engine",
    "EngineConfig": "engine",
    "SamplingParams": "engine",
    "GenerationResult": "engine",
    "ScoreResult": "engine",
    "PrefixCache": "prefix_cache",
    "PrefixCacheConfig": "prefix_cache",
    "CacheStats": "prefix_cache",
    "Scheduler": "scheduler",
    "SchedulerConfig": "scheduler",
    "ModelRunner": "runner",
    "ReActAgent": "agents",
    "ScoringAgent": "agents",
    "ChatReActAgent": "agents",
    "BandwidthEfficiencyTracker": "metrics",
    "BandwidthSnapshot": "metrics",
    "speedup_bound": "metrics",
    "OpenAICompatibleBackend": "openai_backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        mod = importlib.import_module(f"echorl_agent.llm.{_EXPORTS[name]}")
        return getattr(mod, name)
    raise AttributeError(f"module 'echorl_agent.llm' has no attribute {name!r}")
