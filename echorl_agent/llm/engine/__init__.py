"""The rollout engine in nano-vllm's shape: ``LLMEngine`` joins Scheduler → PrefixCache → ModelRunner.

Modules: :mod:`~echorl_agent.llm.engine.llm_engine` (the engine and its ``step()``),
:mod:`~echorl_agent.llm.engine.engine_requests` (sequence state and request handling),
:mod:`~echorl_agent.llm.engine.scheduler`, :mod:`~echorl_agent.llm.engine.prefix_cache`,
:mod:`~echorl_agent.llm.engine.runner`, :mod:`~echorl_agent.llm.engine.scoring`,
:mod:`~echorl_agent.llm.engine.config`, :mod:`~echorl_agent.llm.engine.metrics` and
:mod:`~echorl_agent.llm.engine.usage`.

``echorl_agent.llm.engine`` was a module (now :mod:`~echorl_agent.llm.engine.llm_engine`); every name it had
still resolves here, loaded on first access: ``from echorl_agent.llm.engine import LLMEngine``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMEngine": "llm_engine",
    "EngineConfig": "config",
    "SamplingParams": "config",
    "GenerationResult": "config",
    "ScoreResult": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"echorl_agent.llm.engine.{_EXPORTS[name]}"), name)
    # any other name the old ``echorl_agent.llm.engine`` module had (e.g. ``load_model``, ``ModelRunner``)
    module = importlib.import_module("echorl_agent.llm.engine.llm_engine")
    if name.startswith("__") or not hasattr(module, name):
        raise AttributeError(f"module 'echorl_agent.llm.engine' has no attribute {name!r}")
    return getattr(module, name)
