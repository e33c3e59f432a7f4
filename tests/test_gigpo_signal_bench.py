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


def test_oracle_advantages_are_plus_one_on_the_expert_action_minus_one_elsewhere():
    envs = [SimpleNamespace(rows=[_row(ADM)] * 3, experts=["go forward", "turn left", None]),
            SimpleNamespace(rows=[_row(ADM)], experts=["pick up"])]  # the expert's action is not a candidate
    got = bench.oracle_advantages([_episode([2, 1, 0]), _episode([0])], envs)
    assert [a.tolist() for a in got] == [[1.0, -1.0, 0.0], [0.0]]
    # what the trainer learns from: the hook replaces GiGPO's advantages and nothing else
    trainer = bench.OracleGiGPOTrainer.__new__(bench.OracleGiGPOTrainer)
    trainer.envs = envs
    assert [a.tolist() for a in trainer.advantages([_episode([2, 1, 0]), _episode([0])])] == [[1.0, -1.0, 0.0], [0.0]]
    assert bench.alignment([_episode([2, 1, 0]), _episode([0])], envs, got)["alignment"] == pytest.approx(1.0)


def test_summary_pairs_after_with_before_per_seed(tmp_path, capsys):
    out = tmp_path / "signal.jsonl"
    rows = []
    for seed, (p0, p1, before, after) in {1: (0.2, 0.4, [0, 0], [1, 0]), 2: (0.3, 0.3, [1, 0], [1, 1])}.items():
        rows += [{"label": "r", "seed": seed, "kind": "iteration", "iteration": 0, "probe_p_expert": p0,
                  "probe_top_expert": 0.0},
                 {"label": "r", "seed": seed, "kind": "iteration", "iteration": 3, "probe_p_expert": p1,
                  "probe_top_expert": 0.5}]
        for phase, wins in (("before", before), ("after", after)):
            rows += [{"label": "r", "seed": seed, "kind": "episode", "phase": phase, "mode": "stochastic",
                      "episode_seed": i, "won": bool(w)} for i, w in enumerate(wins)]
        rows.append({"label": "r", "seed": seed, "kind": "done"})
    rows.append({"label": "r", "seed": 3, "kind": "iteration", "iteration": 0, "probe_p_expert": 0.9,
                 "probe_top_expert": 1.0})  # not done: left out
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench.main(["--summary", "--out", str(out), "--min-seeds", "2"])
    table = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
             for line in capsys.readouterr().out.split("\n\n")[0].splitlines()[2:]}  # the first table
    assert set(table) == {("r", "probe p(expert)"), ("r", "probe argmax = expert"), ("r", "success (stochastic)")}
    seeds, before, after, diff, verdict = table["r", "probe p(expert)"][2:]
    assert (int(seeds), float(before), float(after)) == (2, 0.25, 0.35)  # seed 3 never finished: left out
    assert diff.startswith("+0.100") and verdict == "not established"  # diffs +0.2 and 0: CI reaches 0
    seeds, before, after, diff, verdict = table["r", "success (stochastic)"][2:]
    assert (float(before), float(after), diff, verdict) == (0.25, 0.75, "+0.500 [+0.500, +0.500]", "holds")
    bench.main(["--summary", "--out", str(out)])  # the default needs 10 seeds: no verdict from 2
    assert all("partial (2 of 10 seeds)" in line
               for line in capsys.readouterr().out.split("\n\n")[0].splitlines()[2:])


def _finished_seed(label: str, seed: int, before: list[int], after: list[int]) -> list[dict]:
    rows = [{"label": label, "seed": seed, "kind": "iteration", "iteration": i, "probe_p_expert": 0.3,
             "probe_top_expert": 0.0} for i in (0, 2)]
    rows += [{"label": label, "seed": seed, "kind": "episode", "phase": phase, "mode": "deterministic",
              "episode_seed": i, "won": bool(w), "steps": 3, "actions": ["go forward"] * 3}
             for phase, wins in (("before", before), ("after", after)) for i, w in enumerate(wins)]
    return rows + [{"label": label, "seed": seed, "kind": "done"}]


