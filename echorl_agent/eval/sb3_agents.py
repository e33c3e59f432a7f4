"""Moved to :mod:`echorl_agent.agents.sb3`; this name stays for ``eval/llm_rl_agents.py`` until it moves there too."""

from __future__ import annotations

from echorl_agent.agents.sb3 import SB3Agent, _Mirror, make_dqn, make_echoppo, make_maskable_ppo, make_ppo  # noqa: F401

__all__ = ["SB3Agent", "make_ppo", "make_maskable_ppo", "make_dqn", "make_echoppo"]
