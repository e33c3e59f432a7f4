"""The ALFWorld text environment on alfworld's real TextWorld/PDDL engine."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_envs.alfworld.engine import AlfredEngine
from echorl_envs.alfworld.games import GeneratedPool, find_games, normalize_split
from echorl_envs.alfworld.generator import DIFFICULTIES, GeneratorConfig
from echorl_envs.alfworld.scenes import TASK_TYPES
from echorl_envs.core import EngineHostedEnv, Transition

__all__ = ["ALFWorldEnv", "resolve_task_types"]

_TASK_RE = re.compile(r"Your task is to: (.*)$", re.MULTILINE)


def resolve_task_types(task_types: str | Sequence[str]) -> list[str]:
    """``"all"``, one name or a list of names (our ``PickAndPlace`` or alfworld's ``pick_and_place_simple``)."""
    if isinstance(task_types, str):
        task_types = list(TASK_TYPES.values()) if task_types == "all" else [task_types]
    out = []
    for t in task_types:
        if t in TASK_TYPES:
            out.append(TASK_TYPES[t])
        elif t in TASK_TYPES.values():
            out.append(t)
        else:
            names = [*TASK_TYPES, *TASK_TYPES.values()]
            hint = difflib.get_close_matches(t, names, n=1)
            raise ValueError(
                f"unknown ALFWorld task type {t!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                + f" (accepted: 'all' or any of {sorted(TASK_TYPES)})"
            )
    if not out:
        raise ValueError("task_types must name at least one task type, got task_types=[]")
    return out


#: The environment variable naming downloaded ALFWorld data (alfworld's own name for it).
DATA_ENV = "ALFWORLD_DATA"
#: The folder alfworld puts in ``$ALFWORLD_DATA`` when it is unset: importing alfworld sets the variable to it (and
#: creates it), so that value only counts once ``alfworld-download`` has filled it.
ALFWORLD_DEFAULT_DATA = Path("~/.cache/alfworld").expanduser()


def resolve_data_path(data_path: str | os.PathLike | None) -> tuple[Path | None, str]:
    """Where ALFWorld games come from: ``data_path``, else ``$ALFWORLD_DATA`` when set, else None (the offline
    generator); with the name to cite in errors. A folder that does not exist is an error, never a silent fallback
    to generated games. ``$ALFWORLD_DATA`` equal to alfworld's own default (:data:`ALFWORLD_DEFAULT_DATA`, which
    importing alfworld sets) counts only when that folder holds downloaded data (``json_2.1.1``).
    """
    source = "data_path"
    value = os.environ.get(DATA_ENV, "")
    if data_path is None and value:
        default = Path(value).expanduser() == ALFWORLD_DEFAULT_DATA
        if not default or (ALFWORLD_DEFAULT_DATA / "json_2.1.1").is_dir():
            data_path, source = value, DATA_ENV
    if data_path is None:
        return None, source
    folder = Path(os.path.expandvars(str(data_path))).expanduser()
    if not folder.is_dir():
        fix = ("unset ALFWORLD_DATA to use the offline generator" if source == DATA_ENV
               else "omit data_path to use the offline generator")
        raise ValueError(f"{source}={str(data_path)!r} is not a folder (resolved to {str(folder.resolve())!r}); "
                         f"point it at the data of `alfworld-download` (json_2.1.1 layout) or {fix}")
    return folder, source


class ALFWorldEnv(EngineHostedEnv):
    """ALFWorld (Shridhar et al., 2021) household tasks, played by alfworld's own TextWorld/PDDL engine.

    Description:
        The agent is in a room with receptacles (cabinets, drawers, fridge, microwave, sinkbasin, desk...) and
        objects, and must complete one of six ALFRED task types: pick_and_place_simple, pick_two_obj_and_place,
        look_at_obj_in_light, pick_clean_then_place_in_recep, pick_heat_then_place_in_recep,
        pick_cool_then_place_in_recep. Games come from alfworld's downloaded data (``data_path=``, json_2.1.1
        layout, e.g. ``"$ALFWORLD_DATA"``) or, by default, from our offline generator
        (:mod:`echorl_envs.alfworld.generator`), deterministic by seed and cached on disk
        (``cache_dir=`` / ``$ECHORL_CACHE_DIR`` / the user cache dir).

    Observation:
        alfworld's text: on reset the intro (``-= Welcome to TextWorld, ALFRED! =-``, the room, and
        ``Your task is to: ...``), then the engine's feedback to each command.

    Actions:
        One of ``info["admissible_actions"]`` (from the engine: ``go to X``, ``open X``, ``take O from R``,
        ``move O to R``, ``heat/cool/clean O with R``, ``use L``, ``examine X``, ``look``, ``inventory``...).
        Case, spacing and trailing punctuation are forgiven, and the older spellings ``put O in/on R``,
        ``put O in R``, ``put O on R`` (ALFWorld issue #78) select ``move O to R``; an action that matches no
        admissible command, or several, is invalid (feedback lists the admissible ones, reward 0). Because
        only admissible commands reach the engine, ``go to`` never produces ALFWorld's silent
        ``Nothing happens.`` (issue #97).

    Rewards:
        1.0 on the step that completes the task (alfworld's ``won``), else 0.

    Termination:
        ``terminated`` when the task is completed; the registered ids truncate after 50 steps
        (ALFWorld's evaluation budget).

    Info:
        ``task``, ``admissible_actions``, ``won``, ``invalid_action``, ``step``, ``task_id`` (game dir),
        ``task_type``, ``gamefile`` and, unless ``expert=False``, ``expert_action`` (alfworld's handcoded
        expert, as ``AlfredExpert`` computes it). A step whose engine call exceeds ``step_timeout`` ends the
        episode truncated with ``info["error"]`` (the engine is replaced at the next reset).

    Registered ids:
        ``EchoRL/ALFWorld-v0`` (all six types) and ``EchoRL/ALFWorld-<Type>-v0`` for ``PickAndPlace``,
        ``PickTwoAndPlace``, ``LookAtInLight``, ``PickCleanAndPlace``, ``PickHeatAndPlace``,
        ``PickCoolAndPlace``.

    Args:
        task_types: ``"all"``, a type name, or a list of them.
        split: ``"train"``, ``"valid_seen"`` (alias ``"eval"``), ``"valid_unseen"`` or (generated games only)
            ``"valid_unseen_templates"``. Generated ``train``/``valid_seen``/``valid_unseen`` games differ by
            generator seed only (disjoint seeds, the same four room templates); ``valid_unseen_templates`` games
            also come from room templates no other split uses (studio, ensuite, den: each joins receptacle classes
            no training room holds together), the held-out-scenes test ALFWorld's own ``valid_unseen`` is.
        num_games: size of the generated pool (games are generated on first use); ignored with ``data_path``.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"`` (see :data:`DIFFICULTIES`), overridden by
            ``generator_config``.
        generator_config: explicit :class:`GeneratorConfig` (or a dict of its fields).
        data_path: downloaded ALFWorld data root; when set, games are discovered there instead of generated.
            Default: ``$ALFWORLD_DATA`` when that variable is set, else the generator. A folder that does not
            exist, or holds no solvable game of ``task_types``, is a ValueError naming the argument or variable.
        cache_dir: where generated games are cached.
        expert: compute ``info["expert_action"]`` (about doubles the cost of a step).
        step_timeout: seconds one engine step may take before it is abandoned (:class:`~echorl_envs.core.
            EngineHost`: after that the engine runs in a child process that is killed on a timeout); None calls
            the engine directly, without a timeout.
        reset_timeout: the same for a reset, which may load and compile a new game (used unless
            ``step_timeout`` is None).
        offer_help: list the ``help`` command (it prints the command list and changes nothing) among the
            admissible actions, as alfworld's own command list does. False drops it, as verl-agent's ALFWorld setup
            (GiGPO's) does: then ``help`` is an invalid action like any other inadmissible text.
    """

    def __init__(
        self,
        task_types: str | Sequence[str] = "all",
        split: str = "train",
        num_games: int = 48,
        difficulty: str = "medium",
        generator_config: GeneratorConfig | dict[str, Any] | None = None,
        data_path: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        expert: bool = True,
        render_mode: str | None = None,
        step_timeout: float | None = 30.0,
        reset_timeout: float = 300.0,
        offer_help: bool = True,
    ) -> None:
        super().__init__(render_mode=render_mode)
        self._ctor = dict(
            task_types=task_types, split=split, num_games=num_games, difficulty=difficulty,
            generator_config=generator_config, data_path=data_path, cache_dir=cache_dir, expert=expert,
            render_mode=render_mode, step_timeout=step_timeout, reset_timeout=reset_timeout, offer_help=offer_help,
        )
        self._start_host(functools.partial(AlfredEngine, expert=expert), step_timeout, reset_timeout,
                         "echorl-alfworld-engine")
        self.task_types = resolve_task_types(task_types)
        self.split = normalize_split(split)
        if generator_config is None:
            if difficulty not in DIFFICULTIES:
                hint = difflib.get_close_matches(difficulty, DIFFICULTIES, n=1)
                raise ValueError(
                    f"difficulty must be one of {sorted(DIFFICULTIES)}, got difficulty={difficulty!r}"
                    + (f"; did you mean {hint[0]!r}?" if hint else "")
                )
            cfg = DIFFICULTIES[difficulty]
        elif isinstance(generator_config, dict):
            cfg = GeneratorConfig(**generator_config)
        else:
            cfg = generator_config
        self.generator_config = cfg
        self._pool: GeneratedPool | None = None
        self._files: list[Path] = []
        data_path, source = resolve_data_path(data_path)
        if data_path is not None:
            self._files = find_games(data_path, self.split, self.task_types)
            if not self._files:
                raise ValueError(
                    f"no solvable ALFWorld games of types {self.task_types} in split {self.split!r} under "
                    f"{source}={str(data_path)!r}; run `alfworld-download` there, or "
                    + ("unset ALFWORLD_DATA" if source == DATA_ENV else "omit data_path")
                    + " to use the offline generator"
                )
        else:
            self._pool = GeneratedPool(self.task_types, self.split, num_games, cfg, cache_dir)
        self.expert = expert
        self.offer_help = bool(offer_help)
        self._state = {}
        self._task_text = ""
        self._index: int | None = None
        self._history: list[Any] = []

    # ------------------------------------------------------------------ dataset
    @property
    def num_tasks(self) -> int:
        return len(self._pool) if self._pool is not None else len(self._files)

    def game_path(self, index: int) -> Path:
        """The ``game.tw-pddl`` of game ``index`` (generating it on first use)."""
        return self._pool.path(index) if self._pool is not None else self._files[index]

    # ------------------------------------------------------------------ hooks
    def _first_transition(self, state: dict[str, Any]) -> Transition:
        m = _TASK_RE.search(state["feedback"])
        self._task_text = m.group(1).strip() if m else ""
        return Transition(state["feedback"], won=state["won"])

    def _step_transition(self, state: dict[str, Any]) -> Transition:
        won = state["won"]
        return Transition(state["feedback"], reward=1.0 if won else 0.0, terminated=won, won=won)

    def _admissible(self) -> list[str]:
        cmds = self._state.get("admissible_commands", ())
        return [c for c in cmds if self.offer_help or c != "help"]

    def _task(self) -> str:
        return self._task_text

    def _expert(self) -> str | None:
        return self._state.get("expert_action")

    def _aliases(self, normalized_action: str) -> Sequence[str]:
        """Older/alternative spellings of an admissible command (ALFWorld issue #78)."""
        words = normalized_action.split(" ", 1)
        if words[0] == "move" and " to " in normalized_action:
            obj, rec = normalized_action[5:].split(" to ", 1)
            return (f"put {obj} in/on {rec}", f"put {obj} in {rec}", f"put {obj} on {rec}",
                    f"put {obj} into {rec}", f"place {obj} in/on {rec}")
        if words[0] == "take" and " from " in normalized_action:
            obj, rec = normalized_action[5:].split(" from ", 1)
            return (f"pick up {obj} from {rec}", f"take {obj}", f"pick up {obj}")
        if normalized_action.startswith("go to "):
            return (f"goto {normalized_action[6:]}", f"walk to {normalized_action[6:]}")
        if words[0] == "use":
            return (f"turn on {words[1]}", f"toggle {words[1]}") if len(words) > 1 else ()
        return ()

    def _info(self, invalid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        game = self._game
        return super()._info(invalid, {**extra, **{
            "task_id": game.parent.parent.name + "/" + game.parent.name if game else "",
            "task_type": game.parent.parent.name.split("-", 1)[0] if game else "",
            "gamefile": str(game) if game else "",
        }})

