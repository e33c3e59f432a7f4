"""Environment throughput: our text envs ÷ the raw engines they wrap, measured side by side in one run.

Every benchmark replays the *same seeds and action sequences* on both sides, times only ``step`` calls
(resets are excluded on both sides), alternates the two sides ``--repeats`` times and keeps each side's
best run (least disturbed by other processes on a shared machine). It also checks that both sides
collected the same total reward, so a fast-but-wrong wrapper cannot pass.

Add a family by writing ``bench_<family>(args) -> list[Row]`` and adding it to :data:`BENCHMARKS`
(e.g. ALFWorld/TextWorld "our env ÷ raw engine", or AsyncVectorEnv with 2 workers ÷ 1).

Usage::

    .venv/bin/python benchmarks/env_throughput.py                  # all benchmarks
    .venv/bin/python benchmarks/env_throughput.py --only minigrid --steps 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
from tabulate import tabulate

try:  # the brief for shared 2-core machines: one torch thread (torch is imported by other families)
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

import echorl_envs


@dataclass
class Row:
    """One line of the result table."""

    benchmark: str
    env: str
    variant: str
    ours_steps_per_s: float
    baseline_steps_per_s: float
    same_rewards: bool

    @property
    def ratio(self) -> float:
        return self.ours_steps_per_s / self.baseline_steps_per_s


def timed_replay(env: gym.Env, actions: Sequence, seed: int) -> tuple[float, float]:
    """Step ``env`` through ``actions`` (resetting with seed, seed+1, ... at episode ends).

    Returns:
        (steps per second over the ``step`` calls only, total reward).
    """
    env.reset(seed=seed)
    episode = 0
    total = 0.0
    busy = 0.0
    clock = time.perf_counter
    for a in actions:
        t0 = clock()
        _, r, term, trunc, _ = env.step(a)
        busy += clock() - t0
        total += float(r)
        if term or trunc:
            episode += 1
            env.reset(seed=seed + episode)
    return len(actions) / busy, total


def best_of(
    repeats: int, runs: dict[str, Callable[[], tuple[float, float]]]
) -> dict[str, tuple[float, float]]:
    """Alternate the runs ``repeats`` times; keep each one's best steps/s (and its reward total)."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            sps, total = run()
            if name not in best or sps > best[name][0]:
                best[name] = (sps, total)
    return best


# ------------------------------------------------------------------------------------------ MiniGrid
def expert_actions(env_id: str, seed: int, n: int) -> list[int]:
    """Action indices of the env's own expert (BabyAI bot / BFS planner) over ``n`` steps."""
    from echorl_envs.minigrid import ACTION_WORDS

    env = gym.make(env_id, expert=True)
    _, info = env.reset(seed=seed)
    episode, out = 0, []
    while len(out) < n:
        a = info["expert_action"]
        out.append(ACTION_WORDS.index(a))
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            episode += 1
            _, info = env.reset(seed=seed + episode)
    return out


def bench_minigrid(args: argparse.Namespace) -> list[Row]:
    """Text MiniGrid (``gym.make("EchoRL/...")``) ÷ raw minigrid (``gym.make(raw_id)``), same actions.

    Two action streams per id: uniformly random actions (the expert, when on, replans every step: its
    worst case) and the expert's own actions (imitation-data collection: the plan is followed).
    """
    from echorl_envs.minigrid import ACTION_WORDS

    rows = []
    for env_id in args.envs or echorl_envs.env_ids("minigrid"):
        raw_id = env_id.removeprefix("EchoRL/")
        raw = gym.make(raw_id)
        plain = gym.make(env_id, expert=False)
        with_expert = gym.make(env_id, expert=True)
        rng = np.random.default_rng(args.seed)
        streams = {
            "random": [int(a) for a in rng.integers(len(ACTION_WORDS), size=args.steps)],
            "expert": expert_actions(env_id, args.seed, args.steps),
        }
        for stream, idx in streams.items():
            words = [ACTION_WORDS[i] for i in idx]
            best = best_of(
                args.repeats,
                {
                    "raw": partial(timed_replay, raw, idx, args.seed),
                    "text": partial(timed_replay, plain, words, args.seed),
                    "text+expert": partial(timed_replay, with_expert, words, args.seed),
                },
            )
            base_sps, base_total = best["raw"]
            for variant in ("text", "text+expert"):
                sps, total = best[variant]
                rows.append(
                    Row(
                        "minigrid",
                        raw_id,
                        f"{variant}, {stream} actions",
                        sps,
                        base_sps,
                        math.isclose(total, base_total, rel_tol=1e-9, abs_tol=1e-9),
                    )
                )
    return rows


#: Benchmark name -> function returning rows; other families add theirs here.
BENCHMARKS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "minigrid": bench_minigrid,
}

# ALFWorld / TextWorld rows live in benchmarks/throughput_text_games.py (imported from this folder).
from throughput_text_games import register as _register_text_games  # noqa: E402

_register_text_games(BENCHMARKS, Row)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), help="benchmarks to run (default: all)")
    p.add_argument("--envs", nargs="*", help="restrict to these registered ids (default: the family's ids)")
    p.add_argument("--steps", type=int, default=2000, help="timed steps per env and action stream")
    p.add_argument("--repeats", type=int, default=3, help="alternating repeats; each side keeps its best")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        p.error(f"--steps and --repeats must be >= 1, got steps={args.steps}, repeats={args.repeats}")
    logging.getLogger("minigrid").setLevel(logging.ERROR)
    rows: list[Row] = []
    for name in args.only or list(BENCHMARKS):
        rows += BENCHMARKS[name](args)
    table = [
        [
            r.benchmark,
            r.env,
            r.variant,
            f"{r.ours_steps_per_s:,.0f}",
            f"{r.baseline_steps_per_s:,.0f}",
            f"{r.ratio:.2f}",
            "yes" if r.same_rewards else "NO",
        ]
        for r in rows
    ]
    headers = ["benchmark", "env", "variant", "ours steps/s", "raw steps/s", "ours / raw", "same rewards"]
    print(tabulate(table, headers=headers, tablefmt="github"))
    for name in sorted({r.benchmark for r in rows}):
        for variant in sorted({r.variant for r in rows if r.benchmark == name}):
            ratios = [r.ratio for r in rows if r.benchmark == name and r.variant == variant]
            gmean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{name} / {variant}: geometric-mean ratio {gmean:.2f} over {len(ratios)} envs")
    return rows


if __name__ == "__main__":
    main()
