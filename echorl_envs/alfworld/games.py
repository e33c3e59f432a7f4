"""Where ALFWorld games come from: the on-disk cache of generated games, and downloaded ALFWorld data.

* :class:`GeneratedPool` maps a game index to a generated game, writing and expert-checking it on first use
  and reusing it afterwards (cache under :func:`cache_root`, keyed by generator version and difficulty
  knobs). A game the expert cannot win is kept on disk marked ``solvable: false`` (so it is never retried),
  skipped with a warning, and the index moves on to the next candidate seed.
* :func:`find_games` discovers ``game.tw-pddl`` files in the json_2.1.1 layout exactly as alfworld's
  ``AlfredTWEnv.collect_game_files`` does (skips movable/sliced trajectories, other task types, games without
  a ``solvable: true`` verdict).
* :func:`generate_dataset` writes a small json_2.1.1 tree with the generator (used by the tests of the loader).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from echorl_envs.alfworld.generator import GeneratorConfig, make_game_spec, mark_solvable, write_game
from echorl_envs.alfworld.scenes import TASK_TYPES
from echorl_envs.core import build_once, cache_root

__all__ = [
    "GENERATOR_VERSION",
    "HELD_OUT_TEMPLATE_SPLITS",
    "JSON_SPLITS",
    "SPLITS",
    "SPLIT_SEED_BASE",
    "GeneratedPool",
    "find_games",
    "generate_dataset",
    "solve_with_expert",
]

#: Bump when the generator's output changes, so stale cached games are not reused.
GENERATOR_VERSION = 1
#: The json_2.1.1 splits, and the generated split whose rooms come from held-out templates
#: (:data:`HELD_OUT_TEMPLATE_SPLITS`); ``eval`` is accepted as an alias of ``valid_seen`` (alfworld's
#: eval_in_distribution).
JSON_SPLITS = ("train", "valid_seen", "valid_unseen")
SPLITS = (*JSON_SPLITS, "valid_unseen_templates")
#: Seeds of generated games never overlap between splits.
SPLIT_SEED_BASE = {"train": 0, "valid_seen": 10_000_000, "valid_unseen": 20_000_000,
                   "valid_unseen_templates": 30_000_000}
#: Generated splits whose rooms come from templates no other split uses
#: (:data:`~echorl_envs.alfworld.scenes.HELD_OUT_ROOMS_FOR_TASK`). The json_2.1.1 splits differ by generator seed
#: only: their games share the four room templates (docs/results/envs.md measures the overlap).
HELD_OUT_TEMPLATE_SPLITS = frozenset({"valid_unseen_templates"})
#: Candidate seeds tried for one index before giving up.
MAX_ATTEMPTS = 8


def normalize_split(split: str) -> str:
    if split == "eval":
        return "valid_seen"
    if split not in SPLITS:
        import difflib

        hint = difflib.get_close_matches(split, [*SPLITS, "eval"], n=1)
        raise ValueError(
            f"split must be one of {[*SPLITS, 'eval']}, got split={split!r}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
        )
    return split


def solve_with_expert(game_path: Path, max_steps: int = 120) -> list[str] | None:
    """Play alfworld's handcoded expert on ``game_path``; its winning command list, or ``None``.

    This is the solvability check ``alfworld-generate`` runs (without its random perturbations).
    """
    from echorl_envs.alfworld.engine import AlfredEngine

    eng = AlfredEngine(expert=True)
    try:
        eng.load(game_path)
        st = eng.reset()
        if st["won"]:
            return None  # won at step 0: not a task
        walk: list[str] = []
        while not st["won"] and len(walk) < max_steps:
            action = st["expert_action"]
            walk.append(action)
            st = eng.step(action)
        return walk if st["won"] else None
    finally:
        eng.close()


def _config_key(cfg: GeneratorConfig) -> str:
    blob = json.dumps(asdict(cfg), sort_keys=True)
    return f"gen-v{GENERATOR_VERSION}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


class GeneratedPool:
    """``num_games`` generated games of ``task_types`` for one split, created lazily and cached on disk.

    Index ``i`` plays task type ``task_types[i % len(task_types)]`` with the ``i // len(task_types)``-th seed
    of the split, so ``EchoRL/ALFWorld-v0``'s games are shared with the per-type ids.
    """

    def __init__(
        self,
        task_types: Sequence[str],
        split: str,
        num_games: int,
        config: GeneratorConfig,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if num_games < 1:
            raise ValueError(f"num_games must be >= 1, got num_games={num_games}")
        self.task_types = list(task_types)
        self.split = normalize_split(split)
        self.num_games = num_games
        self.config = config
        self.root = cache_root(cache_dir) / "alfworld" / _config_key(config) / "json_2.1.1" / self.split
        self._paths: dict[int, Path] = {}

    def __len__(self) -> int:
        return self.num_games

    def path(self, index: int) -> Path:
        """The ``game.tw-pddl`` of game ``index`` (generated and expert-checked on first use)."""
        if index in self._paths:
            return self._paths[index]
        task_type = self.task_types[index % len(self.task_types)]
        k = index // len(self.task_types)
        for attempt in range(MAX_ATTEMPTS):
            seed = SPLIT_SEED_BASE[self.split] + k + attempt * 1_000_000
            game = self._ensure(task_type, seed)
            data = json.loads(game.read_text())
            if data.get("solvable"):
                self._paths[index] = game
                return game
            warnings.warn(
                f"skipping generated ALFWorld game {game.parent} (alfworld's expert cannot win it); "
                "trying the next seed",
                RuntimeWarning,
                stacklevel=2,
            )
        raise RuntimeError(f"no solvable {task_type} game among {MAX_ATTEMPTS} seeds for index {index}")

    def _ensure(self, task_type: str, seed: int) -> Path:
        spec = make_game_spec(task_type, seed, self.config, self.split in HELD_OUT_TEMPLATE_SPLITS)
        final = self.root / spec.dir_name / f"trial_echorl_{seed:08d}"

        def build(tmp: Path) -> None:
            write_game(spec, tmp, seed)
            mark_solvable(tmp / "game.tw-pddl", solve_with_expert(tmp / "game.tw-pddl"))

        return build_once(final, build, "game.tw-pddl")


def find_games(data_path: str | os.PathLike, split: str, task_types: Sequence[str]) -> list[Path]:
    """Solvable ``game.tw-pddl`` files of ``task_types`` under ``data_path`` (alfworld's discovery rules).

    ``data_path`` may be the ALFWorld data root (containing ``json_2.1.1``), the json_2.1.1 folder, or a split
    folder; environment variables are expanded as alfworld's config loader does (``$ALFWORLD_DATA``).
    """
    root = Path(os.path.expandvars(str(data_path))).expanduser()
    split = normalize_split(split)
    if split in HELD_OUT_TEMPLATE_SPLITS:
        raise ValueError(f"split={split!r} exists only for generated games (its rooms come from held-out generator "
                         "templates); ALFWorld's own data holds out scenes in split='valid_unseen'")
    for cand in (root / "json_2.1.1" / split, root / split):
        if cand.is_dir():
            root = cand
            break
    wanted = set(task_types)
    games: list[Path] = []
    for traj_path in sorted(root.rglob("traj_data.json")):
        d = traj_path.parent
        if "movable" in str(d) or "Sliced" in str(d):
            continue
        game = d / "game.tw-pddl"
        if not game.exists():
            continue
        try:
            traj = json.loads(traj_path.read_text())
            data = json.loads(game.read_text())
        except (OSError, json.JSONDecodeError) as e:
            warnings.warn(f"skipping unreadable ALFWorld game {d}: {e}", RuntimeWarning, stacklevel=2)
            continue
        if traj.get("task_type") not in wanted or not data.get("solvable"):
            continue
        games.append(game)
    return games


def generate_dataset(
    root: str | os.PathLike,
    games_per_type: int,
    splits: Sequence[str] = JSON_SPLITS,
    task_types: Sequence[str] = tuple(TASK_TYPES.values()),
    config: GeneratorConfig | None = None,
) -> list[Path]:
    """Write a json_2.1.1 tree (``root/json_2.1.1/<split>/...``) of expert-checked generated games."""
    config = config or GeneratorConfig()
    out: list[Path] = []
    for split in splits:
        pool = GeneratedPool(task_types, split, games_per_type * len(task_types), config, cache_dir=None)
        pool.root = Path(root) / "json_2.1.1" / normalize_split(split)
        out += [pool.path(i) for i in range(len(pool))]
    return out
