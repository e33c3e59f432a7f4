"""Where TextWorld games come from: textworld's own challenge generators, compiled once and cached on disk.

Games are generated offline by textworld's challenge generators and compiled to Z-machine files with the Inform 7
compiler textworld ships (the same path as ``tw-make``). Inside this package, ``import textworld`` is the real
library (absolute imports).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_envs.core import build_once

__all__ = ["CHALLENGE_SETTINGS", "GENERATOR_VERSION", "SPLIT_SEED_BASE", "generate_textworld_game",
           "parse_challenge_args"]

#: Difficulty presets: ``tw-make`` arguments per challenge, per difficulty.
CHALLENGE_SETTINGS: dict[str, dict[str, list[str]]] = {
    "tw-simple": {
        "easy": ["--rewards", "dense", "--goal", "detailed"],
        "medium": ["--rewards", "balanced", "--goal", "brief"],
        "hard": ["--rewards", "sparse", "--goal", "none"],
    },
    "tw-coin_collector": {"easy": ["--level", "5"], "medium": ["--level", "15"], "hard": ["--level", "30"]},
    "tw-treasure_hunter": {"easy": ["--level", "1"], "medium": ["--level", "10"], "hard": ["--level", "20"]},
    "tw-cooking": {
        "easy": ["--recipe", "1", "--take", "1", "--go", "1"],
        "medium": ["--recipe", "2", "--take", "1", "--go", "6", "--open", "--cook", "--cut"],
        "hard": ["--recipe", "3", "--take", "2", "--go", "9", "--open", "--cook", "--cut", "--drop"],
    },
}
#: Seeds of generated games never overlap between splits.
SPLIT_SEED_BASE = {"train": 0, "eval": 10_000_000}
#: Bump when the generated games change, so stale cached games are not reused.
GENERATOR_VERSION = 1


def parse_challenge_args(challenge: str, args: Sequence[str], split: str) -> dict[str, Any]:
    """``tw-make`` arguments of ``challenge`` parsed by its own argument parser (raises ``SystemExit`` on bad ones),
    with the generator's train/test split selected for ``split``."""
    import textworld.challenges

    _desc, _make, add_arguments = textworld.challenges.CHALLENGES[challenge]
    parser = argparse.ArgumentParser(prog=challenge)
    add_arguments(parser)
    args = list(args)
    if challenge == "tw-simple" and split == "eval":
        args.append("--test")
    if challenge == "tw-cooking":
        args += ["--split", "train" if split == "train" else "valid"]
    return vars(parser.parse_args(args))


def generate_textworld_game(challenge: str, args: Sequence[str], split: str, seed: int, out_dir: Path) -> Path:
    """Generate one ``challenge`` game with textworld's generator, compile it, and return its ``.z8`` path.

    ``out_dir`` is created atomically (built in a temporary sibling, then renamed), so parallel workers may
    race on the same game safely. Raises whatever textworld raises if generation or compilation fails.
    """
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    def build(tmp: Path) -> None:
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = str(tmp / "game.z8")
        options.file_ext = ".z8"
        options.force_recompile = True
        game = textworld.challenges.CHALLENGES[challenge][1](parse_challenge_args(challenge, args, split), options)
        with warnings.catch_warnings():  # compile_game replays the walkthrough in Jericho
            warnings.filterwarnings("ignore", message=".*not fully supported.*")
            compile_game(game, options)
        (tmp / "game.ni").unlink(missing_ok=True)

    return build_once(out_dir, build, "game.z8")
