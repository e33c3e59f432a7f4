"""TextWorld challenge games (tw-simple, tw-coin_collector, tw-treasure_hunter, tw-cooking) on the real engine.

Games are generated offline by textworld's own challenge generators and compiled to Z-machine files with the
Inform 7 compiler textworld ships (the same path as ``tw-make``), cached on disk, and played through
``textworld.start`` (Jericho + textworld's Inform 7 wrapper), which also reports admissible commands, the
score and the current winning policy. Inside this package, ``import textworld`` is the real library
(absolute imports); this module is ``echorl_envs.textworld``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from echorl_envs.alfworld.games import cache_root
from echorl_envs.core import EngineHostedEnv, Transition

__all__ = ["TextWorldEnv", "CHALLENGE_SETTINGS", "generate_textworld_game"]

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
#: Generic instruction when a game states no objective (e.g. tw-simple with ``--goal none``).
_DEFAULT_TASK = {
    "tw-simple": "Explore the house and find out what earns points.",
    "tw-coin_collector": "Find the coin and take it.",
    "tw-treasure_hunter": "Find the treasure named in the intro and take it.",
    "tw-cooking": "Cook the recipe in the cookbook and eat the meal.",
}
_SPLIT_SEED_BASE = {"train": 0, "eval": 10_000_000}
_GEN_VERSION = 1


def _settings(challenge: str, args: Sequence[str], split: str) -> dict[str, Any]:
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

    game_file = out_dir / "game.z8"
    if game_file.exists():
        return game_file
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out_dir.parent))
    try:
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = str(tmp / "game.z8")
        options.file_ext = ".z8"
        options.force_recompile = True
        game = textworld.challenges.CHALLENGES[challenge][1](_settings(challenge, args, split), options)
        with warnings.catch_warnings():  # compile_game replays the walkthrough in Jericho (see _reset_episode)
            warnings.filterwarnings("ignore", message=".*not fully supported.*")
            compile_game(game, options)
        (tmp / "game.ni").unlink(missing_ok=True)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not game_file.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return game_file


_STATE_KEYS = ("feedback", "score", "max_score", "won", "lost", "admissible_commands", "policy_commands", "objective")


class _TextWorldEngine:
    """``textworld.start`` on one compiled game, its states exported as plain dicts (they cross a process pipe)."""

    def __init__(self) -> None:
        self.env: Any = None

    def start(self, path: Path) -> None:
        import textworld

        self.close()
        infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True,
                                   score=True, max_score=True, objective=True)
        with warnings.catch_warnings():
            # Jericho flags every TextWorld-compiled game as "not fully supported" (it lacks a per-game
            # score table); textworld's own wrapper tracks score and state, so the warning is noise.
            warnings.filterwarnings("ignore", message=".*not fully supported.*")
            self.env = textworld.start(str(path), request_infos=infos)

    @staticmethod
    def _export(state: Any) -> dict[str, Any]:
        out = {k: state[k] for k in _STATE_KEYS}
        for k in ("admissible_commands", "policy_commands"):
            out[k] = list(out[k]) if out[k] is not None else None
        return out

    def reset(self) -> dict[str, Any]:
        return self._export(self.env.reset())

    def step(self, action: str) -> dict[str, Any]:
        state, _score, _done = self.env.step(action)
        return self._export(state)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
        self.env = None


class TextWorldEnv(EngineHostedEnv):
    """A TextWorld challenge (Cote et al., 2018) generated offline and played on textworld's engine.

    Description:
        Parser-based text adventures from textworld's four built-in challenges: ``tw-simple`` (a house with a
        fixed quest), ``tw-coin_collector`` (find the coin; levels grow the map), ``tw-treasure_hunter``
        (find a named object among distractors, behind doors) and ``tw-cooking`` (the First TextWorld
        Problems cooking games: read the cookbook, gather, cut, cook, eat). Games are generated by seed
        (``split`` picks disjoint seed ranges; tw-simple/tw-cooking also use their generators' own
        train/test splits), compiled once with textworld's Inform 7 compiler and cached on disk.

    Observation:
        The game's text (intro on reset, then the response to each command).

    Actions:
        One of ``info["admissible_actions"]`` (textworld's admissible commands); case, spacing and trailing
        punctuation are forgiven, anything else is invalid (feedback, reward 0).

    Rewards:
        The change of the game's score (textworld's intermediate quest points; 1 per point).

    Termination:
        ``terminated`` when the game is won or lost; registered ids truncate after 100 steps.

    Info:
        ``task``, ``admissible_actions``, ``won``, ``invalid_action``, ``step``, ``task_id``, ``score``,
        ``max_score``, ``lost`` and ``expert_action`` (the first command of textworld's current winning policy,
        which is the walkthrough from the start state and is re-planned after a detour). A step whose engine
        call exceeds ``step_timeout`` ends the episode truncated with ``info["error"]`` (the game is restarted
        in a fresh engine at the next reset).

    Registered ids:
        ``EchoRL/TextWorld-Simple-v0``, ``EchoRL/TextWorld-CoinCollector-v0``,
        ``EchoRL/TextWorld-TreasureHunter-v0``, ``EchoRL/TextWorld-Cooking-v0``.

    Args:
        challenge: one of :data:`CHALLENGE_SETTINGS`.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"`` preset of ``tw-make`` arguments.
        challenge_args: explicit ``tw-make`` arguments (override ``difficulty``), e.g. ``["--level", "50"]``.
        split: ``"train"`` or ``"eval"``.
        num_games: size of the pool (games are generated on first use).
        cache_dir: where compiled games are cached (default ``$ECHORL_CACHE_DIR`` or the user cache dir).
        step_timeout: seconds one engine step may take before it is abandoned (:class:`~echorl_envs.core.
            EngineHost`: after that the engine runs in a child process that is killed on a timeout); None calls
            the engine directly, without a timeout.
        reset_timeout: the same for a reset, which may load and compile a new game (used unless
            ``step_timeout`` is None).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    load_method = "start"

    def __init__(
        self,
        challenge: str = "tw-simple",
        difficulty: str = "easy",
        challenge_args: Sequence[str] | None = None,
        split: str = "train",
        num_games: int = 16,
        cache_dir: str | os.PathLike | None = None,
        render_mode: str | None = None,
        step_timeout: float | None = 30.0,
        reset_timeout: float = 300.0,
    ) -> None:
        super().__init__(render_mode=render_mode)
        self._ctor = dict(challenge=challenge, difficulty=difficulty, challenge_args=challenge_args, split=split,
                          num_games=num_games, cache_dir=cache_dir, render_mode=render_mode,
                          step_timeout=step_timeout, reset_timeout=reset_timeout)
        self._start_host(_TextWorldEngine, step_timeout, reset_timeout, "echorl-textworld-engine")
        if challenge not in CHALLENGE_SETTINGS:
            hint = difflib.get_close_matches(challenge, CHALLENGE_SETTINGS, n=1)
            raise ValueError(f"challenge must be one of {sorted(CHALLENGE_SETTINGS)}, got challenge={challenge!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if challenge_args is None and difficulty not in CHALLENGE_SETTINGS[challenge]:
            raise ValueError(f"difficulty must be one of ['easy', 'medium', 'hard'], got difficulty={difficulty!r}")
        if split not in _SPLIT_SEED_BASE:
            raise ValueError(f"split must be 'train' or 'eval', got split={split!r}")
        if num_games < 1:
            raise ValueError(f"num_games must be >= 1, got num_games={num_games}")
        self.challenge = challenge
        self.challenge_args = list(challenge_args) if challenge_args is not None else \
            CHALLENGE_SETTINGS[challenge][difficulty]
        _settings(challenge, self.challenge_args, split)  # validate the arguments now, not at first reset
        self.split = split
        self.num_games = num_games
        key = hashlib.sha1(json.dumps([_GEN_VERSION, self.challenge_args]).encode()).hexdigest()[:10]
        self.root = cache_root(cache_dir) / "textworld" / challenge / key / split
        self._paths: dict[int, Path] = {}
        self._score = 0
        self._index: int | None = None
        self._history: list[Any] = []

    # ------------------------------------------------------------------ dataset
    @property
    def num_tasks(self) -> int:
        return self.num_games

    def game_path(self, index: int) -> Path:
        """The compiled game of ``index``; one that fails to generate/compile is skipped with a warning."""
        if index in self._paths:
            return self._paths[index]
        for attempt in range(4):
            seed = _SPLIT_SEED_BASE[self.split] + index + attempt * 1_000_000
            try:
                path = generate_textworld_game(self.challenge, self.challenge_args, self.split, seed,
                                               self.root / f"seed_{seed:08d}")
            except Exception as e:  # textworld raises many types on generation/compilation failures
                warnings.warn(f"skipping {self.challenge} game seed {seed}: {e!r}", RuntimeWarning, stacklevel=2)
                continue
            self._paths[index] = path
            return path
        raise RuntimeError(f"could not generate any {self.challenge} game for index {index}")

    # ------------------------------------------------------------------ hooks
    def _first_transition(self, state: dict[str, Any]) -> Transition:
        self._score = int(state["score"] or 0)
        return Transition(state["feedback"])

    def _step_transition(self, state: dict[str, Any]) -> Transition:
        score = int(state["score"] or 0)
        reward, self._score = float(score - self._score), score
        won, lost = bool(state["won"]), bool(state["lost"])
        return Transition(state["feedback"], reward=reward, terminated=won or lost, won=won)

    def _admissible(self) -> list[str]:
        return list(self._state["admissible_commands"]) if self._state is not None else []

    def _task(self) -> str:
        objective = (self._state["objective"] or "").strip() if self._state is not None else ""
        return objective or _DEFAULT_TASK[self.challenge]

    def _expert(self) -> str | None:
        policy = self._state["policy_commands"] if self._state is not None else None
        return policy[0] if policy else None

    def _info(self, invalid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        st = self._state
        more = {
            "task_id": f"{self.challenge}/{self._game.parent.name}" if self._game else "",
            "score": self._score,
            "max_score": int(st["max_score"]) if st is not None else 0,
            "lost": bool(st["lost"]) if st is not None else False,
        }
        return super()._info(invalid, {**extra, **more})

