"""Engine calls with a timeout for engine-backed envs (ALFWorld's PDDL engine, TextWorld's Jericho).

:class:`EngineHost` (what the envs use) runs the engine in this process, on a worker thread, and waits for each
call at most ``timeout`` seconds -- a thread hand-off costs microseconds, so the timeout is nearly free. When a
call times out (or the engine process dies), the env ends the episode truncated with ``info["error"]``, and the
hung call is abandoned for real: from then on this env's engine runs in its own child process
(:class:`EngineProcess`), which is killed whenever a call exceeds the timeout. Two guards make the abandoned
thread harmless: every in-process engine call holds one process-wide lock (textworld's module-level parser is
not thread-safe; a resumed abandoned call corrupted later games in our tests before the lock), and the env never
reads the abandoned call's result. Why not always a child process: a pipe round trip needs the other process
scheduled, which on a loaded machine cost 30x the in-process step time (TextWorld) in our measurements.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from echorl_envs.core.lifeline import parent_watch_args, watch_parent

__all__ = ["EngineError", "EngineTimeout", "EngineHost", "EngineProcess", "timeout_transition"]

#: Held by every in-process engine call (see the module docstring); an abandoned call keeps it until it returns.
ENGINE_LOCK = threading.RLock()


class EngineError(RuntimeError):
    """The engine process died or did not answer; the engine is gone (a fresh one starts at the next reset)."""


class EngineTimeout(EngineError):
    """An engine call did not return within its timeout."""


def _serve(factory: Callable[[], Any], conn: Any, other_end: Any, parent: int) -> None:
    """Child process: build the engine, then answer ``(method, args)`` calls until told to stop."""
    other_end.close()
    engine = None
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent:  # the env's process died: do not outlive it
                return
            continue
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            break
        method, args = msg
        try:
            if engine is None:
                engine = factory()
            reply = ("ok", getattr(engine, method)(*args))
        except Exception as e:  # noqa: BLE001 - re-raised in the env's process
            reply = ("err", e)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # an unpicklable result or exception
            conn.send(("err", RuntimeError(f"engine {method} returned something unpicklable: {e!r}")))
    if engine is not None and hasattr(engine, "close"):
        engine.close()


class EngineProcess:
    """One engine object in a child process, built lazily by ``factory``; method calls with a timeout.

    Args:
        factory: builds the engine (called in the child; with the ``fork`` start method a closure is fine).
        timeout: default seconds per call; None keeps the engine in this process (no timeout, no overhead).
        name: a label for the engine (kept for messages).
    """

    def __init__(self, factory: Callable[[], Any], timeout: float | None, name: str = "echorl-engine") -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"step_timeout must be a positive number of seconds or None, got step_timeout={timeout!r}")
        self.factory, self.timeout, self.name = factory, timeout, name
        self._local: Any = None
        self._pid: int | None = None
        self._conn: Any = None
        self._exitcode: int | None = None
        self.num_killed = 0

    @property
    def pid(self) -> int | None:
        """The engine process's pid (None before the first call or in-process)."""
        return self._pid

    def _start(self) -> None:
        # A bare fork rather than multiprocessing.Process: envs often live in AsyncVectorEnv/SubprocVecEnv
        # workers, which are daemonic, and multiprocessing forbids daemonic processes to have children.
        ours, theirs = multiprocessing.Pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent, from_main_thread = parent_watch_args()
        pid = os.fork()
        if pid == 0:  # the engine process
            code = 0
            try:
                watch_parent(parent, from_main_thread)  # killed with the env's process, even mid-call
                _serve(self.factory, theirs, ours, parent)
            except BaseException:  # noqa: BLE001 - nothing may escape into the forked copy of the caller
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self._pid, self._conn = pid, ours

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``engine.method(*args)`` within ``timeout`` (default: this host's); the engine's exceptions propagate.

        Raises:
            EngineTimeout: no answer in time (the engine process was killed).
            EngineError: the engine process died during the call.
        """
        if self.timeout is None:
            if self._local is None:
                self._local = self.factory()
            return getattr(self._local, method)(*args)
        limit = self.timeout if timeout is None else timeout
        if self._pid is None:
            self._start()
        try:
            self._conn.send((method, args))
            ready = self._conn.poll(limit)
            status, value = self._conn.recv() if ready else (None, None)
        except (EOFError, OSError):
            self._kill()
            raise EngineError(f"the engine process died during {method} (exit code {self._exitcode})") from None
        if status is None:
            self._kill()
            raise EngineTimeout(f"the engine call {method} did not return within {limit} s; its process was killed")
        if status == "err":
            raise value
        return value

    def _reap(self, wait: float) -> bool:
        """Collect the engine process's exit status within ``wait`` seconds; True once it is gone."""
        deadline = time.monotonic() + wait
        while True:
            try:
                done, status = os.waitpid(self._pid, os.WNOHANG)
            except ChildProcessError:  # already collected elsewhere
                return True
            if done:
                self._exitcode = os.waitstatus_to_exitcode(status)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _kill(self) -> None:
        if self._pid is not None:
            if not self._reap(0.0):
                os.kill(self._pid, signal.SIGKILL)
                self.num_killed += 1
                self._reap(5.0)
            self._pid = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Stop the engine (it closes itself in its process); kill it if it does not exit within 5 s."""
        if self._local is not None:
            if hasattr(self._local, "close"):
                self._local.close()
            self._local = None
        if self._pid is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._reap(5.0) or self._kill()
            self._pid = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __del__(self) -> None:
        if getattr(self, "_pid", None) is not None:
            try:
                self._kill()
            except OSError:
                pass


class _Job:
    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _thread_serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            with ENGINE_LOCK:
                job.result = job.fn(*job.args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            job.error = e
        job.done.set()


class EngineHost:
    """The engine of one env: in-process on a worker thread until a call hangs, then in a child process.

    Args:
        factory: builds the engine (in this process, or in the child after an abandoned call).
        timeout: default seconds per call; None calls the engine directly (no timeout, no overhead).
        name: worker thread name.
    """

    def __init__(self, factory: Callable[[], Any], timeout: float | None, name: str = "echorl-engine") -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"step_timeout must be a positive number of seconds or None, got step_timeout={timeout!r}")
        self.factory, self.timeout, self.name = factory, timeout, name
        self._engine: Any = None
        self._jobs: queue.SimpleQueue | None = None
        self.process: EngineProcess | None = None  # set once a call was abandoned
        self.num_abandoned = 0

    def _call_engine(self, method: str, args: tuple[Any, ...]) -> Any:
        if self._engine is None:
            self._engine = self.factory()
        return getattr(self._engine, method)(*args)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``engine.method(*args)`` within ``timeout`` (default: the host's); the engine's exceptions propagate.

        Raises:
            EngineTimeout: no answer in time (the call is abandoned; the next call starts a fresh engine in a
                child process).
            EngineError: the engine's child process died during the call.
        """
        if self.timeout is None:
            return self._call_engine(method, args)
        limit = self.timeout if timeout is None else timeout
        if self.process is not None:
            return self.process.call(method, *args, timeout=limit)
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_thread_serve, args=(self._jobs,), name=self.name, daemon=True).start()
        job = _Job(self._call_engine, (method, args))
        self._jobs.put(job)
        if not job.done.wait(limit):
            self._jobs, self._engine = None, None  # the hung thread keeps both; we never touch them again
            self.num_abandoned += 1
            self.process = EngineProcess(self.factory, self.timeout, self.name)
            raise EngineTimeout(f"the engine call {method} did not return within {limit} s and was abandoned; "
                                "a fresh engine runs in a child process from the next reset")
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """Close the engine (in the worker thread, within the timeout) and stop the worker / child process."""
        if self.process is not None:
            self.process.close()
        if self._engine is not None:
            try:
                if hasattr(self._engine, "close"):
                    self.call("close", timeout=min(self.timeout or 5.0, 5.0))
            except EngineError:
                pass
            self._engine = None
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def timeout_transition(error: EngineError) -> Any:
    """The step result of a failed engine call: the episode ends truncated, ``info["error"]`` says why."""
    from echorl_envs.core.base import Transition

    return Transition(
        f"The game engine failed ({error}). The episode was truncated; call reset() to start a new one.",
        truncated=True, info={"error": str(error)},
    )
