"""Workers that fail: engine step timeouts (ALFWorld/TextWorld) and RobustAsyncVectorEnv (issue 15, Vector envs)."""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from echorl_envs.core import EngineError, EngineHost, EngineProcess, EngineTimeout
from echorl_envs.core.engine_calls import ENGINE_LOCK
from echorl_envs.wrappers import RobustAsyncVectorEnv


# ------------------------------------------------------------------------------------------------ EngineProcess
class _Counter:
    """A stand-in engine for the host's own mechanics (the real engines are tested below)."""

    def __init__(self) -> None:
        self.n = 0

    def step(self, k: int) -> int:
        self.n += k
        return self.n


def _sleep_forever(*args):
    time.sleep(3600)


def _die(*args):
    os.kill(os.getpid(), signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_engine_process_calls_kills_hung_and_dead_engines():
    host = EngineProcess(_Counter, timeout=5.0)
    try:
        assert host.call("step", 2) == 2 and host.call("step", 3) == 5 and host.pid != os.getpid()
        with pytest.raises(TypeError):
            host.call("step", "x")  # the engine's own exception comes back
        first = host.pid
        host.call("__setattr__", "step", _sleep_forever)
        t0 = time.monotonic()
        with pytest.raises(EngineTimeout, match="did not return within 0.5 s; its process was killed"):
            host.call("step", 1, timeout=0.5)
        assert time.monotonic() - t0 < 4.0 and _gone(first) and host.num_killed == 1
        assert host.call("step", 4) == 4  # a fresh engine in a fresh process
        second = host.pid
        host.call("__setattr__", "step", _die)
        with pytest.raises(EngineError, match="died during step"):
            host.call("step", 1)
        assert _gone(second)
    finally:
        host.close()
    assert host.pid is None
    local = EngineProcess(_Counter, timeout=None)
    assert local.call("step", 7) == 7 and local.pid is None
    with pytest.raises(ValueError, match="step_timeout"):
        EngineProcess(_Counter, timeout=0)


def test_engine_host_abandons_a_hung_thread_call_and_moves_the_engine_to_a_child_process():
    host = EngineHost(_Counter, timeout=5.0)
    gate = threading.Event()
    try:
        assert host.call("step", 2) == 2 and host.process is None  # in this process, on the worker thread
        host._engine.step = lambda k: gate.wait()
        with pytest.raises(EngineTimeout, match="did not return within 0.3 s and was abandoned"):
            host.call("step", 1, timeout=0.3)
        assert host.num_abandoned == 1 and host.process is not None
        assert not ENGINE_LOCK.acquire(timeout=0.1)  # the hung call still holds the engine lock ...
        assert host.call("step", 5) == 5 and host.process.pid not in (None, os.getpid())  # ... a child serves
    finally:
        gate.set()
        host.close()
    assert ENGINE_LOCK.acquire(timeout=5.0)  # released once the abandoned call returned
    ENGINE_LOCK.release()
    assert EngineHost(_Counter, timeout=None).call("step", 3) == 3


def _plays_normally(env, steps: int = 3) -> bool:
    """After a reset, expert steps run on the (new) engine without errors or truncation."""
    env._host.timeout = 120.0  # a short timeout served the hung call; a loaded CI machine needs more per step
    _, info = env.reset(options={"index": 0})
    for _ in range(steps):
        obs, _, _, trunc, info = env.step(info["expert_action"])
        if trunc or "error" in info or info["invalid_action"] or not obs:
            return False
    return True


def test_hung_textworld_step_is_truncated_with_the_error_in_info():
    from echorl_envs.textworld import TextWorldEnv

    env = TextWorldEnv(challenge="tw-coin_collector", difficulty="medium", num_games=1, step_timeout=1.0)
    gate = threading.Event()
    try:
        _, info = env.reset(options={"index": 0})
        real = env._host._engine.step
        env._host._engine.step = lambda action: (gate.wait(), real(action))[1]
        obs, r, term, trunc, info = env.step(info["expert_action"])
        assert trunc and not term and r == 0.0 and "did not return within 1.0 s" in info["error"]
        assert env._host.process is not None  # the next reset starts the engine in a child process
    finally:
        gate.set()
        env.close()


@pytest.mark.slow  # the recovery plays in a child-process engine: minutes on a loaded 2-core machine
@pytest.mark.parametrize("family", ["alfworld", "textworld"])
def test_hung_engine_step_truncates_and_env_recovers(family):
    if family == "alfworld":
        from echorl_envs.alfworld import ALFWorldEnv

        env = ALFWorldEnv(task_types="PickAndPlace", num_games=1, step_timeout=2.0)
    else:
        from echorl_envs.textworld import TextWorldEnv

        env = TextWorldEnv(challenge="tw-coin_collector", difficulty="medium", num_games=1, step_timeout=2.0)
    gate = threading.Event()
    try:
        _, info = env.reset(options={"index": 0})
        hung = env._host._engine
        real = hung.step
        hung.step = lambda action: (gate.wait(), real(action))[1]  # the real engine's next step hangs
        t0 = time.monotonic()
        obs, r, term, trunc, info = env.step(info["expert_action"])
        assert time.monotonic() - t0 < 10.0
        assert trunc and not term and r == 0.0 and "did not return within 2.0 s" in info["error"]
        assert "truncated" in obs and info["task_id"] and info["admissible_actions"] == []
        _, _, _, _, info = env.step("look")
        assert info["invalid_action"] and "error" not in info  # the episode is over until reset
        assert _plays_normally(env)  # a fresh engine, in a child process, while the hung call still blocks
        child = env._host.process.pid
        assert child not in (None, os.getpid())
        env._host.process.call("__setattr__", "step", _sleep_forever)  # a hang in the child: killed this time
        env._host.timeout = 2.0
        _, _, _, trunc, info = env.step("look")
        assert trunc and "its process was killed" in info["error"] and _gone(child)
        assert _plays_normally(env) and env._host.process.pid != child
        child = env._host.process.pid
    finally:
        gate.set()
        env.close()
    assert _gone(child)


# ------------------------------------------------------------------------------------------------ vector env
class _SlowCartPole(gym.Wrapper):
    """CartPole whose step takes ``delay`` s (time to kill a worker mid-step, or a hang)."""

    def __init__(self, delay: float = 0.2) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)


