"""An ``AsyncVectorEnv`` that survives its workers: a dead, crashed or hung worker is restarted, never fatal.

Gymnasium's ``AsyncVectorEnv`` raises ``ConnectionResetError``/``EOFError`` when a worker process dies during a
step, shuts the worker down when its env raises, and then ``close()`` can wait forever on the dead pipe.
:class:`RobustAsyncVectorEnv` keeps gymnasium's protocol and worker function and changes what happens on failure.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import NoAsyncCallError
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from gymnasium.vector import async_vector_env as _gym_async
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import concatenate, iterate

from echorl_envs.core.lifeline import parent_watch_args, watch_parent

__all__ = ["RobustAsyncVectorEnv"]

log = logging.getLogger(__name__)

_PIPE_ERRORS = (EOFError, ConnectionResetError, BrokenPipeError, OSError)
_INIT_LOCK = threading.Lock()


class _RecordingContext:
    """A multiprocessing context that remembers the ``Process`` arguments gymnasium starts each worker with."""

    def __init__(self, ctx: Any, sink: list[dict[str, Any]]) -> None:
        self._ctx, self._sink = ctx, sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def Process(self, **kwargs: Any) -> Any:  # noqa: N802 - the multiprocessing name
        self._sink.append(dict(kwargs))
        return self._ctx.Process(**{**kwargs, "target": _watched(kwargs["target"])})


def _watched(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` run in a worker that dies with this process (:func:`~echorl_envs.core.lifeline.watch_parent`)."""
    return functools.partial(_run_watched, target, *parent_watch_args())


def _run_watched(target: Callable[..., Any], parent: int, from_main_thread: bool, *args: Any) -> Any:
    watch_parent(parent, from_main_thread)
    return target(*args)


class _RecordingMultiprocessing:
    """Stands in for the ``multiprocessing`` module inside gymnasium's ``async_vector_env`` during construction.

    Python deletes a started ``Process``'s target and arguments, but restarting a worker needs exactly those
    (gymnasium's worker function, the env factory, the shared-memory buffer, the error queue, ...).
    """

    def __init__(self, sink: list[dict[str, Any]]) -> None:
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)

    def get_context(self, method: str | None = None) -> _RecordingContext:
        return _RecordingContext(multiprocessing.get_context(method), self._sink)


