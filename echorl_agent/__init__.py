"""echorl_agent: the EchoRL plugin for Stable-Baselines3 and LLM agents.

SB3 parts: :class:`EchoPolicy` / :class:`EchoPPO` (latent planning, EchoRL Eq. 1-3), :class:`HotColdReplayBuffer` /
:class:`EchoDQN` (hot/cold prioritized replay, Eq. 6-7). Reuse of LLM priors and experience:
:class:`LLMPriorCache`, :class:`PosteriorSampler`, :class:`ExperienceBank`. The LLM engine lives in
:mod:`echorl_agent.llm` and the evaluation runner in :mod:`echorl_agent.eval` (both imported on demand).
"""

from __future__ import annotations

from echorl_agent.algorithms.echo_dqn import EchoDQN
from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.config import PlanningConfig, ReplayConfig
from echorl_agent.experience import ExperienceBank
from echorl_agent.policies import EchoPolicy
from echorl_agent.priors import LLMPriorCache, PosteriorSampler
from echorl_agent.replay import EMAPlanTracker, HotColdReplayBuffer

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
]
