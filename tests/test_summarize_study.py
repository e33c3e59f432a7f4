"""benchmarks/summarize_study.py: a study's compact summary gives back its raw rows (less the action texts), and the
study scripts print the published outcome tables from the committed summaries alone."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ss = _load("summarize_study")


def _signal_rows() -> list[dict]:
    """gigpo_signal-style rows of two seeds: options on every row, episodes with actions, iterations, done."""
    rows = []
    for seed, host in ((1, "cpu A"), (2, "cpu B")):
        base = {"label": "s9", "env": "E", "lr": 0.001, "target_kl": None, "seed": seed, "cpu": host}
        for phase in ("before", "after"):
            for mode in ("stochastic", "deterministic"):
                for ep in range(3):
                    won = (seed + ep) % 2 == 0
                    rows.append({**base, "kind": "episode", "phase": phase, "mode": mode, "episode_seed": 100 + ep,
                                 "won": won, "return": 0.9 if won else 0.0, "steps": 2 + ep,
                                 "actions": ["take a from b", "move a to b", "go"][: 2 + ep % 2]})
            if phase == "before":
                rows.append({**base, "kind": "iteration", "iteration": 0, "timesteps": 0, "probe_p_expert": 0.25,
                             "probe_top_expert": 0.5, "probe_n": 4, "seconds": 1.5})
                rows.append({**base, "kind": "iteration", "iteration": 1, "timesteps": 64, "probe_p_expert": 0.3,
                             "probe_top_expert": 0.5, "num_samples": 8, "entropy": 1.1, "alignment": 0.2,
                             "n_expert": 3, "n_other": 5, "rollout_s": 9.0, "alignment_variants": {"x": 0.1}})
        rows.append({**base, "kind": "done", "timesteps": 64, "iterations": 1})
    return rows


def test_summary_expands_to_the_raw_rows_without_actions_and_timings():
    raw = _signal_rows()
    summary = ss.summarize_rows(raw)
    kinds = [r.get("summary", r.get("kind")) for r in summary]
    # per seed: shared options once, one group per phase x mode, the iterations as columns, the done row
    assert kinds == ["run", "episodes", "episodes", "iterations", "episodes", "episodes", "done"] * 2
    group = summary[1]
    assert (group["episode_seed0"], group["won"], group["steps"]) == (100, "010", [2, 3, 4])
    assert group["put_backs"] == [1, 1, 1] and group["action_counts"] == {"take a from b": 3, "move a to b": 3,
                                                                         "go": 1}
    assert summary[0]["cpu"] == "cpu A" and summary[0]["target_kl"] is None  # shared keys, None kept
    drop = ss.ITERATION_DROP | {"actions"}
    expect = sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in raw)
    got = sorted(json.dumps(r, sort_keys=True) for r in ss.expand(summary))
    assert got == expect
    it0 = next(r for r in ss.expand(summary) if r.get("iteration") == 0)
    assert "num_samples" not in it0 and "alignment" not in it0  # absent in the raw row: absent again


def test_load_rows_reads_the_raw_file_else_the_study_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(ss, "RESULTS", tmp_path)
    study = tmp_path / "study_s1"
    (study / "bc-seed1").mkdir(parents=True)
    raw = [{"method": "bc", "seed": 1, "train_s": 3.0, "mode": m, "episode_seed": 10 + e, "won": e == 0,
            "return": 1.0 if e == 0 else 0.0, "steps": 4, "actions": ["look"] * 4}
           for m in ("stochastic", "deterministic") for e in range(2)]
    raw.append({"method": "frozen", "seed": 1, "train_s": 1.0, "mode": "none"})
    (study / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    assert ss.load_rows(study) == raw  # the raw file when it is there
    ss.write_summary(study)
    (study / "episodes.jsonl").unlink()
    back = ss.load_rows(study)
    assert back == [{k: v for k, v in r.items() if k != "actions"} for r in raw]
    groups = ss.load_groups(study / "episodes.jsonl")
    assert [(g["mode"], g["won"], g["action_counts"]) for g in groups] == [
        ("stochastic", [True, False], {"look": 8}), ("deterministic", [True, False], {"look": 8})]
    assert ss.load_rows(tmp_path / "other_study") == []


def test_load_seed_jsons_from_the_summary_leaves_out_the_texts(tmp_path, monkeypatch):
    monkeypatch.setattr(ss, "RESULTS", tmp_path)
    study = tmp_path / "grpo_s1"
    (study / "arm").mkdir(parents=True)
    for seed in (2, 1):
        (study / "arm" / f"seed_{seed}.json").write_text(json.dumps(
            {"seed": seed, "wins": {"grpo": {"greedy": [1, 0]}}, "texts": {"grpo": ["x"]}, "samples": [1]}))
    ss.write_summary(study)
    for f in (study / "arm").glob("seed_*.json"):
        f.unlink()
    assert ss.load_seed_jsons(study / "arm") == [{"seed": 1, "wins": {"grpo": {"greedy": [1, 0]}}},
                                                 {"seed": 2, "wins": {"grpo": {"greedy": [1, 0]}}}]
    assert ss.load_seed_jsons(study) == []  # only the folder's own seeds


@pytest.mark.parametrize("path", sorted(p.name for p in RESULTS.glob("*.jsonl") if '"summary":' in p.read_text()))
def test_committed_summaries_are_compact_and_expand(path):
    summary = RESULTS / path
    assert summary.stat().st_size <= 200_000
    rows = ss.expand([json.loads(line) for line in summary.read_text().splitlines()])
    assert rows and all("summary" not in r and "actions" not in r for r in rows)


def test_published_tables_come_from_the_committed_summaries(capsys):
    """§26, §24 and §6's outcome tables as the studies reported them (benchmarks/RESULTS.md), from summaries only."""
    gigpo_signal = _load("gigpo_signal")
    gigpo_signal.main(["--summary", "--min-seeds", "10", "--out", str(RESULTS / "gigpo_signal_s1200.jsonl")])
    out = capsys.readouterr().out
    assert "| s26      | success (stochastic)    |      10 |            0.133 |                   0.47  | " \
           "+0.338 [+0.265, +0.410]              | holds        |" in out
    assert "+0.283 [+0.193, +0.372]" in out and "| s26      |   1203 |        20 |                0 | 5 of 20 " in out
    learning = _load("llm_rl_learning")
    learning.main(["--summary", "--reference", "bc", "--out", str(RESULTS / "llm_rl_alfworld4_s1150")])
    out = capsys.readouterr().out
    assert "| bc+ppo − bc   | deterministic |       5 |        200 | +0.28 [+0.12, +0.42]       | " \
           "[+0.21, +0.34]         |     5.6e-17 | 4/1/0" in out
    grpo = _load("llm_rl_grpo")
    grpo.main(["--summary", "--base", "pretrained", "--out", str(RESULTS / "llm_rl_grpo_s940")])
    out = capsys.readouterr().out
    assert "| env judge | sampled |      10 |     200 | 0.07 [0.06, 0.08] | 0.20 [0.18, 0.21] | " \
           "+0.131 [+0.120, +0.142]" in out
