"""echorl_agent: the EchoRL plugin for Stable-Baselines3 and LLM agents.

Public names are re-exported here as their modules land (EchoPolicy, EchoPPO, HotColdReplayBuffer, ...).
"""

from __future__ import annotations

from echorl_agent.algorithms.echo_dqn import EchoDQN
from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.config import PlanningConfig, ReplayConfig
from echorl_agent.experience import ExperienceBank
from echorl_agent.policies import EchoPolicy
from echorl_agent.priors import LLMPriorCache, PosteriorSampler
from echorl_agent.replay import EMAPlanTracker, HotColdReplayBuffer

__all__: list[str] = []
__all__ += ["EchoPPO", "EchoPolicy", "PlanningConfig"]
__all__ += ["HotColdReplayBuffer", "EMAPlanTracker", "EchoDQN", "ReplayConfig"]
__all__ += ["LLMPriorCache", "PosteriorSampler", "ExperienceBank"]
