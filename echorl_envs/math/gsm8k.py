"""GSM8K: grade-school math word problems (Cobbe et al., 2021) from the official jsonl files.

Data format (``openai/grade-school-math``, ``grade_school_math/data/{train,test}.jsonl``): one JSON object
per line with ``question`` and ``answer``; the answer is a worked solution whose last line is
``#### N`` (the gold number, sometimes with thousands separators such as ``#### 1,450,000``).

Where the file is looked up (first hit wins):

1. ``data_path=`` -- a ``.jsonl`` file, or a directory holding ``gsm8k/<split>.jsonl`` or
   ``gsm8k_<split>.jsonl``;
2. the ``ECHORL_DATA_DIR`` environment variable -- a directory searched the same way.

The data is not bundled (MIT-licensed, but kept out of the wheel); fetch it once with
:func:`download_gsm8k`.
"""

from __future__ import annotations

import json
import os
import urllib.request
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

from echorl_envs.core import MAX_TEXT
from echorl_envs.math.answers import ascii_text, extract_answer, format_number
from echorl_envs.math.base import MathAnswerEnv, MathItem, Verdict, read_number

__all__ = ["GSM8KEnv", "GSM8K_URL", "download_gsm8k", "find_gsm8k_file", "load_gsm8k"]

#: Raw URL of the official files; ``{split}`` is "train" or "test".
GSM8K_URL = (
    "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{split}.jsonl"
)
SPLITS = ("train", "test")

_CACHE: dict[tuple[str, int, int], tuple[tuple[str, str, str], ...]] = {}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got split={split!r}")


def _candidates(directory: Path, split: str) -> list[Path]:
    return [directory / "gsm8k" / f"{split}.jsonl", directory / f"gsm8k_{split}.jsonl"]


def find_gsm8k_file(data_path: str | os.PathLike[str] | None = None, split: str = "test") -> Path:
    """Locate the GSM8K jsonl file (see the module docstring for the search order).

    Raises:
        FileNotFoundError: naming ``data_path``, ``ECHORL_DATA_DIR`` and :func:`download_gsm8k`.
    """
    _check_split(split)
    tried: list[Path] = []
    if data_path is not None:
        p = Path(data_path).expanduser()
        if p.is_file():
            return p
        tried += _candidates(p, split) if p.is_dir() else [p]
    env_dir = os.environ.get("ECHORL_DATA_DIR")
    if env_dir:
        tried += _candidates(Path(env_dir).expanduser(), split)
    for p in tried:
        if p.is_file():
            return p
    where = ", ".join(str(p) for p in tried) or "nowhere (neither data_path nor ECHORL_DATA_DIR is set)"
    raise FileNotFoundError(
        f"GSM8K {split} data not found; looked in: {where}. "
        "Pass data_path=<file.jsonl or folder> to gym.make, "
        f"or set ECHORL_DATA_DIR to a folder holding gsm8k/{split}.jsonl; fetch the official file once with "
        f"`python -c \"from echorl_envs.math import download_gsm8k; download_gsm8k('~/data')\"` "
        f"(then data_path='~/data' or ECHORL_DATA_DIR=~/data)."
    )


def download_gsm8k(dest: str | os.PathLike[str], split: str = "test", timeout: float = 60.0) -> Path:
    """Download the official GSM8K ``split`` file into ``dest/gsm8k/<split>.jsonl`` and return its path.

    Uses plain HTTPS from :data:`GSM8K_URL` (GitHub raw, read at call time); an existing file is kept and
    a download that does not parse as GSM8K is discarded. The test suite exercises it with a file:// URL.
    """
    _check_split(split)
    target = Path(dest).expanduser() / "gsm8k" / f"{split}.jsonl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = GSM8K_URL.format(split=split)
    tmp = target.with_suffix(".jsonl.part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # a fixed https URL
            tmp.write_bytes(resp.read())
        if not load_gsm8k(tmp):  # validate before publishing the file
            raise ValueError(f"downloaded GSM8K {split} file from {url} holds no items")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def load_gsm8k(path: str | os.PathLike[str]) -> tuple[tuple[str, str, str], ...]:
    """Parse a GSM8K jsonl file into ``(question, solution, gold)`` triples (cached per file version).

    ``gold`` is the canonical text of the number after ``####`` (``1,450,000`` -> ``1450000``).

    Raises:
        ValueError: naming the line when a row lacks ``question``/``answer`` or the ``#### N`` marker.
    """
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key in _CACHE:
        return _CACHE[key]
    rows = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                question, solution = obj["question"], obj["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{p}:{lineno}: not a GSM8K row with 'question' and 'answer' ({e})"
                ) from None
            if "####" not in solution:
                raise ValueError(f"{p}:{lineno}: the answer lacks the final '#### N' line")
            gold = extract_answer(solution[solution.rfind("####") :])
            if gold is None:
                raise ValueError(f"{p}:{lineno}: no number after '####' in the answer")
            rows.append((question, solution, format_number(gold)))
    _CACHE[key] = out = tuple(rows)
    return out


class GSM8KEnv(MathAnswerEnv):
    """GSM8K word problems with a numeric free-text answer.

    **Description**: one grade-school math word problem per episode, from the official GSM8K jsonl
    (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems").

    **Observation**: the question (printable ASCII: curly quotes and currency signs spelled out), then the
    answer instructions and the number of attempts; after a wrong answer, "Incorrect ... Try again" and the
    question again.

    **Actions**: free text. The final number is extracted (``#### N``, ``\\boxed{N}``, "the answer is N",
    else the last number; "$1,000.00", "1000" and "1,000" are equal) and compared exactly (fractions) with
    the gold number. A reply without a number is an invalid action (feedback, ``info["invalid_action"]``,
    no attempt used).

    **Rewards**: 1 for a correct answer, else 0.

    **Termination**: on a correct answer, or after ``max_attempts`` wrong ones (the gold answer is then
    revealed). Truncation by the registered ``max_episode_steps``.

    **Info**: ``task_id`` ("gsm8k/<split>/<line index>"), ``attempts_left``, ``expert_action`` (the oracle:
    the gold number).

    **Registered ids**: ``EchoRL/GSM8K-v0``.

    Args:
        data_path: the jsonl file or a folder holding ``gsm8k/<split>.jsonl`` (default: ``ECHORL_DATA_DIR``).
        split: "test" (1319 items) or "train" (7473 items).
        max_attempts: answers allowed per episode.
    """

    answer_hint: ClassVar[str] = "Answer with the final number (e.g. 'The answer is 42')."

    def __init__(
        self,
        data_path: str | os.PathLike[str] | None = None,
        split: str = "test",
        max_attempts: int = 3,
        render_mode: str | None = None,
        max_text_length: int = MAX_TEXT,
    ):
        super().__init__(max_attempts=max_attempts, render_mode=render_mode, max_text_length=max_text_length)
        self.split = split
        self.data_path = find_gsm8k_file(data_path, split)
        self._rows = load_gsm8k(self.data_path)

    @property
    def num_tasks(self) -> int:
        return len(self._rows)

    def _item(self, index: int) -> MathItem:
        question, solution, gold = self._rows[index]
        return MathItem(
            task_id=f"gsm8k/{self.split}/{index}",
            question=ascii_text(question),
            answer=gold,
            meta={"solution": solution},
        )

    def _check(self, answer: str, item: MathItem) -> Verdict:
        value = read_number(answer)
        return Verdict(value == Fraction(item.answer), format_number(value))

    # The parsed rows are re-read (from the per-process cache) on unpickling rather than shipped around.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_rows", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rows = load_gsm8k(self.data_path)
