"""What the CRUXEval envs share around the sandbox: where the data is, how many attempts, and the verdict.

:func:`verdict` turns one sandbox result into the env's transition -- "Correct!" and reward 1, or the reason the
answer is wrong (in the env's :class:`Wording`) with the attempts left, and the end of the episode when none are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from echorl_envs.core import Transition
from echorl_envs.sandbox import SandboxConfig, SandboxResult

__all__ = ["JUDGE_CONFIG", "Wording", "verdict", "check_max_attempts", "resolve_data_path"]

#: Limits of one judged answer (a CRUXEval program runs in well under a second).
JUDGE_CONFIG = SandboxConfig(wall_seconds=5.0, cpu_seconds=3)


class Wording(NamedTuple):
    """How an env words a wrong answer, per sandbox status (``{message}`` is the sandbox's message)."""

    failed: str
    timeout: str
    error: str


def verdict(result: SandboxResult, attempts_left: int, wording: Wording, info: dict[str, Any],
            reveal: str = "") -> Transition:
    """The transition after a judged answer.

    Args:
        result: the sandbox's result of the judged program.
        attempts_left: attempts left after this one (0 ends the episode).
        wording: the env's words for a wrong answer.
        info: the step's extra info (e.g. ``{"judge_status": result.status}``).
        reveal: appended when the last attempt fails (e.g. " A correct answer was: 42").

    >>> ok = SandboxResult("passed", "", 0.01)
    >>> verdict(ok, 2, Wording("Wrong.", "Timed out.", "Raised {message}."), {}).observation
    'Correct! The assertion passes.'
    >>> bad = SandboxResult("error", "ZeroDivisionError: division by zero", 0.01)
    >>> t = verdict(bad, 0, Wording("Wrong.", "Timed out.", "Raised {message}."), {}, " It was 3.")
    >>> t.observation, t.reward, t.terminated
    ('Raised ZeroDivisionError: division by zero. No attempts left. It was 3.', 0.0, True)
    """
    if result.passed:
        return Transition("Correct! The assertion passes.", 1.0, True, won=True, info=info)
    why = {"failed": wording.failed, "timeout": wording.timeout}.get(result.status, wording.error)
    why = why.format(message=result.message)
    if attempts_left <= 0:
        return Transition(f"{why} No attempts left.{reveal}", 0.0, True, info=info)
    return Transition(f"{why} {attempts_left} attempt(s) left.", 0.0, False, info=info)


def check_max_attempts(max_attempts: Any) -> int:
    """``max_attempts`` if it is an int >= 1, else a ``ValueError`` naming it."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got max_attempts={max_attempts!r}")
    return max_attempts


def resolve_data_path(data_path: str | os.PathLike | None) -> Path | None:
    """The ``cruxeval.jsonl`` to read: ``data_path`` (a file or a folder holding one), else
    ``$ECHORL_DATA_DIR/cruxeval/cruxeval.jsonl`` when it exists, else None (use the generated set)."""
    if data_path is None and os.environ.get("ECHORL_DATA_DIR"):
        default = Path(os.environ["ECHORL_DATA_DIR"]) / "cruxeval" / "cruxeval.jsonl"
        data_path = default if default.is_file() else None
    if data_path is None:
        return None
    p = Path(data_path)
    p = p / "cruxeval.jsonl" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"data_path must be a cruxeval.jsonl file or a folder holding one, "
                         f"got data_path={str(data_path)!r}")
    return p.resolve()