def _slow_cartpole():
    return _SlowCartPole()


def _boom_cartpole():
    class Boom(_SlowCartPole):
        def step(self, action):
            raise RuntimeError("engine exploded")

    return Boom(0.0)


@pytest.mark.parametrize("shared_memory", [False, True])
def test_sigkilled_worker_is_restarted_and_its_episode_truncated(shared_memory):
    venv = RobustAsyncVectorEnv([_slow_cartpole] * 2, shared_memory=shared_memory)
    try:
        obs0, _ = venv.reset(seed=0)
        venv.step_async(np.array([0, 1]))
        time.sleep(0.05)  # both workers are inside their 0.2 s step
        victim = venv.processes[1].pid
        os.kill(victim, signal.SIGKILL)
        obs, r, term, trunc, info = venv.step_wait()
        assert list(trunc) == [False, True] and r[1] == 0.0 and not term[1]
        assert "worker 1 died (exit code -9)" in info["error"][1] and list(info["_error"]) == [False, True]
        np.testing.assert_array_equal(obs[1], obs0[1])  # the last observation it returned
        assert venv.processes[1].pid != victim and venv.num_restarts == [0, 1]
        obs, r, term, trunc, info = venv.step(np.array([0, 1]))  # env 1: its autoreset step
        assert r[1] == 0.0 and not trunc.any() and "error" not in info
        for _ in range(3):
            _, r, _, _, _ = venv.step(np.array([1, 1]))
            assert (r == 1.0).all()
    finally:
        t0 = time.monotonic()
        venv.close()
        assert time.monotonic() - t0 < 5.0


