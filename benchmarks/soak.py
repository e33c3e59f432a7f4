"""Soak test: every registered env for N minutes with a random and an expert agent; RSS and open fds recorded.

Each id runs in its own fresh process (so one env's memory does not hide in another's figures, and a crash or a
hang is reported for that id only). Inside it the env is made and warmed up (one reset and step), then episodes
alternate between a random agent (a uniformly random admissible action; for free-text envs a random answer from
a small pool of plausible and junk strings) and the env's expert (``info["expert_action"]``; envs without one
fall back to the random agent and say so) until the time is up. Measured with psutil: resident memory of the
process and its children, open file descriptors and live child processes -- after warm-up, after the first
quarter of the budget (growth after that point is the leak indicator, warm-up caches excluded), at the end,
and fds/children again after ``env.close()``. Any exception raised by ``reset``/``step`` is counted and the
episode restarted.

Usage::

    .venv/bin/python benchmarks/soak.py --minutes 0.5            # every id, 30 s each
    .venv/bin/python benchmarks/soak.py --minutes 2 --envs EchoRL/ALFWorld-v0 EchoRL/CRUXEval-O-v0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

_MB = 1 << 20
_JUNK = ["0", "1", "42", "-7", "3.5", "'a'", "[1, 2]", "[[0, 1], [1, 0]]", "True", "None", "yes", "",
         "the answer is 12", "print(1)", "go north", "(x for x in ()).throw(SystemExit)"]


def _usage() -> dict[str, float]:
    import psutil

    me = psutil.Process()
    kids = me.children(recursive=True)
    rss = me.memory_info().rss
    for k in kids:
        try:
            rss += k.memory_info().rss
        except psutil.Error:
            pass
    return {"rss_mb": rss / _MB, "fds": me.num_fds(), "children": len(kids), "threads": me.num_threads()}


def _make_kwargs(env_id: str) -> dict[str, Any] | None:
    """Extra kwargs: data files for data-backed ids (None: the data is absent, skip), as the registry-driven tests
    do; a pool of 2 games for ALFWorld/TextWorld, whose games are generated (and compiled) on first use -- the
    warm-up plays each once, so the soak measures steady state rather than game generation."""
    if env_id == "EchoRL/GSM8K-v0":
        data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
        return {"data_path": str(data)} if data.exists() else None
    if env_id.startswith(("EchoRL/ALFWorld", "EchoRL/TextWorld")):
        return {"num_games": 2}
    return {}


def _random_action(rng: Any, info: dict[str, Any]) -> str:
    adm = info.get("admissible_actions") or []
    if adm:
        return adm[int(rng.integers(len(adm)))]
    if rng.random() < 0.25:
        n = int(rng.integers(1, 40))
        return "".join(chr(int(c)) for c in rng.integers(32, 127, n))
    return _JUNK[int(rng.integers(len(_JUNK)))]


def soak_one(env_id: str, seconds: float, seed: int) -> dict[str, Any]:
    """Run one id for ``seconds`` in this process and return its figures."""
    import numpy as np

    import echorl_envs

    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass
    kwargs = _make_kwargs(env_id)
    if kwargs is None:
        return {"id": env_id, "skipped": "data absent"}
    rng = np.random.default_rng(seed)
    env = echorl_envs.make(env_id, **kwargs)
    _, info = env.reset(seed=seed)
    env.step(_random_action(rng, info))
    if kwargs.get("num_games"):
        for i in range(kwargs["num_games"]):
            env.reset(options={"index": i})
    start = _usage()
    t0 = time.perf_counter()
    quarter: dict[str, float] | None = None
    steps, episodes, wins = Counter(), Counter(), Counter()
    errors: Counter[str] = Counter()
    no_expert = 0
    expert_miss: str | None = None  # the feedback of the first expert episode that was not won (a diagnostic)
    agent_i = 0
    while time.perf_counter() - t0 < seconds:
        agent = ("random", "expert")[agent_i % 2]
        agent_i += 1
        try:
            _, info = env.reset(seed=seed + agent_i)
        except Exception as e:  # noqa: BLE001 - counted, never fatal
            errors[f"reset {type(e).__name__}"] += 1
            continue
        episodes[agent] += 1
        done = False
        while not done and time.perf_counter() - t0 < seconds:
            action = info.get("expert_action") if agent == "expert" else None
            if agent == "expert" and action is None:
                no_expert += 1
            if action is None:
                action = _random_action(rng, info)
            try:
                obs, _, term, trunc, info = env.step(action)
            except Exception as e:  # noqa: BLE001
                errors[f"step {type(e).__name__}: {str(e)[:60]}"] += 1
                break
            steps[agent] += 1
            done = term or trunc
            if done and info.get("won"):
                wins[agent] += 1
            elif done and agent == "expert" and expert_miss is None:
                expert_miss = str(obs)[:300]
            if quarter is None and time.perf_counter() - t0 >= seconds / 4:
                quarter = _usage()
    end = _usage()
    env.close()
    closed = _usage()
    return {
        "id": env_id, "seconds": time.perf_counter() - t0, "steps": dict(steps), "episodes": dict(episodes),
        "wins": dict(wins), "errors": dict(errors), "expert_missing_steps": no_expert,
        "expert_miss_example": expert_miss,
        "start": start, "quarter": quarter or end, "end": end, "after_close": closed,
    }


def _run_child(env_id: str, seconds: float, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", env_id, "--seconds", str(seconds), "--seed", str(seed)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 600, env=env)
    except subprocess.TimeoutExpired:
        return {"id": env_id, "failed": f"no result within {seconds * 4 + 600:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"id": env_id, "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def _table(results: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    rows = []
    for r in results:
        name = r["id"].removeprefix("EchoRL/")
        if "start" not in r:
            rows.append([name, r.get("skipped") or r.get("failed")] + [""] * 9)
            continue
        s, q, e, c = r["start"], r["quarter"], r["end"], r["after_close"]
        rows.append([
            name, f"{r['steps'].get('random', 0)}/{r['steps'].get('expert', 0)}",
            f"{r['episodes'].get('random', 0)}/{r['episodes'].get('expert', 0)}",
            f"{r['wins'].get('random', 0)}/{r['wins'].get('expert', 0)}" + (" (no expert)" if
                                                                             r["expert_missing_steps"] else ""),
            sum(r["errors"].values()), f"{s['rss_mb']:.0f}", f"{e['rss_mb']:.0f}", f"{e['rss_mb'] - q['rss_mb']:+.1f}",
            f"{s['fds']}/{e['fds']}/{c['fds']}", f"{s['children']}/{e['children']}/{c['children']}",
            f"{s['threads']}/{e['threads']}",
        ])
    head = ["env", "steps rand/exp", "episodes rand/exp", "wins rand/exp", "exceptions", "RSS start MB",
            "RSS end MB", "RSS growth after 1st quarter MB", "fds start/end/closed", "children start/end/closed",
            "threads start/end"]
    return tabulate(rows, head, tablefmt="github")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=0.5, help="soak time per env id")
    p.add_argument("--envs", nargs="*", help="ids to soak (default: every registered id)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the raw results as JSON here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        try:
            print(json.dumps(soak_one(args.child, args.seconds, args.seed)))
        except Exception as e:  # noqa: BLE001 - reported as this id's result
            print(json.dumps({"id": args.child, "failed": f"{type(e).__name__}: {e}"[:200]}))
            traceback.print_exc()
        return []
    import logging

    import echorl_envs

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = []
    for env_id in args.envs or echorl_envs.env_ids():
        t0 = time.perf_counter()
        results.append(_run_child(env_id, args.minutes * 60, args.seed))
        logging.info("%s done in %.0f s", env_id, time.perf_counter() - t0)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(_table(results))
    return results


if __name__ == "__main__":
    main()
