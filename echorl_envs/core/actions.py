"""Forgiving, never-guessing matching of text actions against an admissible list.

Matching ignores case, runs of whitespace, surrounding quotes/brackets-free punctuation and trailing
punctuation ("Go forward." == "go forward"), but never picks between two different admissible actions:
if the normalised text matches more than one distinct action the result is ambiguous and the action is
treated as invalid.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["ActionMatch", "normalize_action", "match_action", "to_printable", "describe_text", "PRINTABLE"]

#: Characters allowed in observations: printable ASCII (letters, digits, punctuation, space, tab, newline).
PRINTABLE = frozenset(string.printable) - {"\x0b", "\x0c", "\r"}

_TRAILING = ".!?;:,"
_QUOTES = "\"'`"
_WS = re.compile(r"\s+")
_NON_PRINTABLE = re.compile(r"[^\t\n\x20-\x7e]")


def to_printable(text: str) -> str:
    """Return ``text`` with every character outside :data:`PRINTABLE` escaped (``\\u00e9``-style).

    Observations must stay inside the ``Text`` observation space, whose charset is printable ASCII, so
    feedback that echoes a user's action (which may hold unicode or control characters) goes through here.
    """
    if _NON_PRINTABLE.search(text) is None:  # the common case, ~1 us instead of a per-character loop
        return text
    out = []
    for c in text:
        if c in PRINTABLE:
            out.append(c)
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def describe_text(text: object, limit: int = 80) -> str:
    """A short, printable, quoted rendering of an arbitrary action for feedback messages."""
    if not isinstance(text, str):
        return f"<{type(text).__name__}>"
    shown = to_printable(text)
    if len(shown) > limit:
        shown = shown[:limit] + f"... ({len(text)} chars)"
    return repr(shown)


def normalize_action(text: str) -> str:
    """Normalise an action for comparison: lower case, single spaces, no surrounding quotes or trailing
    punctuation."""
    t = _WS.sub(" ", text).strip().lower()
    while t and t[-1] in _TRAILING:
        t = t[:-1].rstrip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in _QUOTES:
        t = t[1:-1].strip()
    return t


@dataclass(frozen=True)
class ActionMatch:
    """Result of :func:`match_action`: ``action`` is the admissible spelling, or ``None`` with ``reason``."""

    action: str | None
    reason: str = ""
    candidates: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.action is not None


def match_action(
    text: object,
    admissible: Sequence[str],
    aliases: Callable[[str], Sequence[str]] | None = None,
) -> ActionMatch:
    """Match ``text`` to exactly one element of ``admissible``.

    Args:
        text: the agent's action (anything; non-strings are rejected with a reason).
        admissible: the admissible actions, in the env's own spelling.
        aliases: optional function giving, for a normalised admissible action, extra normalised spellings
            that also select it (e.g. ALFWorld's "put X in/on Y" for "put X in Y").

    Returns:
        An :class:`ActionMatch`; ``ok`` is False when nothing or more than one distinct action matches.
    """
    if not isinstance(text, str):
        return ActionMatch(None, f"the action must be a string, got {type(text).__name__}")
    key = normalize_action(text)
    if not key:
        return ActionMatch(None, "the action is empty")
    hits: list[str] = []
    for a in admissible:
        na = normalize_action(a)
        if key == na or (aliases is not None and key in aliases(na)):
            if a not in hits:
                hits.append(a)
    if len(hits) == 1:
        return ActionMatch(hits[0])
    if len(hits) > 1:
        return ActionMatch(None, "the action is ambiguous between " + ", ".join(map(repr, hits)), tuple(hits))
    return ActionMatch(None, f"{describe_text(text)} is not an admissible action")