def test_hung_worker_is_killed_after_step_timeout_and_close_is_bounded():
    venv = RobustAsyncVectorEnv([_slow_cartpole] * 2, step_timeout=1.5, close_timeout=2.0)
    try:
        venv.reset(seed=0)
        venv.set_attr("delay", [3600.0, 0.0])  # worker 0's next step hangs
        hung = venv.processes[0].pid
        t0 = time.monotonic()
        _, _, _, trunc, info = venv.step(np.array([0, 0]))
        assert 1.0 < time.monotonic() - t0 < 6.0
        assert list(trunc) == [True, False] and "did not answer within step_timeout=1.5" in info["error"][0]
        assert venv.processes[0].pid != hung and venv.num_restarts == [1, 0]
        _, _, _, trunc, _ = venv.step(np.array([0, 0]))  # the fresh worker's env has the default delay
        assert not trunc.any()
        # without a step timeout a hung step waits, but close() still returns within close_timeout
        venv.step_timeout = None
        venv.set_attr("delay", [0.0, 3600.0])
        venv.step_async(np.array([0, 0]))
        time.sleep(0.3)
    finally:
        t0 = time.monotonic()
        venv.close()
        assert time.monotonic() - t0 < 5.0
    assert not any(p.is_alive() for p in venv.processes)


def test_env_exception_restarts_the_worker_with_the_error_in_info():
    venv = RobustAsyncVectorEnv([_slow_cartpole, _boom_cartpole], shared_memory=False)
    try:
        venv.reset(seed=0)
        _, _, _, trunc, info = venv.step(np.array([0, 0]))
        assert list(trunc) == [False, True] and "raised RuntimeError: engine exploded" in info["error"][1]
        _, r, _, trunc, _ = venv.step(np.array([0, 0]))  # autoreset step of the restarted worker
        assert not trunc.any() and r[1] == 0.0
    finally:
        venv.close()


def test_text_env_worker_killed_between_steps_is_replaced():
    import echorl_envs  # noqa: F401  (registers the ids)

    venv = RobustAsyncVectorEnv([lambda: gym.make("EchoRL/MiniGrid-Empty-5x5-v0")] * 2, shared_memory=False)
    try:
        obs0, info = venv.reset(seed=0)
        os.kill(venv.processes[0].pid, signal.SIGKILL)
        venv.processes[0].join(5)
        obs, r, term, trunc, info = venv.step(("turn left", "turn left"))
        assert list(trunc) == [True, False] and "worker 0 died (exit code -9)" in info["error"][0]
        assert obs[0] == obs0[0] and isinstance(obs[1], str) and obs[1] != ""
        obs, r, term, trunc, info = venv.step(("turn left", "turn left"))  # env 0 autoresets in the new worker
        assert not trunc.any() and not info["invalid_action"].any() and "error" not in info
        assert obs[0].startswith(obs0[0][:20])
    finally:
        venv.close()


@pytest.mark.slow
def test_soak_harness_counts_steps_and_resources():
    import importlib.util

    pytest.importorskip("psutil")
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("soak", Path(__file__).parents[1] / "benchmarks" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    r = soak.soak_one("EchoRL/Arithmetic-v0", 1.0, seed=0)
    assert r["steps"]["random"] > 0 and r["steps"]["expert"] > 0 and r["errors"] == {}
    assert r["wins"]["expert"] == r["episodes"]["expert"] or r["wins"]["expert"] == r["episodes"]["expert"] - 1
    assert r["start"]["fds"] > 0 and r["end"]["rss_mb"] > 0


def _textworld_with_engine_process() -> gym.Env:
    """A TextWorld env whose engine already runs in a child process, as after an abandoned (hung) call; engines
    start in-process on a thread, so a fresh worker has no engine process of its own."""
    env = gym.make("EchoRL/TextWorld-CoinCollector-v0", num_games=1)
    host = env.unwrapped._host
    host.process = EngineProcess(host.factory, host.timeout, host.name)
    return env


@pytest.mark.slow
def test_engine_process_does_not_outlive_a_killed_vector_worker():
    psutil = pytest.importorskip("psutil")
    import echorl_envs  # noqa: F401  (registers the ids)

    venv = RobustAsyncVectorEnv([_textworld_with_engine_process] * 2, shared_memory=False)
    try:
        _, infos = venv.reset(seed=[0, 1])
        worker = psutil.Process(venv.processes[0].pid)
        engines = worker.children()
        assert len(engines) == 1  # the worker's TextWorld engine process
        worker.kill()
        _, _, _, trunc, info = venv.step(tuple(a[0] for a in infos["admissible_actions"]))
        assert trunc[0] and "died" in info["error"][0]
        gone, alive = psutil.wait_procs(engines, timeout=10)
        assert not alive, "the engine process outlived its killed worker"
    finally:
        venv.close()
