"""No worker outlives its parent: processes killed by SIGKILL leave no pool worker, vector-env worker or engine
process behind (:mod:`echorl_envs.core.lifeline`).

Each test starts the parent in a subprocess, waits until its workers exist, SIGKILLs the parent (no cleanup runs)
and checks that every descendant is gone within :data:`GONE_WITHIN` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from echorl_envs.core import lifeline

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[1]
#: Seconds the orphans may take to die (the kernel guard is immediate; the polling thread takes <= 0.5 s).
GONE_WITHIN = 10.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def _workers(proc: subprocess.Popen, count: int, timeout: float, marker: str | None = None) -> list:
    """The descendants of ``proc`` once there are ``count`` (and, if given, once it printed ``marker``)."""
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the parent exited early (code {proc.returncode}): {proc.stdout.read()}"
        kids = [k for k in parent.children(recursive=True) if k.status() != psutil.STATUS_ZOMBIE]
        if marker is not None and marker not in seen:
            seen += os.read(proc.stdout.fileno(), 1 << 16).decode() if _readable(proc) else ""
        if len(kids) >= count and (marker is None or marker in seen):
            return kids
        time.sleep(0.2)
    raise AssertionError(f"{count} workers did not start within {timeout} s (output: {seen!r})")


def _readable(proc: subprocess.Popen) -> bool:
    import select

    return bool(select.select([proc.stdout], [], [], 0)[0])


def _alive(procs: list) -> list:
    """Those of ``procs`` still running; a zombie (dead, waiting for init to reap it) counts as gone."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_and_check(proc: subprocess.Popen, workers: list) -> float:
    """SIGKILL ``proc``; assert that all ``workers`` are gone within GONE_WITHIN s; returns how long it took."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    t0 = time.monotonic()
    alive = _alive(workers)
    while alive and time.monotonic() - t0 < GONE_WITHIN:
        time.sleep(0.05)
        alive = _alive(alive)
    took = time.monotonic() - t0
    for p in alive:  # clean up before failing
        p.kill()
    assert not alive, f"{len(alive)} of {len(workers)} workers outlived their SIGKILLed parent: {alive}"
    return took


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=ROOT)


def test_watch_parent_arms_the_kernel_guard_only_from_the_main_thread():
    assert lifeline.parent_watch_args() == (os.getpid(), True)
    box = []
    t = threading.Thread(target=lambda: box.append(lifeline.parent_watch_args()))
    t.start()
    t.join()
    assert box == [(os.getpid(), False)]
    with pytest.raises(ValueError, match="interval must be > 0 seconds, got interval=0"):
        lifeline.watch_parent(os.getppid(), interval=0)


def test_pool_workers_die_with_a_sigkilled_parent():
    """The ``echorl bench`` pool (spawned workers with :func:`watch_parent` as initializer), mid-job."""
    proc = _start("""
        import multiprocessing as mp, time
        from concurrent.futures import ProcessPoolExecutor
        from echorl_envs.core.lifeline import parent_watch_args, watch_parent
        if __name__ == "__main__":
            with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=watch_parent,
                                     initargs=parent_watch_args()) as pool:
                futs = [pool.submit(time.sleep, 600) for _ in range(2)]
                print("started", flush=True)
                time.sleep(600)
    """)
    try:
        workers = _workers(proc, 2, timeout=60, marker="started")
        # the kernel guard fires at once; the polling thread would take up to 0.5 s
        assert _kill_and_check(proc, workers) < 5.0
    finally:
        proc.kill()


def test_without_the_guard_pool_workers_are_orphaned():
    """The control: the same pool without the initializer leaves its workers alive (what the issue saw)."""
    proc = _start("""
        import multiprocessing as mp, time
        from concurrent.futures import ProcessPoolExecutor
        if __name__ == "__main__":
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                pool.submit(time.sleep, 600)
                print("started", flush=True)
                time.sleep(600)
    """)
    try:
        workers = _workers(proc, 1, timeout=60, marker="started")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(2.0)
        assert _alive(workers), "the worker died without the guard: this test no longer shows what the guard does"
    finally:
        proc.kill()
        for w in workers:
            if w.is_running():
                w.kill()


def test_polling_thread_alone_kills_the_orphan():
    """The portable guard (no PR_SET_PDEATHSIG: a child started from a non-main thread, or not Linux)."""
    proc = _start("""
        import os, sys, time
        from echorl_envs.core.lifeline import watch_parent
        pid = os.fork()
        if pid == 0:
            armed = watch_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid(), from_main_thread=False)
            print("child", armed, flush=True)
            while True:  # busy, as a worker in the middle of a job
                sum(range(10000))
        time.sleep(600)
    """)
    try:
        workers = _workers(proc, 1, timeout=30, marker="child False")
        assert _kill_and_check(proc, workers) < 5.0
    finally:
        proc.kill()


def test_vector_env_workers_and_their_engine_processes_die_with_a_sigkilled_parent():
    """RobustAsyncVectorEnv workers (forked, gymnasium's worker function) and, below each, an engine process
    (:class:`~echorl_envs.core.EngineProcess`) in the middle of a call."""
    proc = _start("""
        import time
        import gymnasium as gym
        from echorl_envs.core import EngineProcess
        from echorl_envs.wrappers import RobustAsyncVectorEnv

        class Busy:
            def spin(self):
                while True:
                    sum(range(10000))

        class Spinner(gym.Env):
            observation_space = gym.spaces.Discrete(1)
            action_space = gym.spaces.Discrete(1)

            def __init__(self):
                self.engine = EngineProcess(Busy, timeout=600)

            def reset(self, seed=None, options=None):
                return 0, {}

            def step(self, action):
                return 0, 0.0, False, False, {}

            def spin(self):
                return self.engine.call("spin")

        if __name__ == "__main__":
            venv = RobustAsyncVectorEnv([Spinner] * 2, shared_memory=False)
            venv.reset(seed=0)
            venv.call_async("spin")  # each worker waits on its engine process, which computes
            print("started", flush=True)
            time.sleep(600)
    """)
    try:
        procs = _workers(proc, 4, timeout=60, marker="started")  # 2 workers + 2 engine processes
        assert _kill_and_check(proc, procs) < 5.0
    finally:
        proc.kill()


@pytest.mark.slow
def test_echorl_bench_workers_die_with_a_sigkilled_bench(tmp_path):
    """The issue's case: ``echorl bench`` killed by its caller's timeout (SIGKILL) while its two pool workers play.

    A spawned worker arms its guard in the pool's initializer, after its start-up imports; a worker still starting
    when the parent dies finds another parent in :func:`watch_parent` and dies then. The workers count as ready
    once the guard's thread runs (2 threads).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "echorl_agent.cli", "bench", "--tasks", "EchoRL/MiniGrid-Empty-5x5-v0",
         "--agents", "random", "--seeds", "2", "--episodes", "100000", "--workers", "2", "--quiet",
         "--out", str(tmp_path / "bench")], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both workers started, guards armed
            assert proc.poll() is None, proc.stdout.read().decode()
            workers = [k for k in parent.children() if "spawn_main" in " ".join(k.cmdline())]
            if len(workers) == 2 and all(w.num_threads() >= 2 for w in workers):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("echorl bench did not start two playing workers within 120 s")
        assert _kill_and_check(proc, workers) < 5.0
    finally:
        proc.kill()


