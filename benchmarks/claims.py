"""A study's runs shared by several processes: one claim file per run, one JSON-lines file they all append to.

Pre-registered studies run for hours and span sessions; several processes may work through the same list of runs
with the same output. :func:`claim` gives each run to one live process (a claim whose process is gone -- a crash, a
killed session -- is taken over, so the study resumes), :func:`append_jsonl` and :func:`drop_rows` take the file's
``flock`` so an append never interleaves with the removal of an interrupted run's partial rows.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from echorl_agent.replay.serialization import pid_alive

__all__ = ["append_jsonl", "claim", "drop_rows"]


def claim(path: str | os.PathLike) -> Path | None:
    """Claim the run whose claim file is ``path`` for this process: the file (to unlink after the run), or None if
    another live process holds it.

    The file is created with ``O_EXCL`` and holds the owner's pid; a file whose pid is gone (or unreadable) is stale
    and taken over; this process's own claim is returned again.
    """
    path = Path(path)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid == os.getpid():
                return path
            if pid > 0 and pid_alive(pid):
                return None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return path
    return None


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append ``row`` as one JSON line, holding the file's lock."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")


def drop_rows(path: str | os.PathLike, drop: Callable[[dict], bool]) -> int:
    """Remove the rows of a JSON-lines file for which ``drop(row)`` is true (in place, holding the file's lock, so
    appends of other processes wait rather than interleave); returns how many were removed (0 if no file)."""
    if not Path(path).exists():
        return 0
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
        kept = [ln for ln in lines if not drop(json.loads(ln))]
        if len(kept) < len(lines):
            f.seek(0)
            f.write("".join(ln + "\n" for ln in kept))
            f.truncate()
        return len(lines) - len(kept)
