"""Math problems generated offline by reasoning-gym (``gsm_symbolic``, ``basic_arithmetic``).

reasoning-gym's procedural datasets are indexable and deterministic: item ``i`` of a dataset built with
``seed=s`` is generated from ``random.Random(s + i)``. A pool of ``size`` items is therefore fixed by
``(dataset, seed, size, dataset_kwargs)``; items are generated on demand, nothing is downloaded.

Judging: the reward compares the *final* number of the reply (see :mod:`echorl_envs.math.answers`)
exactly with reasoning-gym's gold ``answer``. reasoning-gym's own ``score_answer`` is reported alongside as
``info["rg_score"]`` but is not the reward: for ``gsm_symbolic`` it reads the *first* number of the reply
(so "12 x 2 = 24, total 70" scores as 12, and "-3" as 3) and gives 0.01 to any wrong number; for
``basic_arithmetic`` it is string equality with partial credit for containing the answer.
"""

from __future__ import annotations

import difflib
import inspect
from fractions import Fraction
from typing import Any, ClassVar

import reasoning_gym
from reasoning_gym.factory import DATASETS

from echorl_envs.core import MAX_TEXT, Transition
from echorl_envs.math.answers import ascii_text, format_number
from echorl_envs.math.base import MathAnswerEnv, MathItem, Verdict, read_number

__all__ = ["ArithmeticEnv", "GSMSymbolicEnv", "ReasoningGymMathEnv"]


class ReasoningGymMathEnv(MathAnswerEnv):
    """A numeric-answer reasoning-gym dataset as a multi-turn text env (base of the registered envs).

    Args:
        dataset: reasoning-gym dataset name whose answers are numbers (e.g. "gsm_symbolic",
            "basic_arithmetic", "chain_sum", "products").
        size: number of items in the pool (``num_tasks``).
        seed: reasoning-gym's dataset seed (item ``i`` comes from ``Random(seed + i)``).
        dataset_kwargs: extra fields of the dataset's reasoning-gym config (e.g. ``max_terms``).
        max_attempts: answers allowed per episode.
    """

    dataset_name: ClassVar[str] = ""
    step_info_keys: ClassVar[tuple[str, ...]] = ("rg_score",)

    def __init__(
        self,
        dataset: str | None = None,
        size: int = 1000,
        seed: int = 0,
        dataset_kwargs: dict[str, Any] | None = None,
        max_attempts: int = 3,
        render_mode: str | None = None,
        max_text_length: int = MAX_TEXT,
    ):
        super().__init__(max_attempts=max_attempts, render_mode=render_mode, max_text_length=max_text_length)
        name = dataset or self.dataset_name
        if name not in DATASETS:
            hint = difflib.get_close_matches(str(name), sorted(DATASETS), n=1)
            raise ValueError(
                f"dataset must be a reasoning-gym dataset name, got dataset={name!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1 (the pool size), got size={size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0 (reasoning-gym's dataset seed), got seed={seed!r}")
        kwargs = dict(dataset_kwargs or {})
        fields = [p for p in inspect.signature(DATASETS[name][1]).parameters if p not in ("seed", "size")]
        for k in kwargs:
            if k not in fields:
                hint = difflib.get_close_matches(k, fields, n=1)
                raise ValueError(
                    f"dataset_kwargs has unknown field {k!r} for reasoning-gym {name!r}"
                    + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + f" (accepted: {fields})"
                )
        self.dataset = name
        self.size = size
        self.seed = seed
        self.dataset_kwargs = kwargs
        self._rg: Any = None
        self._rg_dataset()  # build now so a bad config fails at construction

    def _rg_dataset(self) -> Any:
        if self._rg is None:
            try:
                self._rg = reasoning_gym.create_dataset(
                    self.dataset, seed=self.seed, size=self.size, **self.dataset_kwargs
                )
            except AssertionError as e:  # reasoning-gym validates configs with assert
                raise ValueError(
                    f"invalid dataset_kwargs={self.dataset_kwargs!r} for {self.dataset!r}: {e}"
                ) from None
        return self._rg

    @property
    def num_tasks(self) -> int:
        return self.size

    def _item(self, index: int) -> MathItem:
        entry = self._rg_dataset()[index]
        gold = Fraction(str(entry["answer"]).replace(",", ""))
        return MathItem(
            task_id=f"{self.dataset}/seed{self.seed}/{index}",
            question=ascii_text(entry["question"]),
            answer=format_number(gold),
            meta={"entry": entry},
        )

    def _check(self, answer: str, item: MathItem) -> Verdict:
        value = read_number(answer)
        return Verdict(value == Fraction(item.answer), format_number(value))

    def _apply(self, action: str) -> Transition:
        tr = super()._apply(action)
        assert self._current is not None
        try:
            tr.info["rg_score"] = float(self._rg_dataset().score_answer(action, self._current.meta["entry"]))
        except Exception:  # noqa: BLE001 - a third-party scorer must never break a step; the reward is ours
            tr.info["rg_score"] = 0.0
        return tr

    # reasoning-gym datasets hold lazily imported generator functions; rebuild them after unpickling.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_rg"] = None
        return state


class GSMSymbolicEnv(ReasoningGymMathEnv):
    """GSM-Symbolic: GSM8K-style word problems re-instantiated from templates, generated offline.

    **Description**: reasoning-gym's ``gsm_symbolic`` (templates after Mirzadeh et al., 2024,
    "GSM-Symbolic"); a fixed pool of ``size`` problems, item ``i`` from ``Random(seed + i)``.

    **Observation**: the question (ASCII; e.g. "EUR" for the euro sign), the answer instructions and the
    number of attempts; after a wrong answer "Incorrect ... Try again" and the question again.

    **Actions**: free text; the final number is extracted and compared exactly with the gold answer.
    No number -> invalid action (feedback, no attempt used).

    **Rewards**: 1 for a correct answer, else 0 (``info["rg_score"]``: reasoning-gym's own score).

    **Termination**: correct answer, or ``max_attempts`` wrong answers; truncation by ``max_episode_steps``.

    **Info**: ``task_id`` ("gsm_symbolic/seed<s>/<i>"), ``attempts_left``, ``expert_action`` (the oracle:
    the generator's gold number), ``rg_score`` after an answer.

    **Registered ids**: ``EchoRL/GSMSymbolic-v0``.
    """

    dataset_name: ClassVar[str] = "gsm_symbolic"


class ArithmeticEnv(ReasoningGymMathEnv):
    """Arithmetic expressions (+ - * / and parentheses, integer results) generated offline.

    **Description**: reasoning-gym's ``basic_arithmetic`` ("Calculate -5 * -6."), 2-6 terms of 1-4 digits by
    default (``dataset_kwargs`` changes this); a fixed pool of ``size`` items from ``Random(seed + i)``.

    **Observation**: the expression to evaluate, the answer instructions and the number of attempts.

    **Actions**: free text; the final number is extracted and compared exactly with the gold value.
    No number -> invalid action (feedback, no attempt used).

    **Rewards**: 1 for the right value, else 0 (``info["rg_score"]``: reasoning-gym's own score).

    **Termination**: correct answer, or ``max_attempts`` wrong answers; truncation by ``max_episode_steps``.

    **Info**: ``task_id`` ("basic_arithmetic/seed<s>/<i>"), ``attempts_left``, ``expert_action`` (the
    oracle: the exact value), ``rg_score`` after an answer.

    **Registered ids**: ``EchoRL/Arithmetic-v0``.
    """

    dataset_name: ClassVar[str] = "basic_arithmetic"
