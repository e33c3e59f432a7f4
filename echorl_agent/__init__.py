"""echorl_agent: the EchoRL plugin for Stable-Baselines3 and LLM agents.

Public names are re-exported here as their modules land (EchoPolicy, EchoPPO, HotColdReplayBuffer, ...).
"""

from __future__ import annotations

from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.config import PlanningConfig
from echorl_agent.policies import EchoPolicy

__all__: list[str] = []
__all__ += ["EchoPPO", "EchoPolicy", "PlanningConfig"]
