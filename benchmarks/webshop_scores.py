"""WebShop scores and speed: the oracle vs a random clicker on the same instructions, and env steps/s.

Run:  .venv/bin/python benchmarks/webshop_scores.py [--n-random 500] [--seed 0] [--data-path DIR]

The oracle follows ``info["expert_action"]`` (search the instruction's words, open the goal product, choose
its options, buy); the random clicker searches the same words then clicks uniformly among the admissible
buttons. Both use max 15 steps (ReAct's WebShop budget). Steps/s count env.step calls (search steps run a
BM25 query over the catalogue).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tabulate import tabulate

from echorl_envs.webshop import GeneratorConfig, ProductSearch, WebShopEnv, generate_catalogue
from echorl_envs.webshop.baselines import play_oracle, play_random


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-random", type=int, default=500, help="instructions for the random clicker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-path", default=None, help="real WebShop data/ folder (default: generated catalogue)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    if args.data_path is None:
        cat = generate_catalogue.__wrapped__(GeneratorConfig())
    t_cat = time.perf_counter() - t0
    t0 = time.perf_counter()
    env = WebShopEnv(data_path=args.data_path)
    t_env = time.perf_counter() - t0
    t0 = time.perf_counter()
    WebShopEnv(data_path=args.data_path)
    t_env2 = time.perf_counter() - t0
    if args.data_path is not None:
        cat = env.catalogue
    t0 = time.perf_counter()
    ProductSearch(cat.products)
    t_index = time.perf_counter() - t0

    n = env.num_tasks
    t0 = time.perf_counter()
    oracle = [play_oracle(env, i) for i in range(n)]
    t_oracle = time.perf_counter() - t0
    first_hit = np.mean([g.asin in env.search(_first_query(env, i)) for i, g in _goals(env)])

    rng = np.random.default_rng(args.seed)
    idx = rng.choice(n, size=min(args.n_random, n), replace=False)
    t0 = time.perf_counter()
    rand = [play_random(env, int(i), rng) for i in idx]
    t_rand = time.perf_counter() - t0

    def row(name, res, secs):
        steps = sum(r.steps for r in res)
        return [name, len(res), float(np.mean([r.reward for r in res])), float(np.mean([r.success for r in res])),
                float(np.mean([r.bought for r in res])), round(steps / len(res), 2), round(steps / secs)]

    o, r = row("oracle", oracle, t_oracle), row("random clicker", rand, t_rand)
    ratio = ["oracle / random", "", o[2] / max(r[2], 1e-9), o[3] / max(r[3], 1e-9), "", "", ""]
    print(f"catalogue: {cat.source}, {len(cat.products)} products, {n} instructions")
    print(f"build: catalogue {t_cat:.3f}s, BM25 index {t_index:.3f}s, first WebShopEnv() {t_env:.3f}s, "
          f"next (per-process cache) {t_env2 * 1e3:.2f}ms")
    print(f"oracle's first search (instruction words) retrieves the goal product in {first_hit:.1%} of instructions")
    print(tabulate([o, r, ratio], headers=["policy", "episodes", "mean reward", "success (R=1)", "bought",
                                           "steps/episode", "env steps/s"],
                   floatfmt=("", "", ".3f", ".3f", ".3f", ".2f", ".0f")))


def _goals(env):
    return [(i, env.catalogue.goals[j]) for i, j in enumerate(env.catalogue.split_range(env.split))]


def _first_query(env, i):
    env.reset(options={"index": i})
    return env.oracle_query()


if __name__ == "__main__":
    main()
