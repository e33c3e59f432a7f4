"""echorl_agent: the EchoRL plugin for Stable-Baselines3 and LLM agents.

Public names are re-exported here as their modules land (EchoPolicy, EchoPPO, HotColdReplayBuffer, ...).
"""

from __future__ import annotations

__all__: list[str] = []
