"""Per-call timeouts for engine-backed envs (ALFWorld's PDDL engine, TextWorld's Jericho): a hung call is abandoned.

An engine call runs on one long-lived daemon worker thread and the env waits for it at most ``timeout`` seconds.
When the call does not return in time the worker (and the engine object it is using) is abandoned: the env drops
its engine, ends the episode as truncated with ``info["error"]`` and builds a fresh engine at the next ``reset``.
The hand-off costs a few tens of microseconds per call, against milliseconds per engine step.

Limits, stated plainly: an abandoned thread cannot be killed; it finishes (or hangs) in the background holding
its engine's memory, and a native call that never releases the GIL would stall the whole process. For those, run
the env in :class:`echorl_envs.wrappers.RobustAsyncVectorEnv` with ``step_timeout``: it kills and restarts a
worker process that does not answer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["EngineTimeout", "EngineCaller"]

T = TypeVar("T")


class EngineTimeout(RuntimeError):
    """An engine call did not return within the env's ``step_timeout``."""


class _Job:
    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job.result = job.fn(*job.args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            job.error = e
        job.done.set()


class EngineCaller:
    """Runs engine calls on a worker thread and gives up on a call after ``timeout`` seconds.

    Args:
        timeout: seconds to wait for one call; None calls directly in the caller's thread (no timeout, no cost,
            also for calls that pass their own ``timeout``).
        name: thread name (shows up in stack dumps of a hung engine).
    """

    def __init__(self, timeout: float | None, name: str = "echorl-engine") -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"step_timeout must be a positive number of seconds or None, got step_timeout={timeout!r}")
        self.timeout = timeout
        self.name = name
        self._jobs: queue.SimpleQueue | None = None
        self.num_abandoned = 0

    def __call__(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """``fn(*args)`` within ``timeout`` (default: the caller's); raises :class:`EngineTimeout` (the worker is
        then abandoned)."""
        limit = self.timeout if timeout is None else timeout
        if self.timeout is None:
            return fn(*args)
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._jobs,), name=self.name, daemon=True).start()
        job = _Job(fn, args)
        self._jobs.put(job)
        if not job.done.wait(limit):
            self._jobs = None  # the hung worker keeps its queue; the next call starts a fresh worker
            self.num_abandoned += 1
            raise EngineTimeout(f"the engine call {getattr(fn, '__qualname__', fn)!s} did not return within "
                                f"{'step_timeout' if limit == self.timeout else 'reset_timeout'}={limit} s and was abandoned")
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """Stop the worker thread (after the call it is running, if any)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def timeout_transition(error: EngineTimeout) -> Any:
    """The step result of a timed-out engine call: the episode ends truncated, ``info["error"]`` says why."""
    from echorl_envs.core.base import Transition

    return Transition(
        f"The game engine did not respond in time ({error}). The episode was truncated; call reset() to start "
        "a new one.",
        truncated=True, info={"error": str(error)},
    )
