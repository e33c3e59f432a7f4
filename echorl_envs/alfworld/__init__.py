"""ALFWorld on alfworld's real TextWorld/PDDL engine, with an offline game generator.

Importing this subpackage does not import ``alfworld``/``textworld`` themselves (they load on first use).
"""

from __future__ import annotations

from echorl_envs.alfworld.env import ALFWorldEnv, resolve_task_types
from echorl_envs.alfworld.games import (
    GeneratedPool,
    find_games,
    generate_dataset,
    solve_with_expert,
)
from echorl_envs.alfworld.generator import DIFFICULTIES, GeneratorConfig, make_game_spec, write_game
from echorl_envs.alfworld.scenes import TASK_TYPES

__all__ = [
    "ALFWorldEnv",
    "DIFFICULTIES",
    "GeneratedPool",
    "GeneratorConfig",
    "TASK_TYPES",
    "find_games",
    "generate_dataset",
    "make_game_spec",
    "resolve_task_types",
    "solve_with_expert",
    "write_game",
]