class RobustAsyncVectorEnv(AsyncVectorEnv):
    """``gymnasium.vector.AsyncVectorEnv`` that restarts dead workers and whose ``close()`` is bounded in time.

    * A worker that dies during a step (killed, segfault, out of memory), whose env raises, or that does not
      answer within ``step_timeout`` seconds (it is then killed) is replaced by a fresh worker process built from
      the same ``env_fn``. Its sub-env's step comes back ``truncated=True`` with reward 0, the last observation it
      returned, and ``info["error"]`` saying what happened (``info["_error"]`` masks which sub-envs failed).
      With gymnasium's default ``autoreset_mode=NEXT_STEP`` its next ``step`` is the reset step (the action is
      ignored), exactly as after any truncation; with ``DISABLED`` call ``reset`` for it yourself.
    * A worker that fails during ``reset`` is restarted and the reset retried once.
    * ``close()`` asks workers to close, waits at most ``close_timeout`` seconds in total, then kills stragglers.
    * Workers die with this process, even when it is killed by SIGKILL (:mod:`echorl_envs.core.lifeline`).

    Args:
        env_fns: functions creating the sub-envs (as for ``AsyncVectorEnv``).
        step_timeout: seconds a ``step``/``reset`` may take per call before unresponsive workers are killed and
            restarted; None waits as long as the workers live (a death is still noticed within ~0.25 s).
        close_timeout: upper bound in seconds of ``close()``.
        **kwargs: passed to ``AsyncVectorEnv`` (``shared_memory``, ``copy``, ``context``, ``daemon``,
            ``autoreset_mode`` -- ``SAME_STEP`` is not supported --, ...).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        step_timeout: float | None = None,
        close_timeout: float = 5.0,
        **kwargs: Any,
    ) -> None:
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be a positive number of seconds or None, got {step_timeout!r}")
        if not close_timeout > 0:
            raise ValueError(f"close_timeout must be a positive number of seconds, got close_timeout={close_timeout!r}")
        mode = AutoresetMode(kwargs.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        if mode == AutoresetMode.SAME_STEP:
            raise ValueError("RobustAsyncVectorEnv supports autoreset_mode NEXT_STEP (default) or DISABLED, got "
                             "SAME_STEP: a restarted worker has no final observation to report")
        self.step_timeout, self.close_timeout = step_timeout, close_timeout
        self._ctx = multiprocessing.get_context(kwargs.get("context"))
        self._needs_reset: set[int] = set()  # restarted workers whose next step is the autoreset
        self._resetting: set[int] = set()
        self._send_failed: dict[int, str] = {}
        self._reset_kwargs: list[dict[str, Any] | None] = []
        self.num_restarts = [0] * len(env_fns)
        self._worker_specs: list[dict[str, Any]] = []
        with _INIT_LOCK:  # a module global is swapped while gymnasium starts the workers
            _gym_async.multiprocessing = _RecordingMultiprocessing(self._worker_specs)
            try:
                super().__init__(env_fns, **kwargs)
            finally:
                _gym_async.multiprocessing = multiprocessing
        self._last_obs: list[Any] = [None] * self.num_envs

    # ------------------------------------------------------------------ worker management
    def _restart(self, i: int, why: str) -> None:
        """Replace worker ``i`` by a fresh process running gymnasium's worker with the same arguments."""
        old = self.processes[i]
        if old.is_alive():
            old.kill()
        old.join(timeout=self.close_timeout)
        pipe = self.parent_pipes[i]
        if pipe is not None:
            pipe.close()
        parent_pipe, child_pipe = self._ctx.Pipe()
        spec = self._worker_specs[i]
        args = list(spec["args"])  # (index, env_fn, child pipe, parent pipe, shared memory, error queue, mode, sem)
        args[2], args[3] = child_pipe, parent_pipe
        proc = self._ctx.Process(target=_watched(spec["target"]), name=spec["name"], args=tuple(args))
        proc.daemon = old.daemon
        proc.start()
        child_pipe.close()
        self.parent_pipes[i], self.processes[i] = parent_pipe, proc
        self.num_restarts[i] += 1
        log.warning("RobustAsyncVectorEnv: worker %d %s; restarted it (restart #%d)", i, why, self.num_restarts[i])

    def _receive(self, i: int, deadline: float | None) -> tuple[Any, str | None]:
        """Worker ``i``'s reply, or (None, reason) if it died, crashed or missed the deadline."""
        if i in self._send_failed:
            return None, self._send_failed.pop(i)
        pipe, proc = self.parent_pipes[i], self.processes[i]
        try:
            while True:
                wait = 0.25 if deadline is None else min(0.25, max(0.0, deadline - time.perf_counter()))
                if pipe.poll(wait):
                    reply = pipe.recv()
                    break
                if not proc.is_alive() and not pipe.poll(0):
                    return None, f"died (exit code {proc.exitcode})"
                if deadline is not None and time.perf_counter() >= deadline:
                    return None, f"did not answer within step_timeout={self.step_timeout} s"
        except _PIPE_ERRORS:
            proc.join(timeout=1.0)
            return None, f"died (exit code {proc.exitcode})"
        if not reply[1]:  # the env raised: gymnasium's worker reported it on the error queue and exited
            return None, f"raised {self._worker_error(i)}"
        return reply[0], None

    def _worker_error(self, i: int) -> str:
        try:
            while True:
                index, exctype, value, _trace = self.error_queue.get(timeout=1.0)
                if index == i:
                    return f"{exctype.__name__}: {value}"
        except queue.Empty:
            return "an exception"

    def _send(self, i: int, message: tuple[str, Any]) -> None:
        if not self.processes[i].is_alive():
            self._send_failed[i] = f"died (exit code {self.processes[i].exitcode}) between calls"
            return
        try:
            self.parent_pipes[i].send(message)
        except _PIPE_ERRORS:
            self._send_failed[i] = "died (its pipe is closed)"

    def _deadline(self, timeout: float | None) -> float | None:
        limit = self.step_timeout if timeout is None else timeout
        return None if limit is None else time.perf_counter() + limit

    # ------------------------------------------------------------------ reset
    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        self._assert_is_running()
        seeds = [None] * self.num_envs if seed is None else (
            [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
        options = dict(options) if options is not None else None
        mask = options.get("reset_mask") if options is not None else None
        for i in range(self.num_envs):  # a worker that died while idle is replaced before the reset
            if not self.processes[i].is_alive():
                self._restart(i, f"died (exit code {self.processes[i].exitcode}) while idle")
        super().reset_async(seed=seeds, options=options)
        rest = {k: v for k, v in (options or {}).items() if k != "reset_mask"} or None
        self._reset_kwargs = [{"seed": s, "options": rest} if mask is None or mask[i] else None
                              for i, s in enumerate(seeds)]
        for i, kw in enumerate(self._reset_kwargs):
            if kw is not None:
                self._needs_reset.discard(i)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        self._assert_is_running()
        if self._state != AsyncState.WAITING_RESET:
            raise NoAsyncCallError("Calling `reset_wait` without any prior call to `reset_async`.",
                                   AsyncState.WAITING_RESET.value)
        deadline = self._deadline(timeout)
        results = []
        for i in range(self.num_envs):
            reply, why = self._receive(i, deadline)
            if reply is None:
                self._restart(i, f"{why} during reset")
                self._send(i, ("reset", self._reset_kwargs[i] or {"seed": None, "options": None}))
                reply, why = self._receive(i, self._deadline(timeout))
                if reply is None:
                    self._state = AsyncState.DEFAULT
                    raise RuntimeError(f"worker {i} failed twice during reset: {why}")
            results.append(reply)
        self._state = AsyncState.DEFAULT
        infos: dict[str, Any] = {}
        for i, (_obs, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        if not self.shared_memory:
            self._last_obs = [obs for obs, _ in results]
            self.observations = concatenate(self.single_observation_space, self._last_obs, self.observations)
        return (deepcopy(self.observations) if self.copy else self.observations), infos

    # ------------------------------------------------------------------ step
    def step_async(self, actions: Any) -> None:
        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            super().step_async(actions)  # raises gymnasium's AlreadyPendingCallError
        self._resetting = set(self._needs_reset)
        self._needs_reset.clear()
        for i, action in enumerate(iterate(self.action_space, actions)):
            if i in self._resetting:
                self._send(i, ("reset", {"seed": None, "options": None}))
            else:
                self._send(i, ("step", action))
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._assert_is_running()
        if self._state != AsyncState.WAITING_STEP:
            raise NoAsyncCallError("Calling `step_wait` without any prior call to `step_async`.",
                                   AsyncState.WAITING_STEP.value)
        deadline = self._deadline(timeout)
        obs, rewards, terms, truncs, infos = [], [], [], [], {}
        for i in range(self.num_envs):
            reply, why = self._receive(i, deadline)
            if reply is None:
                self._restart(i, f"{why} during step")
                if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                    self._needs_reset.add(i)
                step = (self._last_obs[i], 0.0, False, True,
                        {"error": f"worker {i} {why}; it was restarted and this episode truncated"})
            elif i in self._resetting:  # the autoreset step of a restarted worker
                step = (reply[0], 0.0, False, False, reply[1])
            else:
                step = reply
            obs.append(step[0])
            rewards.append(step[1])
            terms.append(step[2])
            truncs.append(step[3])
            infos = self._add_info(infos, step[4], i)
        self._resetting = set()
        self._state = AsyncState.DEFAULT
        if not self.shared_memory:
            self._last_obs = obs
            self.observations = concatenate(self.single_observation_space, obs, self.observations)
        return (deepcopy(self.observations) if self.copy else self.observations, np.array(rewards, dtype=np.float64),
                np.array(terms, dtype=np.bool_), np.array(truncs, dtype=np.bool_), infos)

    # ------------------------------------------------------------------ close
    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Ask every worker to close, wait at most ``close_timeout`` (or ``timeout``) seconds, kill the rest."""
        budget = 0.0 if terminate else (self.close_timeout if timeout is None else timeout)
        deadline = time.perf_counter() + budget
        live = []
        for pipe, proc in zip(self.parent_pipes, self.processes, strict=True):
            if pipe is None or pipe.closed or not proc.is_alive() or terminate:
                continue
            try:
                pipe.send(("close", None))
                live.append(proc)
            except _PIPE_ERRORS:
                pass
        for proc in live:  # the worker closes its env and exits; pending replies are simply dropped
            proc.join(timeout=max(0.0, deadline - time.perf_counter()))
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=1.0)
        for pipe in self.parent_pipes:
            if pipe is not None:
                pipe.close()
        self._state = AsyncState.DEFAULT
