"""Sandbox throughput: CRUXEval judgements per second, batched (forking worker pool) vs one process per run.

Each judgement is CRUXEval's check ``code + assert f(<input>) == <gold output>`` with the same limits in every
mode, so the ratio is the cost of interpreter start-up that the pool avoids. Uses the real CRUXEval items
from ../shared/data when present, else the package's generated items.

    python benchmarks/sandbox_throughput.py [--items 200] [--workers 2]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from tabulate import tabulate

from echorl_envs.cruxeval import check_program, load_cruxeval
from echorl_envs.cruxeval.generator import generate_items
from echorl_envs.sandbox import SandboxConfig, SandboxPool, run_code

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cruxeval" / "cruxeval.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=200, help="judgements per mode")
    ap.add_argument("--workers", type=int, default=2, help="workers of the parallel pool row")
    args = ap.parse_args()
    torch.set_num_threads(1)

    items = load_cruxeval(DATA) if DATA.is_file() else generate_items(args.items)
    source = "real cruxeval.jsonl" if DATA.is_file() else "generated items"
    programs = [check_program(it, it["output"], "output") for it in items[: args.items]]
    cfg = SandboxConfig(wall_seconds=5.0, cpu_seconds=3)

    rows = []

    def record(name: str, fn) -> float:
        start = time.perf_counter()
        results = fn()
        elapsed = time.perf_counter() - start
        passed = sum(r.passed for r in results)
        rate = len(results) / elapsed
        rows.append([name, len(results), passed, f"{elapsed:.2f}", f"{rate:.1f}", f"{1000 / rate:.1f}"])
        return rate

    base = record("one process per run (run_code)", lambda: [run_code(p, cfg) for p in programs])
    with SandboxPool(cfg, num_workers=1) as pool:
        pool.run("pass")  # start the worker outside the timing
        one = record("SandboxPool, 1 worker", lambda: pool.run_many(programs))
    with SandboxPool(cfg, num_workers=args.workers) as pool:
        pool.run_many(["pass"] * args.workers)
        many = record(f"SandboxPool, {args.workers} workers", lambda: pool.run_many(programs))
    for row, rate in zip(rows, (base, one, many), strict=True):
        row.append(f"{rate / base:.2f}x")
    print(f"Sandbox throughput on {source}; {platform.machine()}, {torch.get_num_threads()} torch thread(s)")
    print(tabulate(rows, headers=["mode", "judgements", "passed", "seconds", "judgements/s", "ms each",
                                  "vs per-run"], tablefmt="github"))


if __name__ == "__main__":
    main()
