"""SB3 callbacks for learning curves on text envs (episode return, length and success vs env steps)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

__all__ = ["EpisodeRecord", "LearningCurveCallback"]


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished training episode."""

    timesteps: int
    """Env steps taken by the algorithm (all envs together) when the episode ended."""
    ret: float
    """Undiscounted episode return."""
    length: int
    """Episode length in steps."""
    won: bool
    """``info["won"]`` at the last step (the echorl success flag)."""


class LearningCurveCallback(BaseCallback):
    """Record every finished episode (return, length, success) against the number of env steps.

    Returns and lengths are summed from the step rewards seen by the algorithm (so no ``Monitor`` is needed);
    success is the echorl ``info["won"]`` flag of the last step.

    Args:
        target_success: optional success rate; when the rolling rate over the last ``window`` episodes first
            reaches it, ``steps_to_target`` is set (and training stops if ``stop_at_target``).
        window: episodes in the rolling success rate.
        stop_at_target: end ``learn()`` once the target is reached.
    """

    def __init__(self, target_success: float | None = None, window: int = 50, stop_at_target: bool = False):
        super().__init__()
        if target_success is not None and not 0.0 < target_success <= 1.0:
            raise ValueError(f"target_success must be in (0, 1], got target_success={target_success!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got window={window!r}")
        self.target_success = target_success
        self.window = window
        self.stop_at_target = stop_at_target
        self.episodes: list[EpisodeRecord] = []
        self.steps_to_target: int | None = None
        self._ret: np.ndarray | None = None
        self._len: np.ndarray | None = None

    def _on_training_start(self) -> None:
        n = self.training_env.num_envs
        self._ret, self._len = np.zeros(n), np.zeros(n, dtype=int)

    def success_rate(self) -> float:
        """Success rate over the last ``window`` episodes (nan before any episode)."""
        last = self.episodes[-self.window :]
        return float(np.mean([e.won for e in last])) if last else float("nan")

    def _on_step(self) -> bool:
        assert self._ret is not None and self._len is not None
        self._ret += np.asarray(self.locals["rewards"], dtype=float)
        self._len += 1
        for i, (done, info) in enumerate(zip(self.locals["dones"], self.locals["infos"], strict=True)):
            if done:
                self.episodes.append(EpisodeRecord(self.num_timesteps, float(self._ret[i]), int(self._len[i]),
                                                   bool(info.get("won", False))))
                self._ret[i], self._len[i] = 0.0, 0
                if (
                    self.target_success is not None
                    and self.steps_to_target is None
                    and len(self.episodes) >= self.window
                    and self.success_rate() >= self.target_success
                ):
                    self.steps_to_target = self.num_timesteps
        return not (self.stop_at_target and self.steps_to_target is not None)

    def to_csv(self, path: str | Path, **constant_columns: object) -> Path:
        """Write one row per episode (plus ``constant_columns`` such as algorithm and seed) to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*constant_columns, "timesteps", "return", "length", "won"])
            for e in self.episodes:
                w.writerow([*constant_columns.values(), e.timesteps, f"{e.ret:.4f}", e.length, int(e.won)])
        return path
