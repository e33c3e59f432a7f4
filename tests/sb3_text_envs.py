"""Tiny text envs for the SB3-bridge tests (used only by tests; not registered)."""

from __future__ import annotations

from typing import Any

from echorl_envs.core import TextEnv, Transition


class CorridorTextEnv(TextEnv):
    """Walk right along a corridor of ``length`` cells to the exit (reward 1); 'wait' and 'go left' waste steps.

    With ``shuffle=True`` the admissible list is re-ordered (and padded with 0-2 'look' distractors) at every
    step, so a positional action index carries no meaning -- only state-action scoring (DRRN) can learn it.
    """

    def __init__(self, length: int = 4, shuffle: bool = False, max_steps: int = 12) -> None:
        super().__init__()
        self.length, self.shuffle, self.max_steps = length, shuffle, max_steps
        self.pos = 0
        self._order: list[str] = []

    def _describe(self) -> str:
        left = self.length - 1 - self.pos
        return f"You stand in cell {self.pos} of a corridor. The exit is {left} cells to the right."

    def _new_order(self) -> None:
        acts = ["go left", "go right", "wait"]
        if self.shuffle:
            acts += [f"look at wall {i}" for i in range(int(self.np_random.integers(3)))]
            acts = [acts[i] for i in self.np_random.permutation(len(acts))]
        self._order = acts

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self.pos = 0
        self._new_order()
        return Transition(self._describe())

    def _apply(self, action: str) -> Transition:
        if action == "go right":
            self.pos += 1
        elif action == "go left":
            self.pos = max(0, self.pos - 1)
        self._new_order()
        won = self.pos >= self.length - 1
        trunc = not won and self._step_count >= self.max_steps
        return Transition(self._describe(), reward=1.0 if won else 0.0, terminated=won, truncated=trunc, won=won)

    def _admissible(self) -> list[str]:
        return list(self._order)

    def _task(self) -> str:
        return "Reach the exit of the corridor."