def test_summary_pools_two_studies_of_one_recipe_without_a_verdict(tmp_path, capsys):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in _finished_seed("a", 1, [0, 0], [1, 1])))
    second.write_text("".join(json.dumps({**r, "min_seeds": 5}) + "\n" for r in  # b registered 5 seeds
                              _finished_seed("b", 2, [0, 0], [1, 0]) + _finished_seed("b", 3, [1, 1], [1, 1])))
    bench.main(["--summary", "--out", str(second), "--also", str(first), "--pool", "a", "b", "--min-seeds", "1"])
    tables = capsys.readouterr().out.split("\n\n")
    table = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
             for line in tables[0].splitlines()[2:]}
    seeds, before, after, diff, verdict = table["a+b", "success (deterministic)"][2:]
    # per-seed differences +1 (a/1), +0.5 (b/2) and 0 (b/3): the three seeds of both files together
    assert int(seeds) == 3 and abs(float(before) - 1 / 3) < 1e-3 and abs(float(after) - 5 / 6) < 1e-3
    assert diff.startswith("+0.500") and verdict == "descriptive (pooled)"
    assert table["a", "success (deterministic)"][6] == "holds"  # each study its own verdict: a by --min-seeds
    assert table["b", "success (deterministic)"][6] == "partial (2 of 5 seeds)"  # b by the count its rows record
    per_seed = tables[2].splitlines()[3:]  # after the title, header and rule
    assert len(per_seed) == 3 and not any("a+b" in line for line in per_seed)  # each seed once, under its label
    with pytest.raises(ValueError, match="share seeds"):
        bench.pooled_rows(_finished_seed("a", 2, [0], [1]) + _finished_seed("b", 2, [0], [1]), ["a", "b"])
    with pytest.raises(ValueError, match="'c' has no rows"):
        bench.pooled_rows(_finished_seed("a", 1, [0], [1]), ["a", "c"])


def test_exact_anchors_split_aliased_observations():
    from echorl_agent.llm_rl.advantage import anchor_groups
    from echorl_agent.llm_rl.rollout import Episode, Step

    # two episodes of one group see the same text at t=1 from different positions; t=0 is the shared start
    eps = [Episode(0, 5, [Step(None, 0, 0.0, "start"), Step(None, 1, 1.0, "wall ahead")]),
           Episode(0, 5, [Step(None, 1, 0.0, "start"), Step(None, 2, 0.0, "wall ahead")])]
    envs = [SimpleNamespace(where=["(1, 1)|0|None", "(1, 2)|0|None"]),
            SimpleNamespace(where=["(1, 1)|0|None", "(2, 1)|1|None"])]
    assert sorted(len(v) for v in anchor_groups(eps).values()) == [2, 2]
    exact = bench.exact_anchors(eps, envs)
    assert sorted(len(v) for v in anchor_groups(exact).values()) == [1, 1, 2]  # only the true shared state groups
    assert [s.anchor for s in eps[0].steps] == ["start", "wall ahead"]  # the originals are untouched


def test_action_text_reads_the_admissible_list_of_the_anchor_key():
    # moved from this script into the library (train-llm's held-out player)
    from echorl_agent.llm_rl.heldout import action_text
    from echorl_agent.llm_rl.rollout import Step, anchor_key

    key = anchor_key({"obs": "You see a red ball", "admissible": ADM})
    assert action_text(Step(None, 2, 0.0, key)) == "go forward"


