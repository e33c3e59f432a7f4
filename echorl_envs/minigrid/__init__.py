"""MiniGrid/BabyAI text environments on the real ``minigrid`` package (see :class:`MiniGridTextEnv`)."""

from __future__ import annotations

from echorl_envs.minigrid.describe import DIRECTION_NAMES, describe_view, object_phrase, position_phrase
from echorl_envs.minigrid.env import ACTION_WORDS, MiniGridTextEnv
from echorl_envs.minigrid.planner import BabyAIExpert, GoalPlanner, bfs_plan, nav_distances

__all__ = [
    "ACTION_WORDS",
    "DIRECTION_NAMES",
    "BabyAIExpert",
    "GoalPlanner",
    "MiniGridTextEnv",
    "bfs_plan",
    "nav_distances",
    "describe_view",
    "object_phrase",
    "position_phrase",
]
