"""Benchmark agents side by side with the evaluation runner (what ``echorl bench`` runs), on a tiny budget.

Runs random, expert, PPO and EchoPPO on a MiniGrid task and random/expert on Game24, then prints the summary
table (Success@1 with a Wilson 95% CI, return, steps, episodes per second) and where the files went.

Usage:
    .venv/bin/python examples/benchmark_echo_rl.py                  # ~1 min on 2 CPU cores
    .venv/bin/python examples/benchmark_echo_rl.py --train-steps 8192 --episodes 5 --seeds 2
"""

from __future__ import annotations

import argparse
import tempfile

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-steps", type=int, default=2048)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default=None, help="output folder (default: a temporary folder)")
    args = p.parse_args()
    torch.set_num_threads(1)

    from echorl_agent.eval import BenchConfig, markdown_table, run_bench, summarize, write_summary

    out = args.out or tempfile.mkdtemp(prefix="echorl-bench-")
    cfg = BenchConfig(
        tasks=["EchoRL/MiniGrid-Empty-5x5-v0", "EchoRL/Game24-v0"],
        agents=["random", "expert", "ppo", "echoppo"],
        out=out, seeds=args.seeds, episodes=args.episodes, workers=1, train_steps=args.train_steps,
        exclude=["EchoRL/Game24-v0:ppo", "EchoRL/Game24-v0:echoppo"],  # SB3 agents need admissible actions
    )
    rows = run_bench(cfg, progress=False)
    summary = summarize(rows, reference=cfg.reference_agent())  # each agent paired with random on the same episodes
    paths = write_summary(summary, out)
    print(markdown_table(summary))
    print(f"\n{len(rows)} episodes; wrote {out}/episodes.jsonl, {out}/run.json, {paths['md']}, {paths['csv']}, "
          f"{paths['json']}")


if __name__ == "__main__":
    main()
