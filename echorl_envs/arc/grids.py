"""ARC grids as text: how the env writes them and how it reads an answer (rows of digits or JSON)."""

from __future__ import annotations

import json

from echorl_envs.core import InvalidAction

__all__ = ["Grid", "format_grid", "parse_grid"]

Grid = list[list[int]]
_MAX_SIDE = 30  # ARC grids are at most 30 x 30


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
