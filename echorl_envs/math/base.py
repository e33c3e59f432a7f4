"""Shared multi-turn answer loop of the math environments.

Every math env is a :class:`~echorl_envs.core.DatasetTextEnv` over a finite list of items. An episode
shows one problem; the agent answers in free text up to ``max_attempts`` times. A correct answer ends the
episode with reward 1; a wrong one costs an attempt and the observation says "incorrect, try again" with
the problem repeated; the last wrong attempt ends the episode with reward 0 and reveals the gold answer.
An answer the checker cannot read (no number, unsafe expression...) raises
:class:`~echorl_envs.core.InvalidAction`: the base class turns it into feedback with
``info["invalid_action"] = True``; it does not cost an attempt (the ``max_episode_steps`` time limit of
the registered id still bounds the episode).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from echorl_envs.core import MAX_TEXT, DatasetTextEnv, InvalidAction, Transition
from echorl_envs.core.actions import describe_text
from echorl_envs.math.answers import extract_answer

__all__ = ["MathItem", "Verdict", "MathAnswerEnv", "read_number"]


def read_number(answer: str) -> Fraction:
    """The final number of a free-text answer (:func:`~echorl_envs.math.answers.extract_answer`).

    Raises:
        InvalidAction: when the answer holds no number or an absurdly long one.
    """
    try:
        value = extract_answer(answer)
    except ValueError as e:
        raise InvalidAction(f"{describe_text(answer)} holds {e}.") from None
    if value is None:
        raise InvalidAction(f"no number found in {describe_text(answer)}.")
    return value


@dataclass(frozen=True)
class MathItem:
    """One problem of a math env."""

    #: stable id reported as ``info["task_id"]``
    task_id: str
    #: the problem statement shown to the agent (printable ASCII)
    question: str
    #: the oracle's answer, returned as ``info["expert_action"]`` and accepted by the checker
    answer: str
    #: family-specific data (reasoning-gym entry, puzzle numbers...)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Verdict:
    """The checker's judgement of one readable answer."""

    correct: bool
    #: how the answer was read, echoed in feedback (e.g. the extracted number)
    shown: str


class MathAnswerEnv(DatasetTextEnv):
    """Base class: one item per episode, free-text answers, up to ``max_attempts`` tries.

    Subclasses implement :attr:`num_tasks`, :meth:`_item` (the i-th problem), :meth:`_check` (judge an
    answer, raising ``InvalidAction`` when unreadable) and :attr:`answer_hint` (how to phrase an answer).

    Extra ``info`` keys on every step: ``task_id`` (str), ``attempts_left`` (int), ``expert_action`` (the
    oracle's answer, i.e. the gold answer, while the episode runs).
    """

    #: one sentence telling the agent what form the answer takes
    answer_hint: ClassVar[str] = "Answer with the final number."

    def __init__(
        self, max_attempts: int = 3, render_mode: str | None = None, max_text_length: int = MAX_TEXT
    ):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got max_attempts={max_attempts!r}")
        super().__init__(render_mode=render_mode, max_text_length=max_text_length)
        self.max_attempts = max_attempts
        self._current: MathItem | None = None
        self._attempts_left = max_attempts

    # ----------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def _item(self, index: int) -> MathItem:
        """The problem at ``index`` (0 <= index < num_tasks), deterministic."""

    @abc.abstractmethod
    def _check(self, answer: str, item: MathItem) -> Verdict:
        """Judge ``answer``; raise ``InvalidAction`` with a helpful message when it cannot be read."""

    # ----------------------------------------------------------------- public helpers
    def item(self, index: int) -> MathItem:
        """The problem at ``index`` (for inspection and tests; does not start an episode)."""
        n = self.num_tasks
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"index must be an int in [0, {n}), got index={index!r}")
        return self._item(index)

    # ----------------------------------------------------------------- TextEnv hooks
    def _prompt(self, item: MathItem) -> str:
        return item.question

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._current = self._item(self._select_index(options))
        self._attempts_left = self.max_attempts
        tries = "1 attempt" if self.max_attempts == 1 else f"{self.max_attempts} attempts"
        obs = f"{self._prompt(self._current)}\n\n{self.answer_hint} You have {tries}."
        return Transition(observation=obs)

    def _apply(self, action: str) -> Transition:
        item = self._current
        assert item is not None, "reset() sets the item"
        try:
            verdict = self._check(action, item)
        except InvalidAction as e:
            raise InvalidAction(f"Invalid answer: {e} {self.answer_hint}") from None
        if verdict.correct:
            return Transition(f"Correct! {verdict.shown} is right.", reward=1.0, terminated=True, won=True)
        self._attempts_left -= 1
        if self._attempts_left <= 0:
            return Transition(
                f"Incorrect: {verdict.shown} is not right, and no attempts are left. "
                f"The expected answer was {item.answer}.",
                terminated=True,
            )
        left = "1 attempt" if self._attempts_left == 1 else f"{self._attempts_left} attempts"
        return Transition(
            f"Incorrect: {verdict.shown} is not right. Try again ({left} left).\n\n{self._prompt(item)}"
        )

    def _task(self) -> str:
        return self._current.question if self._current is not None else ""

    def _expert(self) -> str | None:
        return self._current.answer if self._current is not None else None

    def _info(self, invalid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        info = super()._info(invalid, extra)
        if self._current is not None:
            info["task_id"] = self._current.task_id
        info["attempts_left"] = self._attempts_left
        return info
