"""textworld's engine (``textworld.start``: Jericho + textworld's Inform 7 wrapper) on one compiled game.

It reports admissible commands, the score and the current winning policy; the env hosts it in an
:class:`~echorl_envs.core.EngineHost` (optionally a child process, so states are plain dicts).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

__all__ = ["TextWorldEngine"]

_STATE_KEYS = ("feedback", "score", "max_score", "won", "lost", "admissible_commands", "policy_commands", "objective")


class TextWorldEngine:
    """``textworld.start`` on one compiled game, its states exported as plain dicts (they cross a process pipe)."""

    def __init__(self) -> None:
        self.env: Any = None

    def start(self, path: Path) -> None:
        import textworld

        self.close()
        infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True,
                                   score=True, max_score=True, objective=True)
        with warnings.catch_warnings():
            # Jericho flags every TextWorld-compiled game as "not fully supported" (it lacks a per-game
            # score table); textworld's own wrapper tracks score and state, so the warning is noise.
            warnings.filterwarnings("ignore", message=".*not fully supported.*")
            self.env = textworld.start(str(path), request_infos=infos)

    @staticmethod
    def _export(state: Any) -> dict[str, Any]:
        out = {k: state[k] for k in _STATE_KEYS}
        for k in ("admissible_commands", "policy_commands"):
            out[k] = list(out[k]) if out[k] is not None else None
        return out

    def reset(self) -> dict[str, Any]:
        return self._export(self.env.reset())

    def step(self, action: str) -> dict[str, Any]:
        state, _score, _done = self.env.step(action)
        return self._export(state)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
        self.env = None
