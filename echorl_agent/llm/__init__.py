"""The inference engine of echorl: model loading, the KV-aware rollout engine, and OpenAI-compatible serving.

The agents built on it (``ReActAgent``, ``ScoringAgent``, ``ChatReActAgent``, tree-of-thought) live in
:mod:`echorl_agent.agents`; this package never imports the envs or an agent (docs/architecture.md).

Heavy dependencies (transformers, fastapi) load lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WEIGHT_DTYPES": "config",
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
    "BandwidthEfficiencyTracker": "metrics",
    "BandwidthSnapshot": "metrics",
    "speedup_bound": "metrics",
    "OpenAICompatibleBackend": "openai_backend",
}

#: the agents that lived here until the engine stopped importing the envs (a clear error names the new home)
_MOVED_TO_AGENTS = ("ReActAgent", "ScoringAgent", "ChatReActAgent", "AgentStep", "parse_react")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        mod = importlib.import_module(f"echorl_agent.llm.{_EXPORTS[name]}")
        return getattr(mod, name)
    if name in _MOVED_TO_AGENTS:
        # ImportError (not AttributeError) so that `from echorl_agent.llm import X` shows this message
        raise ImportError(f"{name} moved out of the engine package: from echorl_agent.agents import {name}")
    raise AttributeError(f"module 'echorl_agent.llm' has no attribute {name!r}")
