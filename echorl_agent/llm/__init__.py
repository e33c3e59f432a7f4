"""The inference engine of echorl: model loading, the KV-aware rollout engine, and OpenAI-compatible serving.

The agents built on it (``ReActAgent``, ``ScoringAgent``, ``ChatReActAgent``, tree-of-thought) live in
:mod:`echorl_agent.agents`; this package never imports the envs or an agent (docs/architecture.md).

Layout (nano-vllm's shape): :mod:`~echorl_agent.llm.engine` (engine, scheduler, prefix cache, runner, scoring,
config, metrics), :mod:`~echorl_agent.llm.quant` (quantized projections beside their C kernel),
:mod:`~echorl_agent.llm.serving` (the OpenAI-compatible server and client backend) and :mod:`~echorl_agent.llm.models`.
The modules that lived flat in this package keep their old import paths (:data:`MOVED_MODULES`).

Heavy dependencies (transformers, fastapi) load lazily on first attribute access.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

_EXPORTS = {
    "WEIGHT_DTYPES": "engine.config",
    "load_model": "models",
    "LoadedModel": "models",
    "DEFAULT_MODEL": "models",
    "LLMEngine": "engine.llm_engine",
    "EngineConfig": "engine.llm_engine",
    "SamplingParams": "engine.llm_engine",
    "GenerationResult": "engine.llm_engine",
    "ScoreResult": "engine.llm_engine",
    "PrefixCache": "engine.prefix_cache",
    "PrefixCacheConfig": "engine.prefix_cache",
    "CacheStats": "engine.prefix_cache",
    "Scheduler": "engine.scheduler",
    "SchedulerConfig": "engine.scheduler",
    "ModelRunner": "engine.runner",
    "BandwidthEfficiencyTracker": "engine.metrics",
    "BandwidthSnapshot": "engine.metrics",
    "speedup_bound": "engine.metrics",
    "OpenAICompatibleBackend": "serving.openai_backend",
}

#: Old flat module name -> its place in a subpackage; ``import echorl_agent.llm.runner`` still works and gives the
#: very same module object as ``echorl_agent.llm.engine.runner``. (``echorl_agent.llm.engine`` and
#: ``echorl_agent.llm.quant`` are now packages that re-export what those modules had.)
MOVED_MODULES = {
    "echorl_agent.llm.config": "echorl_agent.llm.engine.config",
    "echorl_agent.llm.engine_requests": "echorl_agent.llm.engine.engine_requests",
    "echorl_agent.llm.metrics": "echorl_agent.llm.engine.metrics",
    "echorl_agent.llm.prefix_cache": "echorl_agent.llm.engine.prefix_cache",
    "echorl_agent.llm.runner": "echorl_agent.llm.engine.runner",
    "echorl_agent.llm.scheduler": "echorl_agent.llm.engine.scheduler",
    "echorl_agent.llm.scoring": "echorl_agent.llm.engine.scoring",
    "echorl_agent.llm.usage": "echorl_agent.llm.engine.usage",
    "echorl_agent.llm.fused_decode": "echorl_agent.llm.quant.fused_decode",
    "echorl_agent.llm.qkernel": "echorl_agent.llm.quant.qkernel",
    "echorl_agent.llm.openai_backend": "echorl_agent.llm.serving.openai_backend",
    "echorl_agent.llm.serve_args": "echorl_agent.llm.serving.args",
    "echorl_agent.llm.server": "echorl_agent.llm.serving.server",
    "echorl_agent.llm.server_lora": "echorl_agent.llm.serving.lora",
    "echorl_agent.llm.server_protocol": "echorl_agent.llm.serving.protocol",
    "echorl_agent.llm.server_render": "echorl_agent.llm.serving.render",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a name of :data:`MOVED_MODULES` to the module at its new place (registered on import).

    The same finder as ``echorl_envs._MovedModules``, kept here because the engine package never imports the envs.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module: Any) -> None:
        """The module was executed under its new name."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # first: it answers only for the old names

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
