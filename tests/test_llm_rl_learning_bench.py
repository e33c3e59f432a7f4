"""The paired BC − frozen statistics of benchmarks/llm_rl_learning.py (seed-level and episode-level)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "llm_rl_learning", Path(__file__).resolve().parents[1] / "benchmarks" / "llm_rl_learning.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _rows(method: str, seed: int, mode: str, wins: list[bool]) -> list[dict]:
    return [{"method": method, "seed": seed, "mode": mode, "episode_seed": 100_000 + 1000 * seed + ep, "won": w}
            for ep, w in enumerate(wins)]


def test_paired_pairs_by_seed_and_episode_and_counts_seeds():
    data = (_rows("frozen", 0, "stochastic", [True, False, False, False])
            + _rows("bc", 0, "stochastic", [True, True, True, True])      # seed 0: +0.75
            + _rows("frozen", 1, "stochastic", [True, True, False, False])
            + _rows("bc", 1, "stochastic", [True, True, False, False])    # seed 1: tie
            + _rows("frozen", 2, "stochastic", [True, True, True, True])
            + _rows("bc", 2, "stochastic", [False, True, True, True])     # seed 2: -0.25
            + _rows("bc", 3, "stochastic", [True] * 4)                     # no frozen rows: not paired
            + _rows("frozen", 0, "deterministic", [False] * 4))            # other mode: not paired
    p = bench.paired(data, "bc", "frozen", "stochastic")
    assert (p["seeds"], p["episodes"]) == (3, 12)
    assert p["diff"] == pytest.approx((0.75 + 0.0 - 0.25) / 3)
    assert (p["better"], p["tied"], p["worse"]) == (1, 1, 1)
    assert p["seed_ci"][0] <= p["diff"] <= p["seed_ci"][1]
    assert -0.25 <= p["seed_ci"][0] and p["seed_ci"][1] <= 0.75
    # discordant episodes: 3 where bc wins alone, 1 where frozen wins alone -> exact McNemar p = 2 * 5/16
    assert p["mcnemar_p"] == pytest.approx(0.625)
    assert bench.paired(data, "bc", "frozen", "deterministic") is None


def test_paired_all_wins_gives_a_ci_above_zero_and_a_small_p():
    data = []
    for seed in range(15):
        data += _rows("frozen", seed, "deterministic", [False] * 4) + _rows("bc", seed, "deterministic", [True] * 4)
    p = bench.paired(data, "bc", "frozen", "deterministic")
    assert p["diff"] == 1.0 and p["seed_ci"] == (1.0, 1.0) and p["episode_ci"] == (1.0, 1.0)
    assert p["better"] == 15 and p["mcnemar_p"] == pytest.approx(2 * 0.5**60)
