"""echorl_agent: the EchoRL plugin for Stable-Baselines3 and LLM agents.

The LLM learning by RL: :class:`LLMPolicy` (the LM as actor-critic over admissible actions, with LoRA and a latent
plan; ``LLMPPO("LLMPolicy", env)`` trains it, see :mod:`echorl_agent.llm_rl`). SB3 parts: :class:`EchoPolicy` /
:class:`EchoPPO` (latent planning, EchoRL Eq. 1-3), :class:`HotColdReplayBuffer` /
:class:`EchoDQN` (hot/cold prioritized replay, Eq. 6-7). Reuse of LLM priors and experience:
:class:`LLMPriorCache`, :class:`PosteriorSampler`, :class:`ExperienceBank`. The LLM engine lives in
:mod:`echorl_agent.llm` and the evaluation runner in :mod:`echorl_agent.eval` (both imported on demand).
"""

from __future__ import annotations

import importlib
from typing import Any

from echorl_agent.algorithms.echo_dqn import EchoDQN
from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.config import PlanningConfig, ReplayConfig
from echorl_agent.experience import ExperienceBank
from echorl_agent.policies import EchoPolicy
from echorl_agent.priors import LLMPriorCache, PosteriorSampler
from echorl_agent.replay import EMAPlanTracker, HotColdReplayBuffer

#: Names that load on first use (the LLM policy pulls in the engine): ``from echorl_agent import LLMPolicy``.
_EXPORTS = {"LLMPolicy": "llm_rl", "LLMPPO": "llm_rl"}

__all__ = [
    "EMAPlanTracker",
    "EchoDQN",
    "EchoPPO",
    "EchoPolicy",
    "ExperienceBank",
    "HotColdReplayBuffer",
    "LLMPriorCache",
    "PlanningConfig",
    "PosteriorSampler",
    "ReplayConfig",
    *sorted(_EXPORTS),
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"echorl_agent.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'echorl_agent' has no attribute {name!r}")
