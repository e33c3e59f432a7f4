"""Seed studies of benchmarks/prior_cache.py and benchmarks/experience_bank.py: seed plumbing, pairing, pooling."""

from __future__ import annotations

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from echorl_agent.eval.stats import ratio_bootstrap

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ratio_bootstrap_pools_sums_and_resamples_units_jointly():
    assert ratio_bootstrap([10, 20], [2, 4]) == (5.0, 5.0, 5.0)
    # units (10/1) and (10/10): resamples give 10, 1 or 20/11, each end with probability 1/4
    r, lo, hi = ratio_bootstrap([10, 10], [1, 10])
    assert r == pytest.approx(20 / 11) and lo == 1.0 and hi == 10.0
    with pytest.raises(ValueError, match="len\\(num\\)=2, len\\(den\\)=1"):
        ratio_bootstrap([1, 2], [1])
    with pytest.raises(ValueError, match="sum\\(den\\)=0"):
        ratio_bootstrap([1], [0])


class FixedPrior:
    """Stands in for the LLM only to test the pairing: the same prior for every state, queries counted."""

    def __init__(self) -> None:
        self.num_queries, self.seconds = 0, 0.0

    def __call__(self, text: str, actions: list[str]) -> np.ndarray:
        self.num_queries += 1
        p = np.arange(1.0, len(actions) + 1)
        return p / p.sum()


def test_prior_cache_seed_study_pairs_instances_and_resumes(tmp_path):
    from echorl_envs.wrappers import HashingEncoder

    pc = _load("prior_cache")
    out = tmp_path / "pc.jsonl"
    args = Namespace(out=str(out), deltas=[0.95], first_seed=3, seeds=2, envs=["EchoRL/MiniGrid-Empty-5x5-v0"],
                     episodes=2, max_steps=6)
    rows = pc.seed_study(args, FixedPrior, HashingEncoder(dim=64))
    assert sorted((r["seed"], r["variant"]) for r in rows) == [
        (3, "cache delta=0.95"), (3, "no cache"), (4, "cache delta=0.95"), (4, "no cache")]
    by = {(r["seed"], r["variant"]): r for r in rows}
    for s in (3, 4):
        base, cached = by[s, "no cache"], by[s, "cache delta=0.95"]
        # the same prior on the same instances with the same sampling stream: identical play, fewer queries
        assert base["won"] == cached["won"] and base["steps"] == cached["steps"]
        assert base["queries"] == base["steps"] == 12
        assert 1 <= cached["queries"] < base["queries"]
    n_lines = len(out.read_text().splitlines())
    pc.seed_study(args, FixedPrior, HashingEncoder(dim=64))  # resumes: nothing left to run
    assert len(out.read_text().splitlines()) == n_lines == 4
    ratio = 24 / (by[3, "cache delta=0.95"]["queries"] + by[4, "cache delta=0.95"]["queries"])
    summary = pc.seed_summary(rows)
    assert f"{ratio:.2f}x" in summary and "+0.000 [+0.000, +0.000]" in summary


def test_experience_bank_seeds_derive_from_the_study_seed():
    eb = _load("experience_bank")
    assert (eb.bank_seed0(0), eb.eval_seed0(0)) == (0, eb.EVAL_SEED0)  # seed 0 = the one-run table
    bank = {eb.bank_seed0(s) + i for s in range(800, 815) for i in range(300)}
    evals = {eb.eval_seed0(s) + ep for s in range(800, 815) for ep in range(100)}
    assert len(bank) == 4500 and len(evals) == 1500 and not bank & evals
    import gymnasium as gym

    rollouts = eb.fill_bank("EchoRL/BabyAI-GoToLocal-v0", 2, 0.0, 64, seed=eb.bank_seed0(801))
    env = gym.make("EchoRL/BabyAI-GoToLocal-v0")
    assert [r[0] for r in rollouts] == [env.reset(seed=8_010_000 + i)[1]["task"] for i in range(2)]
    assert all(r[2] for r in rollouts)  # epsilon 0: the expert always wins


def test_experience_bank_seed_summary_pairs_rows_per_seed():
    eb = _load("experience_bank")
    rows = []
    for s, (w0, w300, wabl) in {1: (0, 3, 2), 2: (1, 3, 3)}.items():
        for v, u, w in ((0, True, w0), (300, True, w300), (300, False, wabl)):
            rows.append({"seed": s, "volume": v, "retrieval": u, "won": [True] * w + [False] * (4 - w)})
    text = eb.seed_summary(json.loads(json.dumps(rows)))
    # pooled success at bank 300: 6/8; bank 300 - bank 0 per seed: +0.75, +0.50; retrieval - ablation: +0.25, 0
    assert "0.750 [0.750, 0.750]" in text and "+0.625 [+0.500, +0.750]" in text
    assert "+0.125 [+0.000, +0.250]" in text and "| 1/0 " in text
