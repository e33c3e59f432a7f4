"""The advantage-alignment diagnostic of benchmarks/gigpo_signal.py on hand-built episodes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

spec = importlib.util.spec_from_file_location(
    "gigpo_signal", Path(__file__).resolve().parents[1] / "benchmarks" / "gigpo_signal.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

ADM = ["turn left", "turn right", "go forward"]


def _row(admissible: list[str]) -> np.ndarray:
    raw = json.dumps({"task": "t", "obs": "o", "history": [], "h0": 0, "admissible": admissible}).encode()
    return np.frombuffer(raw, np.uint8)


def _episode(actions: list[int]):
    return SimpleNamespace(steps=[SimpleNamespace(action=a) for a in actions])


def test_expert_index_is_the_expert_slot_or_none():
    assert bench.expert_index(_row(ADM), "go forward") == 2
    assert bench.expert_index(_row(ADM), "pick up") is None
    assert bench.expert_index(_row(ADM), None) is None


def test_alignment_weights_advantages_by_agreement_with_the_expert():
    # env 0: expert says "go forward" (slot 2) at both steps; env 1: "turn left" (slot 0), then no expert
    envs = [SimpleNamespace(rows=[_row(ADM)] * 2, experts=["go forward", "go forward"]),
            SimpleNamespace(rows=[_row(ADM)] * 2, experts=["turn left", None])]
    episodes = [_episode([2, 1]), _episode([1, 0])]
    adv = [[1.0, -0.5], [2.0, 3.0]]
    got = bench.alignment(episodes, envs, adv)
    # counted: (+1 expert, A=1), (-1 other, A=-0.5), (-1 other, A=2); the step without an expert is skipped
    assert got["alignment"] == pytest.approx((1.0 + 0.5 - 2.0) / 3.5)
    assert (got["n_expert"], got["n_other"]) == (1, 2)
    assert got["adv_expert"] == pytest.approx(1.0)
    assert got["adv_other"] == pytest.approx(0.75)


def test_alignment_skips_zero_advantages_and_is_zero_without_signal():
    envs = [SimpleNamespace(rows=[_row(ADM)], experts=["turn right"])]
    got = bench.alignment([_episode([1])], envs, [[0.0]])
    assert got["alignment"] == 0.0 and got["n_expert"] == 0 and got["n_other"] == 0