def test_main_skips_claimed_seeds_reruns_interrupted_ones_and_keeps_finished(tmp_path, monkeypatch):
    import os

    from benchmarks.claims import append_jsonl

    out = tmp_path / "s.jsonl"
    for row in ({"label": "x", "seed": 1, "kind": "done"},  # finished: skipped
                {"label": "x", "seed": 2, "kind": "iteration"},  # interrupted: its rows go, the seed runs again
                {"label": "y", "seed": 2, "kind": "done"},  # another recipe's row: kept
                {"label": "x", "seed": 3, "kind": "iteration"}):  # held by a live process: left alone
        append_jsonl(out, row)
    (tmp_path / "s.jsonl.x-seed3.claim").write_text(str(os.getppid()))
    ran = []

    def fake_run(args, seed, resume=False):
        ran.append((seed, [(d["label"], d["seed"]) for d in bench.read_jsonl(out)]))
        append_jsonl(out, {"label": "x", "seed": seed, "kind": "done"})

    monkeypatch.setattr(bench, "run_seed", fake_run)
    monkeypatch.setattr(bench, "summary", lambda args: None)
    bench.main(["--seeds", "1", "2", "3", "--label", "x", "--out", str(out)])
    assert ran == [(2, [("x", 1), ("y", 2), ("x", 3)])]  # seed 2's partial row was removed before its rerun
    assert [(d["label"], d["seed"], d["kind"]) for d in bench.read_jsonl(out)] == [
        ("x", 1, "done"), ("y", 2, "done"), ("x", 3, "iteration"), ("x", 2, "done")]
    assert not (tmp_path / "s.jsonl.x-seed2.claim").exists()  # released after the run
    assert (tmp_path / "s.jsonl.x-seed3.claim").exists()


def test_resume_drops_only_rows_after_the_checkpoint(tmp_path, monkeypatch):
    from benchmarks.claims import append_jsonl

    out = tmp_path / "s.jsonl"
    folder = tmp_path / "s.jsonl.x-seed2.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    for row in ({"label": "x", "seed": 2, "kind": "episode", "phase": "before"},
                {"label": "x", "seed": 2, "kind": "iteration", "iteration": 0},
                {"label": "x", "seed": 2, "kind": "iteration", "iteration": 1},
                {"label": "x", "seed": 2, "kind": "iteration", "iteration": 2},  # written after the checkpoint
                {"label": "x", "seed": 2, "kind": "episode", "phase": "after"}):
        append_jsonl(out, row)
    ran = []
    monkeypatch.setattr(bench, "resumable", lambda args, seed: 1)
    monkeypatch.setattr(bench, "run_seed", lambda args, seed, resume=False: ran.append((seed, resume)))
    monkeypatch.setattr(bench, "summary", lambda args: None)
    bench.main(["--seeds", "2", "--label", "x", "--out", str(out)])
    assert ran == [(2, True)]
    assert [(d["kind"], d.get("phase"), d.get("iteration")) for d in bench.read_jsonl(out)] == [
        ("episode", "before", None), ("iteration", None, 0), ("iteration", None, 1)]


def test_resumable_refuses_a_checkpoint_of_other_arguments(tmp_path):
    out = tmp_path / "s.jsonl"
    ap_args = ["--seeds", "2", "--label", "x", "--out", str(out)]
    args = bench.parse_args(ap_args)
    assert bench.resumable(args, 2) is None  # no checkpoint: a fresh run
    folder = bench.ckpt_dir(args, 2)
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "args.json").write_text(json.dumps({**bench.run_args(args), "lr": 0.5}))
    with pytest.raises(ValueError, match="lr differs"):
        bench.resumable(args, 2)


