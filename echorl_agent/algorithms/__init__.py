"""SB3 algorithms of the EchoRL plugin."""

from __future__ import annotations

from echorl_agent.algorithms.echo_dqn import EchoDQN
from echorl_agent.algorithms.echo_ppo import EchoPPO

__all__ = ["EchoDQN", "EchoPPO"]