def test_sandbox_worker_and_the_code_it_runs_die_with_a_sigkilled_host():
    """A sandbox worker (``python -I -S sandbox/child.py``, init of its own PID namespace where available) and
    the judged code, mid-run with a 60 s wall-clock limit: gone with the host, not at the end of the limit."""
    proc = _start("""
        import threading, time
        from echorl_envs.sandbox import SandboxConfig
        from echorl_envs.sandbox.host import shared_pool

        pool = shared_pool(SandboxConfig(wall_seconds=60, cpu_seconds=60))
        assert pool.run("print(1)").status == "passed"
        threading.Thread(target=pool.run, args=("while True: pass",), daemon=True).start()
        time.sleep(1.0)
        print("started", flush=True)
        time.sleep(600)
    """)
    try:
        procs = _workers(proc, 2, timeout=60, marker="started")  # worker (+ namespace init) + the judged code
        assert _kill_and_check(proc, procs) < 5.0
    finally:
        proc.kill()


def test_miniwob_browsers_die_with_a_sigkilled_env_process():
    """chromedriver and Chromium (which does not watch its parent) go with the env's process, via the reaper."""
    from echorl_envs.miniwob.browser import find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium/chromedriver here (make install-browser)")
    proc = _start("""
        import time
        import gymnasium as gym
        import echorl_envs
        env = gym.make(next(i for i in echorl_envs.env_ids() if "MiniWoB" in i))
        env.reset(seed=0)
        print("started", flush=True)
        time.sleep(600)
    """)
    try:
        procs = _workers(proc, 3, timeout=120, marker="started")  # chromedriver, Chromium's processes, the reaper
        names = {p.name() for p in procs}
        assert {"chromedriver", "chromium"} <= names or {"chromedriver", "chrome"} <= names, names
        assert _kill_and_check(proc, procs) < 5.0
    finally:
        proc.kill()


def test_the_reaper_leaves_when_its_group_is_closed_normally():
    group = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    reaper = lifeline.reap_group_with_this_process(group.pid)
    try:
        time.sleep(0.5)
        assert reaper.poll() is None  # guarding
        group.kill()
        group.wait()
        assert reaper.wait(timeout=5) == 0  # the group is gone: nothing left to guard
    finally:
        group.kill()
        reaper.kill()


@pytest.mark.slow
def test_serve_env_killed_by_sigkill_leaves_no_browser_behind():
    """``echorl serve-env`` with a MiniWoB session (its browser started on a session thread), SIGKILLed."""
    pytest.importorskip("openenv")
    from echorl_envs.miniwob.browser import find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium/chromedriver here (make install-browser)")
    from openenv.core.generic_client import GenericEnvClient

    import echorl_envs
    from tests.openenv_server import server_process

    task = next(i for i in echorl_envs.env_ids() if "MiniWoB" in i)
    with server_process([task]) as (proc, url), GenericEnvClient(base_url=url).sync() as client:
        client.reset(seed=0, task=task)
        procs = [p for p in psutil.Process(proc.pid).children(recursive=True)]
        assert {"chromedriver"} <= {p.name() for p in procs} and len(procs) >= 3
        assert _kill_and_check(proc, procs) < 5.0
