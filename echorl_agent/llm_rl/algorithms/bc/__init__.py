"""Behaviour cloning on the env's expert: method ``bc`` and the warm-start stage of ``bc+ppo``, ``echoppo``,
``bc+gigpo`` and ``echorl`` (``bc_warm_start``)."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.bc.clone import ExpertData, behaviour_clone, collect_expert_states

__all__ = ["ExpertData", "behaviour_clone", "collect_expert_states"]