@pytest.mark.slow
def test_an_interrupted_seed_continues_and_computes_what_the_uninterrupted_run_computes(tmp_path, monkeypatch):
    """The real LM on GoToLocal: a run killed in its second iteration, restarted, gives the same rows as a run
    that was never interrupted (everything but seconds), and leaves no checkpoint folder behind."""
    import torch

    torch.set_num_threads(1)
    small = ["--seeds", "5", "--label", "t", "--groups", "1", "--group-size", "2", "--max-steps", "4",
             "--probe-seeds", "1", "--probe-states", "4", "--eval-episodes", "1", "--iterations", "2"]
    monkeypatch.setattr(bench, "summary", lambda args: None)
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    bench.main([*small, "--out", str(whole)])

    real = bench.gigpo_mod.GiGPOTrainer.iteration
    calls = []

    def killed_in_the_second(self):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real(self)

    monkeypatch.setattr(bench.gigpo_mod.GiGPOTrainer, "iteration", killed_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        bench.main([*small, "--out", str(cut)])
    assert bench.resumable(bench.parse_args([*small, "--out", str(cut)]), 5) == 1
    monkeypatch.setattr(bench.gigpo_mod.GiGPOTrainer, "iteration", real)
    bench.main([*small, "--out", str(cut)])

    timing = {"seconds", "rollout_s", "learner_s"}

    def rows(path):
        return [{k: v for k, v in d.items() if k not in timing} for d in bench.read_jsonl(path)]

    a, b = rows(whole), rows(cut)
    assert [d["kind"] for d in a] == [d["kind"] for d in b]
    assert [d for d in a if d["kind"] == "iteration"][-1]["iteration"] == 2
    assert a == b
    assert not bench.ckpt_dir(bench.parse_args([*small, "--out", str(cut)]), 5).exists()


def test_update_dynamics_weigh_expert_and_other_steps_and_prefer_the_logged_mean():
    rows = [{"label": "r", "seed": 1, "kind": "iteration", "iteration": 0},  # the probe before any update: skipped
            {"label": "r", "seed": 1, "kind": "iteration", "iteration": 1, "num_samples": 4, "entropy": 0.5,
             "adv_expert": 1.0, "n_expert": 1, "adv_other": -1.0, "n_other": 3},  # (1 - 3) / 4 = -0.5
            {"label": "r", "seed": 1, "kind": "iteration", "iteration": 2, "num_samples": 4, "entropy": 0.9,
             "adv_expert": 1.0, "n_expert": 1, "adv_other": -1.0, "n_other": 3, "advantage_mean": 0.25}]
    [row] = bench.dynamics(rows)
    assert row == ["r", 1, 2, "-0.125", "1 of 2", "0.70", "0.70"]  # mean of -0.5 and the logged +0.25


def test_action_shares_count_every_step_of_finished_seeds_per_mode_and_phase():
    def ep(seed, phase, mode, actions, label="r"):
        return {"label": label, "seed": seed, "kind": "episode", "phase": phase, "mode": mode, "actions": actions,
                "steps": len(actions), "won": False}

    rows = [ep(1, "before", "stochastic", ["go forward", "turn left", "go forward"]),
            ep(2, "before", "stochastic", ["turn right"]),
            ep(1, "after", "stochastic", ["go forward"] * 4),
            ep(3, "after", "stochastic", ["done"]),  # seed 3 never finished: left out
            {"label": "r", "seed": 1, "kind": "done"}, {"label": "r", "seed": 2, "kind": "done"}]
    assert bench.action_shares(rows) == [
        ["r", "stochastic", "before", 2, 2, "2.0", "go forward 50%, turn left 25%, turn right 25%"],
        ["r", "stochastic", "after", 1, 1, "4.0", "go forward 100%"]]


def test_per_seed_rows_quote_steps_updates_probe_wins_and_hosts_of_finished_seeds():
    def it(seed, i, t, p, n, cpu=None):
        return {"label": "r", "seed": seed, "kind": "iteration", "iteration": i, "timesteps": t,
                "probe_p_expert": p, "num_samples": n, **({"cpu": cpu} if cpu else {})}

    def ep(seed, phase, mode, won, cpu=None):
        return {"label": "r", "seed": seed, "kind": "episode", "phase": phase, "mode": mode, "won": won,
                **({"cpu": cpu} if cpu else {})}

    rows = [it(1, 0, 0, 0.25, 0), it(1, 1, 500, 0.3, 40, "Intel"), it(1, 2, 900, 0.2, 0, "AMD EPYC"),
            it(1, 3, 1300, 0.35, 12, "AMD EPYC"),
            ep(1, "before", "stochastic", True), ep(1, "before", "stochastic", False),
            ep(1, "after", "stochastic", True, "AMD EPYC"), ep(1, "after", "stochastic", True, "AMD EPYC"),
            {"label": "r", "seed": 1, "kind": "done"},
            it(2, 0, 0, 0.5, 0)]  # seed 2 never finished: left out
    assert bench.seed_table(rows) == [["r", 1, 1300, 2, "0.250 → 0.350", "1 → 2 of 2", "–",
                                     "AMD EPYC, Intel, not recorded"]]
