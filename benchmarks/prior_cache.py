"""LLM prior cache: LLM queries and wall time with the cache / without, and success retained (SmolLM2-135M).

Run:  .venv/bin/python benchmarks/prior_cache.py [--envs ID ...] [--episodes 10] [--max-steps 15]
                                                  [--deltas 0.95 0.99] [--dqn-steps 64] [--nn-sizes 1000 4000 16000]
      [--first-seed 700 --seeds 15 --out FILE.jsonl]   (seed study: see below)

Three parts, all measured in this one run:

1. **Agent**: :class:`PriorCacheAgent` samples actions from the SmolLM2 action prior (scores of every admissible
   action under a one-turn prompt), querying the LLM at every step (baseline) or through an
   :class:`LLMPriorCache` keyed by MiniLM embeddings of the state text (one row per delta). Same env seeds for
   every variant. Reports LLM queries, wall time, success with Wilson 95% CIs, and the ratios vs the baseline.
2. **PosteriorDQN**: ``--dqn-steps`` env steps of DQN exploring by posterior sampling from the same LLM prior,
   with and without the cache (LLM queries per env step; learning itself is not the point at this budget).
3. **Nearest-neighbour backends**: microseconds per top-1 query of numpy / faiss / hnswlib at several cache sizes
   (384-d unit vectors, the MiniLM size), which sets ``AUTO_SWITCH_SIZE``.

With ``--seeds N`` part 1 becomes a seed study (docs/studies/llm-prior-cache-minigrid.md): for each seed s of
``first_seed .. first_seed + N - 1`` a fresh prior and a fresh cache (RNG seed s) play ``--episodes`` instances
(env seeds ``episode_seed(s, ep)``), uncached and cached on the same instances; one JSON line per (seed, variant)
goes to ``--out`` (a rerun skips the pairs already there), then the pooled query ratio and the paired success
difference are reported with 95% bootstrap CIs over seeds.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the machine is shared: one BLAS thread, like torch below

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tabulate import tabulate

import echorl_envs  # noqa: F401 - registers the ids
from echorl_agent.agents import PriorCacheAgent
from echorl_agent.eval.runner import episode_seed
from echorl_agent.eval.stats import bootstrap_text, mcnemar_exact, ratio_bootstrap, read_jsonl, success_text
from echorl_agent.priors import (
    AdaptiveConfig,
    FaissIndex,
    HNSWIndex,
    LLMActionPrior,
    LLMPriorCache,
    LLMPriorSource,
    NumpyIndex,
    PosteriorDQN,
    PriorCacheConfig,
    make_prior_env,
)


def run_agent(env_id: str, agent: PriorCacheAgent, episodes: int, max_steps: int, seed: int = 0) -> dict:
    """Play env seeds ``episode_seed(seed, 0..episodes-1)``; per-episode wins are in ``won``."""
    env = gym.make(env_id, max_episode_steps=max_steps)
    won, steps = [], 0
    t0 = time.perf_counter()
    q0 = agent.prior.num_queries
    for ep in range(episodes):
        env_seed = episode_seed(seed, ep)
        obs, info = env.reset(seed=env_seed)
        agent.reset(env_id, obs, info, env_seed)
        done = False
        while not done:
            obs, r, term, trunc, info = env.step(agent.act(obs, info))
            steps += 1
            done = term or trunc
        won.append(bool(info.get("won", False)))
    env.close()
    return {"wins": sum(won), "won": won, "episodes": episodes, "steps": steps,
            "queries": agent.prior.num_queries - q0, "seconds": time.perf_counter() - t0}


def seed_study(args, make_prior, encoder) -> list[dict]:
    """Uncached vs cached (delta = ``args.deltas[0]``) on the same instances, one fresh prior and cache per seed.

    ``make_prior()`` returns a fresh :class:`LLMActionPrior` (its ``num_queries`` counts this seed's queries).
    """
    out = Path(args.out)
    done = {(r["seed"], r["variant"]) for r in read_jsonl(out)}
    delta = args.deltas[0]
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for variant in ("no cache", f"cache delta={delta}"):
            if (seed, variant) in done:
                continue
            cfg = None if variant == "no cache" else PriorCacheConfig(delta=delta, capacity=4096, refresh_rate=0.05,
                                                                      seed=seed)
            agent = PriorCacheAgent(make_prior(), encoder, use_cache=cfg is not None,
                                    cache_config=cfg)
            res = run_agent(args.envs[0], agent, args.episodes, args.max_steps, seed=seed)
            res.update(seed=seed, variant=variant, env=args.envs[0], max_steps=args.max_steps,
                       hit_rate=agent.cache.counters.hit_rate if agent.cache is not None else 0.0)
            with out.open("a") as f:
                f.write(json.dumps(res) + "\n")
            print(f"seed {seed} {variant}: {res['wins']}/{args.episodes} won, {res['steps']} steps, "
                  f"{res['queries']} queries, {res['seconds']:.0f} s", flush=True)
    return read_jsonl(out)


def seed_summary(rows: list[dict]) -> str:
    """Pooled query ratio and paired success difference over the seeds that have both variants."""
    by = {(r["seed"], r["variant"] == "no cache"): r for r in rows}
    seeds = sorted(s for s, base in by if base and (s, False) in by)
    if not seeds:
        return "no seed has both variants yet"
    base = [by[s, True] for s in seeds]
    cach = [by[s, False] for s in seeds]
    ratio = ratio_bootstrap([b["queries"] for b in base], [c["queries"] for c in cach])
    time_ratio = ratio_bootstrap([b["seconds"] for b in base], [c["seconds"] for c in cach])
    diff = bootstrap_text([np.mean(c["won"]) - np.mean(b["won"]) for b, c in zip(base, cach, strict=True)], signed=True)
    a = [w for b in base for w in b["won"]]
    c = [w for r in cach for w in r["won"]]
    n = len(a)
    rows_out = [
        ["seeds", f"{seeds[0]}-{seeds[-1]} ({len(seeds)})"],
        ["episodes (paired)", n],
        ["LLM queries no cache / cache", f"{sum(b['queries'] for b in base)} / {sum(r['queries'] for r in cach)}"],
        ["query ratio no cache / cache [95% CI over seeds]", f"{ratio[0]:.2f}x [{ratio[1]:.2f}, {ratio[2]:.2f}]"],
        ["wall-time ratio [95% CI]", f"{time_ratio[0]:.2f}x [{time_ratio[1]:.2f}, {time_ratio[2]:.2f}]"],
        ["per-seed query ratios (min / median / max)", " / ".join(
            f"{q:.1f}" for q in np.percentile([b["queries"] / max(1, r["queries"]) for b, r in zip(base, cach, strict=True)],
                                              [0, 50, 100]))],
        ["success no cache [Wilson 95%]", success_text(sum(a), n, counts=True)],
        ["success cache [Wilson 95%]", success_text(sum(c), n, counts=True)],
        ["success cache - no cache [95% CI over seeds]", diff],
        ["McNemar p (exact, paired episodes)", f"{mcnemar_exact(c, a):.3g}"],
    ]
    return tabulate(rows_out, tablefmt="github")


def agent_part(args, engine, encoder) -> list[list]:
    rows = []
    for env_id in args.envs:
        base = None
        variants: list[tuple[str, PriorCacheConfig | None]] = [("no cache", None)]
        variants += [(f"cache delta={d}", PriorCacheConfig(delta=d, capacity=4096, refresh_rate=0.05))
                     for d in args.deltas]
        for label, cfg in variants:
            prior = LLMActionPrior(engine, temperature=1.0)
            agent = PriorCacheAgent(prior, encoder, use_cache=cfg is not None, cache_config=cfg)
            res = run_agent(env_id, agent, args.episodes, args.max_steps)
            sr = res["wins"] / res["episodes"]
            if base is None:
                base = res
            ratio_q = base["queries"] / max(1, res["queries"])
            ratio_t = base["seconds"] / res["seconds"]
            base_sr = base["wins"] / base["episodes"]
            retained = f"{sr / base_sr:.2f}" if base_sr > 0 else "n/a (baseline 0)"
            hit = agent.cache.counters.hit_rate if agent.cache is not None else 0.0
            rows.append([env_id.split("/")[1], label, res["steps"], res["queries"], f"{hit:.2f}",
                         f"{res['seconds']:.0f}", success_text(res["wins"], res["episodes"]), f"{ratio_q:.2f}x",
                         f"{ratio_t:.2f}x", retained])
            print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    return rows


def dqn_part(args, engine, encoder) -> list[list]:
    rows = []
    for label, use in (("no cache", False), (f"cache delta={args.deltas[0]}", True)):
        env = make_prior_env(args.envs[0], n_envs=1, seed=0, encoder_kwargs={"dim": 128},
                             env_kwargs={"max_episode_steps": args.max_steps})
        prior = LLMActionPrior(engine, temperature=1.0)
        cache = LLMPriorCache(encoder.dim, PriorCacheConfig(delta=args.deltas[0], capacity=4096,
                                                            adaptive=AdaptiveConfig(interval=16))) if use else None
        model = PosteriorDQN("MlpPolicy", env, prior_source=LLMPriorSource(prior, encoder, cache),
                             learning_starts=16, train_freq=4, batch_size=16, buffer_size=1000,
                             policy_kwargs={"net_arch": [64]}, seed=0)
        t0 = time.perf_counter()
        model.learn(args.dqn_steps)
        sec = time.perf_counter() - t0
        eps = [r for r in (cache.history if cache else [])]
        traj = "; ".join(f"K={r.capacity} d={r.delta:.2f} r={r.refresh_rate:.3f} h={r.hit_rate:.2f}" for r in eps[-2:])
        rows.append([args.envs[0].split("/")[1], label, args.dqn_steps, prior.num_queries,
                     f"{prior.num_queries / args.dqn_steps:.2f}", f"{sec:.0f}", traj or "-"])
        print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    return rows


def nn_part(args) -> list[list]:
    import faiss

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(0)
    d, nq = 384, 300
    rows = []
    for n in args.nn_sizes:
        x = rng.standard_normal((n, d)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        qs = x[rng.integers(0, n, nq)] + 0.05 * rng.standard_normal((nq, d)).astype(np.float32)
        row: list = [n]
        truth = None
        for cls in (NumpyIndex, FaissIndex, HNSWIndex):
            ix = cls(d)
            t0 = time.perf_counter()
            for i in range(n):
                ix.add(i, x[i])
            build = time.perf_counter() - t0
            t0 = time.perf_counter()
            got = np.array([ix.search(q, 1)[0][0] for q in qs])
            us = (time.perf_counter() - t0) / nq * 1e6
            if truth is None:
                truth = got
            row += [f"{us:.0f}", f"{build / n * 1e6:.0f}"]
        row.append(f"{(got == truth).mean():.3f}")
        rows.append(row)
        print(tabulate([row], tablefmt="plain"), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["EchoRL/MiniGrid-Empty-5x5-v0", "EchoRL/BabyAI-GoToLocal-v0"])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=15)
    ap.add_argument("--deltas", type=float, nargs="+", default=[0.95, 0.99])
    ap.add_argument("--dqn-steps", type=int, default=64, help="0 skips the PosteriorDQN part")
    ap.add_argument("--nn-sizes", type=int, nargs="*", default=[1000, 4000, 16000])
    ap.add_argument("--first-seed", type=int, default=700, help="seed study: first seed")
    ap.add_argument("--seeds", type=int, default=0, help="seed study over this many seeds (0: the one-run table)")
    ap.add_argument("--out", default="benchmarks/results/prior_cache_seeds.jsonl", help="seed study: JSON lines")
    args = ap.parse_args()
    if args.seeds < 0:
        raise ValueError(f"--seeds must be >= 0, got --seeds {args.seeds}")
    torch.set_num_threads(1)

    from echorl_agent.llm import LLMEngine
    from echorl_envs.wrappers import MiniLMEncoder

    t0 = time.perf_counter()
    engine = LLMEngine("smollm2-135m")
    encoder = MiniLMEncoder()
    encoder.encode(["warm up"])
    print(f"SmolLM2 + MiniLM loaded in {time.perf_counter() - t0:.1f} s", flush=True)

    head = ["env", "variant", "steps", "LLM queries", "hit rate", "wall s", "success [95% CI]",
            "queries base/this", "time base/this", "success this/base"]
    if args.seeds:
        rows = seed_study(args, lambda: LLMActionPrior(engine, temperature=1.0), encoder)
        print(f"\n## Seed study: {args.envs[0]}, {args.episodes} episodes per seed, max {args.max_steps} steps\n")
        print(seed_summary(rows))
    else:
        agent_rows = agent_part(args, engine, encoder)
        print("\n## Agent: PriorCacheAgent (SmolLM2 prior, MiniLM state keys)\n")
        print(tabulate(agent_rows, head, tablefmt="github"))
    if args.dqn_steps > 0:
        dqn_rows = dqn_part(args, engine, encoder)
        print("\n## PosteriorDQN exploration\n")
        print(tabulate(dqn_rows, ["env", "variant", "env steps", "LLM queries", "queries/step", "wall s",
                                  "last adaptive windows"], tablefmt="github"))
    if args.nn_sizes:
        nn_rows = nn_part(args)
        print("\n## Nearest neighbour, 384-d, top-1 (us per query / us per insert)\n")
        print(tabulate(nn_rows, ["size", "numpy q", "numpy ins", "faiss q", "faiss ins", "hnswlib q",
                                 "hnswlib ins", "hnswlib recall@1 vs exact"], tablefmt="github"))


if __name__ == "__main__":
    main()
