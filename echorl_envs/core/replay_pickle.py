"""Pickling by replay, for envs whose engine holds unpicklable native state (Fast Downward, Jericho, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_envs.core.base import DatasetTextEnv

__all__ = ["ReplayPickledEnv"]


class ReplayPickledEnv(DatasetTextEnv):
    """A :class:`DatasetTextEnv` pickled as (constructor kwargs, episode index, actions so far, RNG state).

    Unpickling rebuilds the env from ``self._ctor``, replays ``reset(options={"index": ...})`` and every action,
    then restores the RNG, which is exact for deterministic engines. Subclasses set ``self._ctor`` (their
    constructor's keyword arguments) and ``self._index`` (the item of the current episode), and empty
    ``self._history`` when an episode starts.
    """

    _ctor: dict[str, Any]
    _index: int
    _history: list[Any]

    def step(self, action: str):
        out = super().step(action)
        self._history.append(action)
        return out

    def __getstate__(self) -> dict[str, Any]:
        rng = self._np_random.bit_generator.state if self._np_random is not None else None
        return {"ctor": self._ctor, "index": self._index if self._started else None,
                "history": list(getattr(self, "_history", [])), "rng": rng}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["ctor"])  # type: ignore[misc]
        if state["index"] is not None:
            self.reset(options={"index": state["index"]})
            for a in state["history"]:
                self.step(a)
        if state["rng"] is not None:
            self._np_random = np.random.Generator(np.random.PCG64())
            self._np_random.bit_generator.state = state["rng"]
