"""``curve.csv`` of a ``train-llm`` run: one row per finished training episode, plus held-out points.

Columns say what they hold: ``timesteps`` (env steps when the episode ended), ``success_rate`` and ``return_mean``
(over the last :data:`WINDOW` finished training episodes, this one included), ``episode_return`` (this episode's
own return), and on held-out rows (``eval_every``) ``heldout_sampled_success`` / ``heldout_greedy_success`` with the
training columns left empty.
"""

from __future__ import annotations

import csv
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["COLUMNS", "WINDOW", "rolling_rows", "write_curve"]

WINDOW = 20
"""Training episodes the rolling columns average over."""
COLUMNS = ("timesteps", "success_rate", "return_mean", "episode_return", "heldout_sampled_success",
           "heldout_greedy_success")


def rolling_rows(episodes: Iterable[tuple[int, bool, float]]) -> list[tuple[int, float, float]]:
    """(timesteps, rolling success over :data:`WINDOW` episodes, episode return) per (timesteps, won, return)."""
    recent: deque[float] = deque(maxlen=WINDOW)
    rows = []
    for steps, won, ret in episodes:
        recent.append(float(won))
        rows.append((int(steps), sum(recent) / len(recent), float(ret)))
    return rows


def write_curve(path: Path, rows: Sequence[tuple[int, float, float]], heldout: Sequence[dict] = ()) -> None:
    """Write ``curve.csv`` from rows of (timesteps, rolling success, episode return) and held-out points
    (dicts with ``timesteps`` and ``heldout_*`` keys), in env-step order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    recent: deque[float] = deque(maxlen=WINDOW)
    out = []
    for steps, success, ret in rows:
        recent.append(float(ret))
        out.append((int(steps), 0, [steps, success, sum(recent) / len(recent), ret, "", ""]))
    for p in heldout:
        out.append((int(p["timesteps"]), 1, [p["timesteps"], "", "", "", p.get("heldout_sampled_success", ""),
                                             p.get("heldout_greedy_success", "")]))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(r for _, _, r in sorted(out, key=lambda t: (t[0], t[1])))
