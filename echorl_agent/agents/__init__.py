"""Every agent of echorl, on the one protocol of :class:`Agent` (:mod:`~echorl_agent.agents.base`).

* :mod:`~echorl_agent.agents.basic` -- ``random`` and ``expert`` (the env's oracle: an upper bound).
* :mod:`~echorl_agent.agents.chat` -- frozen LLM agents on the engine: :class:`ReActAgent` (thought + action),
  :class:`ScoringAgent` (pi(a|s) from the log-likelihood of each admissible action), :class:`ChatReActAgent` (any
  OpenAI-compatible endpoint).
* :mod:`~echorl_agent.agents.tot` -- tree-of-thought search (Game24 BFS, propose-and-vote) and
  :mod:`~echorl_agent.agents.llm` -- the runner's ``react`` / ``llm-score`` / ``tot`` factories and the shared engine.
* :mod:`~echorl_agent.agents.remote` -- :class:`RemoteEngine`: those agents on any OpenAI-compatible endpoint
  (``base_url`` + ``model`` agent options).
* :mod:`~echorl_agent.agents.echorl` -- the ``echorl`` agent: LLM + latent plan (EchoRL Eq. 6-7) + experience.
* :mod:`~echorl_agent.agents.cached_scoring` -- :class:`ScoringAgent` with the LLM prior cache in front of it;
  :mod:`~echorl_agent.agents.prior_cache` -- :class:`PriorCacheAgent`, sampling from the LLM action prior (cached or not).
* :mod:`~echorl_agent.agents.experience` -- :class:`ExperienceGuidedAgent`, a frozen agent with a retrieved step of the
  experience bank in its prompt.
* :mod:`~echorl_agent.agents.sb3` -- SB3-trained agents (PPO, MaskablePPO, DQN, EchoPPO) acting in the runner's env.
* :mod:`~echorl_agent.agents.llm_rl` -- the trained-LLM agents (``llm-frozen`` and one ``llm-<method>`` per method of
  the LLM-RL registry: :class:`LLMChoiceAgent`, :class:`LLMGRPOAgent`).

The agent registry (short names, availability, factories) is :mod:`echorl_agent.eval.agents`. Names load lazily,
so importing this package does not load torch or the model.
"""

from __future__ import annotations

import importlib
from typing import Any

from echorl_agent.agents.base import Agent

_EXPORTS = {
    "RandomAgent": "basic",
    "ExpertAgent": "basic",
    "ReActAgent": "chat",
    "ScoringAgent": "chat",
    "ChatReActAgent": "chat",
    "AgentStep": "chat",
    "parse_react": "chat",
    "FREE_TEXT_SYSTEM": "chat",
    "CachedScoringAgent": "cached_scoring",
    "PriorCacheAgent": "prior_cache",
    "ExperienceGuidedAgent": "experience",
    "EchoRLConfig": "echorl",
    "EchoRLLLMAgent": "echorl",
    "ToTAgent": "llm",
    "shared_engine": "llm",
    "RemoteEngine": "remote",
    "ToTConfig": "tot",
    "SB3Agent": "sb3",
    "LLMChoiceAgent": "llm_rl",
    "LLMGRPOAgent": "llm_rl",
}

__all__ = ["Agent", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"echorl_agent.agents.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'echorl_agent.agents' has no attribute {name!r}")
