"""Env steps/s through ``echorl serve-env`` (OpenEnv WebSocket, server in its own process) vs in-process.

Three figures, each measured side by side in one run (rounds alternate A/B; medians of the rounds):

1. steps/s over the WebSocket ÷ in-process, 1 session, for text MiniGrid, ALFWorld and CRUXEval;
2. aggregate steps/s with 8 concurrent sessions ÷ 1 session (one server, MiniGrid and ALFWorld);
3. ``echorl bench`` wall time over 2 servers ÷ 1 server (random + expert agents, 2 workers; tables compared).

    python benchmarks/remote_env_throughput.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import echorl_envs  # noqa: E402,F401 - registers the ids


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(tasks: list[str], max_sessions: int = 8):
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "echorl_agent.cli", "serve-env", "--port", str(port), "--no-web",
           "--max-sessions", str(max_sessions)] + [a for t in tasks for a in ("--task", t)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def policy(info: dict, rng: np.random.Generator, expert_p: float = 0.7) -> str:
    if "expert_action" in info and rng.random() < expert_p:
        return info["expert_action"]
    if info["admissible_actions"]:
        return info["admissible_actions"][int(rng.integers(len(info["admissible_actions"])))]
    return str(int(rng.integers(100)))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_steps(env: gym.Env, n: int, seed: int, expert_p: float = 0.7, cpu: dict | None = None,
              server_pid: int | None = None) -> float:
    """Steps/s of ``n`` ``step`` calls (resets between episodes are not timed: ALFWorld/TextWorld load games).

    With ``cpu``, adds the CPU ms per step of this process and of ``server_pid`` (resets included) to it.
    """
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    spent = 0.0
    c0, s0 = time.process_time(), cpu_seconds(server_pid) if server_pid else 0.0
    for i in range(n):
        action = policy(info, rng, expert_p)
        t0 = time.perf_counter()
        _, _, term, trunc, info = env.step(action)
        spent += time.perf_counter() - t0
        if term or trunc:
            _, info = env.reset(seed=seed + i + 1)
    if cpu is not None:
        cpu.setdefault("client", []).append((time.process_time() - c0) / n * 1e3)
        if server_pid:
            cpu.setdefault("server", []).append((cpu_seconds(server_pid) - s0) / n * 1e3)
    return n / spent


def remote_vs_local(env_id: str, n: int, rounds: int) -> dict:
    with server([env_id]) as (url, pid):
        local = gym.make(env_id)
        remote = gym.make("EchoRL/Remote-v0", base_url=url, task=env_id)
        for r in range(rounds):  # warm-up on the measured seeds: engines generate/load those games once
            run_steps(local, max(4, n // 10), 100 + r)
            run_steps(remote, max(4, n // 10), 100 + r)
        loc, rem, cpu_l, cpu_r = [], [], {}, {}
        for r in range(rounds):
            loc.append(run_steps(local, n, 100 + r, cpu=cpu_l))
            rem.append(run_steps(remote, n, 100 + r, cpu=cpu_r, server_pid=pid))
        local.close()
        remote.close()
    lo, re_ = statistics.median(loc), statistics.median(rem)
    return {"env": env_id, "in-process steps/s": lo, "remote steps/s": re_, "ratio": re_ / lo,
            "cpu ms/step in-process": statistics.median(cpu_l["client"]),
            "cpu ms/step client": statistics.median(cpu_r["client"]),
            "cpu ms/step server": statistics.median(cpu_r["server"])}


def concurrent(env_id: str, n: int, rounds: int, sessions: int = 8) -> dict:
    def aggregate(envs: list[gym.Env], seed: int) -> float:
        done = [0.0] * len(envs)

        def work(i: int) -> None:
            # random admissible actions: episodes rarely end inside the window, so few (untimed-able) resets
            done[i] = run_steps(envs[i], n, seed + 1000 * i, expert_p=0.0)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(envs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(envs) * n / (time.perf_counter() - t0)

    with server([env_id], max_sessions=sessions) as (url, _):
        envs = [gym.make("EchoRL/Remote-v0", base_url=url, task=env_id) for _ in range(sessions)]
        for e in envs:
            run_steps(e, 4, 0, expert_p=0.0)
        one, many = [], []
        for r in range(rounds):
            one.append(aggregate(envs[:1], 200 + r))
            many.append(aggregate(envs, 200 + r))
        for e in envs:
            e.close()
    o, m = statistics.median(one), statistics.median(many)
    return {"env": env_id, "1 session steps/s": o, f"{sessions} sessions steps/s": m, "ratio": m / o}


def bench_servers(tasks: list[str], episodes: int, rounds: int) -> dict:
    from echorl_agent.eval.runner import BenchConfig, run_bench

    def run(urls: list[str]) -> tuple[float, list]:
        out = tempfile.mkdtemp(prefix="echorl-remote-bench-")
        cfg = BenchConfig(tasks=tasks, agents=["random", "expert"], out=out, seeds=2, episodes=episodes,
                          workers=2, env_urls=urls)
        t0 = time.perf_counter()
        rows = run_bench(cfg, progress=False)
        took = time.perf_counter() - t0
        return took, sorted((r["task"], r["agent"], r["seed"], r["episode"], r["success"], r["return"], r["steps"])
                            for r in rows)

    with server(tasks) as (a, _), server(tasks) as (b, _):
        run([a, b])  # warm-up: both servers generate/load their games once
        one, two, tables = [], [], []
        for _ in range(rounds):
            t1, rows1 = run([a])
            t2, rows2 = run([a, b])
            one.append(t1)
            two.append(t2)
            tables.append(rows1 == rows2)
    o, t = statistics.median(one), statistics.median(two)
    return {"tasks": tasks, "1 server s": o, "2 servers s": t, "speed-up (1/2)": o / t, "same table": all(tables)}


def client_paths(env_id: str, n: int, rounds: int) -> dict:
    """Remote-v0's own-loop client vs OpenEnv's ``.sync()`` wrapper, same server, alternating rounds."""
    from openenv.core.generic_client import GenericEnvClient

    from echorl_envs.service.remote import RemoteTextEnv

    with server([env_id]) as (url, pid):
        own = RemoteTextEnv(url, env_id)
        wrapped = RemoteTextEnv(url, env_id, sync_client=GenericEnvClient(base_url=url).sync())
        rates: dict[str, list] = {"own loop": [], ".sync()": []}
        cpus: dict[str, dict] = {"own loop": {}, ".sync()": {}}
        for r in range(rounds):
            rates["own loop"].append(run_steps(own, n, r, 0.0, cpus["own loop"], pid))
            rates[".sync()"].append(run_steps(wrapped, n, r, 0.0, cpus[".sync()"], pid))
        own.close()
        wrapped.close()
    return {k: (statistics.median(rates[k]), statistics.median(cpus[k]["client"]),
                statistics.median(cpus[k]["server"])) for k in rates}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    p.add_argument("--clients", action="store_true", help="only compare Remote-v0's client with OpenEnv's .sync()")
    p.add_argument("--parts", nargs="+", default=["bench", "single", "sessions"],
                   choices=["bench", "single", "sessions"], help="which figures, in this order")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    k = 0.2 if args.quick else 1.0
    if args.clients:
        for name, (rate, c_ms, s_ms) in client_paths("EchoRL/MiniGrid-DoorKey-5x5-v0", max(50, int(500 * k)),
                                                     args.rounds).items():
            print(f"client {name}: {rate:.1f} steps/s, CPU ms/step client {c_ms:.2f} + server {s_ms:.2f}")
        return
    print(f"# remote_env_throughput (rounds={args.rounds}, medians; server = separate process, loopback)")
    for part in args.parts:
        if part == "single":
            for env_id, n in [("EchoRL/MiniGrid-DoorKey-5x5-v0", 600), ("EchoRL/ALFWorld-PickAndPlace-v0", 100),
                              ("EchoRL/CRUXEval-O-v0", 40)]:
                r = remote_vs_local(env_id, max(10, int(n * k)), args.rounds)
                print(f"1 session  {r['env']}: in-process {r['in-process steps/s']:.1f} steps/s, remote "
                      f"{r['remote steps/s']:.1f} steps/s, ratio {r['ratio']:.2f}; CPU ms/step in-process "
                      f"{r['cpu ms/step in-process']:.2f}, remote client {r['cpu ms/step client']:.2f} + server "
                      f"{r['cpu ms/step server']:.2f}", flush=True)
        elif part == "sessions":
            for env_id, n in [("EchoRL/MiniGrid-DoorKey-5x5-v0", 150), ("EchoRL/ALFWorld-PickAndPlace-v0", 20)]:
                r = concurrent(env_id, max(5, int(n * k)), args.rounds)
                print(f"8 sessions {r['env']}: 1 session {r['1 session steps/s']:.1f} steps/s, 8 sessions "
                      f"{r['8 sessions steps/s']:.1f} steps/s, ratio {r['ratio']:.2f}", flush=True)
        else:
            r = bench_servers(["EchoRL/ALFWorld-PickAndPlace-v0", "EchoRL/MiniGrid-DoorKey-5x5-v0"],
                              episodes=max(2, int(3 * k)), rounds=args.rounds)
            print(f"bench {', '.join(r['tasks'])}: 1 server {r['1 server s']:.1f} s, 2 servers "
                  f"{r['2 servers s']:.1f} s, speed-up {r['speed-up (1/2)']:.2f}, same table: {r['same table']}",
                  flush=True)

if __name__ == "__main__":
    main()
