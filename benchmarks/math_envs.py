"""Math environments: wrapper overhead, Game-of-24 pool building, and answer-grading accuracy.

Three measurements, each ours beside a baseline in the same run:

1. Episode throughput (reset + one expert answer) of each math env vs the bare engine loop it wraps
   (reasoning-gym ``ds[i]`` + ``score_answer``; for GSM8K a loop over the parsed rows comparing strings).
2. Game-of-24 pool: :func:`echorl_envs.math.game24.solvable_puzzles` (reachable-set test) vs running the
   full search :func:`solve` on every hand; both must find the same 1362 hands.
3. Grading accuracy on the real GSM8K test file (needs ../shared/data/gsm8k/test.jsonl or --gsm8k):
   fraction of replies judged correct by our extractor vs reasoning-gym's ``gsm_symbolic`` scorer
   (first number of the reply, float equality), on (a) the official worked solutions and (b) the gold
   answer exactly as written in the file ("1,450,000").

Usage: ``python benchmarks/math_envs.py [--episodes 2000] [--gsm8k PATH]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import reasoning_gym
import torch
from tabulate import tabulate

from echorl_envs.math import ArithmeticEnv, Game24Env, GSM8KEnv, GSMSymbolicEnv, extract_answer
from echorl_envs.math.game24 import solvable_puzzles, solve

DEFAULT_GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"


def env_rate(env, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        _, info = env.reset(options={"index": i % env.num_tasks})
        env.step(info["expert_action"])
    return n / (time.perf_counter() - t)


def rg_rate(name: str, n: int) -> float:
    ds = reasoning_gym.create_dataset(name, size=1000, seed=0)
    t = time.perf_counter()
    for i in range(n):
        entry = ds[i % 1000]
        ds.score_answer(entry["answer"], entry)
    return n / (time.perf_counter() - t)


def gsm8k_raw_rate(path: Path, n: int) -> float:
    """Baseline for GSM8K: the minimal grading loop (float compare of the reply with the gold number)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    golds = [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in rows]
    t = time.perf_counter()
    hits = 0
    for i in range(n):
        gold = golds[i % len(golds)]
        reply = gold
        hits += float(reply) == float(gold)
    assert hits == n
    return n / (time.perf_counter() - t)


def game24_raw_rate(n: int) -> float:
    """Baseline for Game24: the puzzle's solver call alone (what any 24 env must do to have an oracle)."""
    hands = solvable_puzzles()
    t = time.perf_counter()
    for i in range(n):
        solve(hands[i % len(hands)])
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--gsm8k", type=Path, default=DEFAULT_GSM8K)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.episodes

    rows = []
    for label, env, base in (
        ("GSMSymbolic-v0", GSMSymbolicEnv(), lambda: rg_rate("gsm_symbolic", n)),
        ("Arithmetic-v0", ArithmeticEnv(), lambda: rg_rate("basic_arithmetic", n)),
        ("Game24-v0", Game24Env(), lambda: game24_raw_rate(n)),
    ):
        ours, raw = env_rate(env, n), base()
        rows.append((label, f"{ours:,.0f}", f"{raw:,.0f}", f"{ours / raw:.3g}"))
    if args.gsm8k.exists():
        ours, raw = env_rate(GSM8KEnv(data_path=args.gsm8k), n), gsm8k_raw_rate(args.gsm8k, n)
        rows.append(("GSM8K-v0", f"{ours:,.0f}", f"{raw:,.0f}", f"{ours / raw:.3g}"))
    print(f"1. episodes/s (reset + 1 expert answer), {n} episodes")
    print(tabulate(rows, headers=["env", "ours ep/s", "bare engine loop/s", "ratio"]))

    solvable_puzzles.cache_clear()
    t = time.perf_counter()
    fast = solvable_puzzles()
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    slow = tuple(h for h in itertools.combinations_with_replacement(range(1, 14), 4) if solve(h) is not None)
    t_slow = time.perf_counter() - t
    assert fast == slow, "reachable-set test and full search disagree"
    print("\n2. Game-of-24 pool of all solvable 4-card hands (1..13, target 24)")
    print(
        tabulate(
            [
                ("reachable sets (ours)", len(fast), f"{t_fast:.3f}"),
                ("solve() on every hand", len(slow), f"{t_slow:.3f}"),
            ],
            headers=["method", "hands", "seconds"],
        )
    )
    print(f"speed-up: {t_slow / t_fast:.1f}x")

    if not args.gsm8k.exists():
        print(f"\n3. skipped: {args.gsm8k} not found")
        return
    data = [json.loads(line) for line in args.gsm8k.read_text(encoding="utf-8").splitlines()]
    scorer = reasoning_gym.create_dataset("gsm_symbolic", size=1, seed=0)
    out = []
    for label, reply in (
        ("official worked solution", lambda d: d["answer"]),
        ("gold as written (#### part)", lambda d: d["answer"].rsplit("####", 1)[1].strip()),
    ):
        ours = rg = 0
        for d in data:
            gold = d["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            text = reply(d)
            ours += extract_answer(text) == extract_answer(gold)
            rg += scorer.score_answer(text, {"answer": gold}) == 1.0
        out.append((label, f"{ours}/{len(data)}", f"{rg}/{len(data)}"))
    print("\n3. GSM8K test replies graded correct (all replies are right)")
    print(tabulate(out, headers=["reply", "ours", "reasoning-gym gsm_symbolic scorer"]))


if __name__ == "__main__":
    main()
