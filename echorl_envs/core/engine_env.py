"""Envs whose game runs in a native engine behind an :class:`~echorl_envs.core.engine_calls.EngineHost`.

ALFWorld (TextWorld's PDDL engine + fast-downward) and TextWorld (Jericho) share one life cycle, kept here once:
load a game file into the engine unless it is already loaded, reset it, step it; an engine call that fails or
hangs (:class:`~echorl_envs.core.engine_calls.EngineError`) is retried once on a fresh engine at reset, and ends
the episode truncated (``info["error"]``) at a step. Subclasses say how the engine loads a game
(:attr:`EngineHostedEnv.load_method`), where game ``index`` lives (``game_path``) and how an engine state reads
as a transition (``_first_transition`` / ``_step_transition``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from echorl_envs.core.base import Transition
from echorl_envs.core.engine_calls import EngineError, EngineHost, timeout_transition
from echorl_envs.core.replay_pickle import ReplayPickledEnv

__all__ = ["EngineHostedEnv"]


class EngineHostedEnv(ReplayPickledEnv):
    """A :class:`ReplayPickledEnv` playing game files on an engine behind an :class:`EngineHost` (module docstring).

    Attributes:
        load_method: the engine's method that loads a game file (``engine.<load_method>(path)``).
    """

    load_method = "load"

    def _start_host(self, factory: Callable[[], Any], step_timeout: float | None, reset_timeout: float,
                    name: str) -> None:
        """Create the engine host (call from ``__init__``): ``step_timeout`` per step, ``reset_timeout`` per
        load/reset (None: the engine is called directly, without a timeout)."""
        self._host = EngineHost(factory, step_timeout, name=name)
        self._reset_timeout = reset_timeout
        self._loaded: Path | None = None
        self._game: Path | None = None
        self._state: Any = None

    def game_path(self, index: int) -> Path:  # pragma: no cover - every subclass overrides
        raise TypeError(f"{type(self).__name__} must implement game_path()")

    def _first_transition(self, state: dict[str, Any]) -> Transition:
        """The first transition of an episode from the engine's state after reset."""
        return Transition(state["feedback"])

    def _step_transition(self, state: dict[str, Any]) -> Transition:  # pragma: no cover - every subclass overrides
        """The transition of a step from the engine's new state."""
        raise TypeError(f"{type(self).__name__} must implement _step_transition()")

    def _load_and_reset(self, game: Path) -> dict[str, Any]:
        if self._loaded != game:
            self._host.call(self.load_method, game, timeout=self._reset_timeout)
            self._loaded = game
        return self._host.call("reset", timeout=self._reset_timeout)

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        index = self._select_index(options)
        game = self.game_path(index)
        try:
            self._state = self._load_and_reset(game)
        except EngineError:  # one retry on a fresh engine process, then the error reaches the caller
            self._loaded = None
            self._state = self._load_and_reset(game)
        self._index, self._game, self._history = index, game, []
        return self._first_transition(self._state)

    def _apply(self, action: str) -> Transition:
        try:
            self._state = self._host.call("step", action)
        except EngineError as e:  # the engine process was killed or died: a fresh one starts at reset
            self._loaded = None
            return timeout_transition(e)
        return self._step_transition(self._state)

    def close(self) -> None:
        self._host.close()
        self._loaded = None
        super().close()
