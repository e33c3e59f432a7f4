"""TextWorld challenge games (tw-simple, tw-coin_collector, tw-treasure_hunter, tw-cooking) on the real engine.

Games are generated offline by textworld's own challenge generators and compiled to Z-machine files with the
Inform 7 compiler textworld ships (the same path as ``tw-make``), cached on disk, and played through
``textworld.start`` (Jericho + textworld's Inform 7 wrapper), which also reports admissible commands, the
score and the current winning policy. Inside this package, ``import textworld`` is the real library
(absolute imports); this package is ``echorl_envs.textworld``.

Modules: :mod:`~echorl_envs.textworld.env` (the env), :mod:`~echorl_envs.textworld.games` (generation and the
difficulty presets), :mod:`~echorl_envs.textworld.engine` (textworld's engine on one game). Importing this package
does not import ``textworld`` itself (it loads on first use). ``echorl_envs.textworld`` was one module; every
public name it had is exported here.
"""

from __future__ import annotations

from echorl_envs.textworld.env import TextWorldEnv
from echorl_envs.textworld.games import CHALLENGE_SETTINGS, generate_textworld_game

__all__ = ["TextWorldEnv", "CHALLENGE_SETTINGS", "generate_textworld_game"]
