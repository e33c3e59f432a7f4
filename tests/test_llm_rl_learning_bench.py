"""The paired BC − frozen statistics of benchmarks/llm_rl_learning.py (seed-level and episode-level)."""

from __future__ import annotations

import importlib.util
import json
import re
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


def test_claim_gives_a_run_to_one_live_process_and_takes_over_stale_claims(tmp_path):
    import os
    import subprocess
    import sys

    assert bench.claim(tmp_path, "bc+gigpo", 974)  # free: this process claims it
    assert (tmp_path / "bc+gigpo-seed974.claim").read_text() == str(os.getpid())
    assert bench.claim(tmp_path, "bc+gigpo", 974)  # its own claim
    (tmp_path / "bc-seed1.claim").write_text(str(os.getppid()))  # a live process holds it
    assert not bench.claim(tmp_path, "bc", 1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "bc-seed2.claim").write_text(str(dead.pid))  # its process is gone: taken over
    assert bench.claim(tmp_path, "bc", 2)
    assert (tmp_path / "bc-seed2.claim").read_text() == str(os.getpid())
    (tmp_path / "bc-seed3.claim").write_text("")  # unreadable pid: stale
    assert bench.claim(tmp_path, "bc", 3)


def test_main_skips_a_run_another_process_holds(tmp_path, monkeypatch):
    import os

    ran = []
    monkeypatch.setattr(bench, "run", lambda method, seed, args: ran.append((method, seed)))
    monkeypatch.setattr(bench, "summary", lambda args: None)
    (tmp_path / "bc-seed5.claim").write_text(str(os.getppid()))
    bench.main(["--methods", "frozen", "bc", "--seeds", "5", "--out", str(tmp_path)])
    assert ran == [("frozen", 5)]
    assert not (tmp_path / "frozen-seed5.claim").exists()  # released after the run
    assert (tmp_path / "bc-seed5.claim").exists()  # the other process's claim is left alone


def test_a_run_with_a_checkpoint_resumes_and_a_corrupt_one_starts_again(tmp_path, monkeypatch, capsys):
    from echorl_agent.llm_rl import checkpoint as ckpt
    from echorl_agent.llm_rl.train import LLMTrainConfig

    calls = []
    monkeypatch.setattr(bench, "train_llm", lambda cfg, resume=False: calls.append((cfg.checkpoint_every, resume)))
    monkeypatch.setattr(bench, "evaluate", lambda model, args, seed: [])
    monkeypatch.setattr(bench, "summary", lambda args: None)
    argv = ["--methods", "bc+gigpo", "--seeds", "5", "--train-steps", "64", "--checkpoint-every", "1",
            "--out", str(tmp_path)]
    folder = tmp_path / "bc+gigpo-seed5"

    bench.main(argv)  # nothing saved yet: a fresh run, with the period passed through
    assert calls == [(1, False)]

    (folder / "checkpoint").mkdir(parents=True)  # cut off before its manifest was written
    (tmp_path / "episodes.jsonl").unlink(missing_ok=True)
    bench.main(argv)
    assert calls[-1] == (1, False) and not (folder / "checkpoint").exists()
    assert "starting the run again" in capsys.readouterr().out

    cfg = LLMTrainConfig(env_id="EchoRL/MiniGrid-Empty-Random-5x5-v0", method="bc+gigpo", train_steps=64)
    ckpt.write_checkpoint(folder, cfg, "gigpo", {"iteration": 1, "timesteps": 32}, lambda d: (d / "x.pt").write_bytes(b"x"))
    (tmp_path / "episodes.jsonl").unlink()
    bench.main(argv)
    assert calls[-1] == (1, True)
    row = json.loads((tmp_path / "episodes.jsonl").read_text())
    assert row["resumed"] is True  # its train_s counts only the time since the resume


def test_a_run_without_evaluation_is_marked_finished_and_its_curve_counts(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bench, "train_llm", lambda cfg, resume=False: calls.append(cfg.method))
    monkeypatch.setattr(bench, "evaluate", lambda model, args, seed: [])  # --eval-episodes 0
    argv = ["--methods", "bc+gigpo", "bc+echorl", "--seeds", "5", "--train-steps", "64", "--eval-episodes", "0",
            "--out", str(tmp_path)]
    bench.main(argv)
    bench.main(argv)
    assert calls == ["bc+gigpo", "echorl"]  # the second call finds both finished and trains neither again
    rows = [json.loads(line) for line in open(tmp_path / "episodes.jsonl")]
    assert [(r["method"], r["seed"], r["mode"]) for r in rows] == [("bc+gigpo", 5, "none"), ("bc+echorl", 5, "none")]
    out = capsys.readouterr().out
    assert "| bc+gigpo" not in out and "no evaluated episodes" in out  # the markers make no success row
    for method, first in (("bc+gigpo", 21), ("bc+echorl", 20)):  # rolling success reaches 0.5 at this row
        folder = tmp_path / f"{method}-seed5"
        folder.mkdir()
        (folder / "curve.csv").write_text("timesteps,success_rate,loss\n" + "".join(
            f"{24 * i},{0.5 if i >= first else 0.2},0.0\n" for i in range(1, 22)))
    bench.target_table(bench.argparse.Namespace(out=str(tmp_path), target=0.5, target_reference="bc+gigpo",
                                                target_seeds=10))
    assert "5: 480/504" in capsys.readouterr().out  # both runs' curves are read


def test_steps_to_target_counts_finished_runs_only(tmp_path, capsys):
    # curve.csv rows: env steps, rolling success, and one more column, as train_llm writes them
    def run(method: str, seed: int, successes: list[float], finished: bool) -> None:
        d = tmp_path / f"{method}-seed{seed}"
        d.mkdir()
        rows = "".join(f"{24 * (i + 1)},{s},0.0\n" for i, s in enumerate(successes))
        (d / "curve.csv").write_text("timesteps,success_rate,loss\n" + rows)
        if finished:
            with open(tmp_path / "episodes.jsonl", "a") as f:
                f.write(json.dumps({"method": method, "seed": seed, "mode": "stochastic", "won": True}) + "\n")

    for seed in (1, 2):
        run("bc+gigpo", seed, [0.2] * 25 + [0.6], finished=True)
        run("bc+echorl", seed, [0.2] * 21 + [0.6], finished=True)
    run("bc+gigpo", 3, [0.2] * 25 + [0.6], finished=True)
    run("bc+echorl", 3, [0.2] * 20 + [0.9], finished=False)  # still training: its curve must not count
    (tmp_path / "bc+echorl-seed4.claim").write_text("123")  # a claim file beside the run folders is ignored
    args = bench.argparse.Namespace(out=str(tmp_path), target=0.5, target_reference="bc+gigpo", target_seeds=10)
    bench.target_table(args)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| bc+echorl"))
    assert "|       2 |" in line and "3:" not in line  # seeds 1 and 2 only
    assert "0.85 [0.85, 0.85]" in line  # 528 / 624 on both
    assert "partial (2 of 10 seeds)" in line  # no verdict before the registered seeds are in
    args.target_seeds = 2
    bench.target_table(args)
    assert "not established" in capsys.readouterr().out  # 0.85 is not below 0.7


def test_held_out_episodes_use_the_eval_env_options_and_pair_only_with_the_same_options():
    from echorl_envs.wrappers.llm import decode_llm_obs

    seen = []

    class FirstAction:  # a stand-in for the trained model: the test is about which env the episodes run in
        def predict(self, obs, deterministic=False):
            seen.append(json.dumps(decode_llm_obs(obs)))
            return 0, None

    argv = ["--env", "EchoRL/BabyAI-GoToLocal-v0", "--max-steps", "2", "--eval-episodes", "1"]
    args = bench.parse_args([*argv, "--eval-env-kwargs", '{"goal_line": true}'])
    rows = bench.evaluate(FirstAction(), args, seed=3)
    assert [(r["mode"], r["episode_seed"], r["steps"]) for r in rows] == [
        ("stochastic", 103_000, 2), ("deterministic", 103_000, 2)]
    assert all(r["eval_env_kwargs"] == '{"goal_line": true}' for r in rows)
    assert seen and all("Target:" in s for s in seen)  # the goal line is on in evaluation only

    seen.clear()
    plain = bench.evaluate(FirstAction(), bench.parse_args(argv), seed=3)
    assert "eval_env_kwargs" not in plain[0] and not any("Target:" in s for s in seen)

    data = [{"method": "bc", "seed": 3, **r} for r in plain] + [{"method": "bc+gigpo", "seed": 3, **r} for r in rows]
    assert bench.paired(data, "bc+gigpo", "bc", "stochastic") is None  # other options: nothing pairs up



def test_a_gigpo_trainer_plays_the_held_out_episodes_in_envs_of_the_eval_options():
    """A GiGPO trainer plays in a batch of envs; with --eval-env-kwargs those are new envs of the held-out options,
    never its training envs (whose options are the training ones)."""
    from types import SimpleNamespace

    played = []

    class GroupTrainer:  # a stand-in for a GiGPO trainer: the test is about which envs its episodes run in
        envs = ["training env 0", "training env 1", "training env 2"]

        def evaluate(self, seeds, deterministic=True, envs=None):
            played.append((list(seeds), envs))
            return [SimpleNamespace(won=False, ret=0.0, steps=[]) for _ in seeds]

    argv = ["--env", "EchoRL/BabyAI-GoToLocal-v0", "--max-steps", "2", "--eval-episodes", "2"]
    rows = bench.evaluate(GroupTrainer(), bench.parse_args([*argv, "--eval-env-kwargs", '{"goal_line": true}']), 3)
    assert len(rows) == 4 and all(r["eval_env_kwargs"] == '{"goal_line": true}' for r in rows)
    assert [seeds for seeds, _ in played] == [[103_000, 103_001]] * 2
    envs = played[0][1]
    assert len(envs) == 2 and all(e.unwrapped.goal_line for e in envs) and played[1][1] is envs
    played.clear()
    bench.evaluate(GroupTrainer(), bench.parse_args(argv), 3)  # the training options: its own envs
    assert [envs for _, envs in played] == [None, None]


def test_evaluate_saved_plays_finished_runs_again_on_other_env_options_once(tmp_path, monkeypatch, capsys):
    import echorl_agent.llm_rl.train as train_mod

    loaded = []

    class FirstAction:  # stands in for the saved run's model: the test is about which runs play where
        def predict(self, obs, deterministic=False):
            return 0, None

    monkeypatch.setattr(train_mod, "load_trained", lambda out: loaded.append(out.name) or FirstAction())
    out = tmp_path / "study"
    out.mkdir()
    trained = [{"method": "bc", "seed": 3, "train_s": 12.0, "mode": mode, "episode_seed": 103_000, "won": False,
                "return": 0.0, "steps": 2, "actions": ["turn left"] * 2} for mode in ("stochastic", "deterministic")]
    (out / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trained))
    argv = ["--env", "EchoRL/BabyAI-GoToLocal-v0", "--max-steps", "2", "--eval-episodes", "1", "--out", str(out),
            "--methods", "bc", "frozen", "--seeds", "3"]
    with pytest.raises(ValueError, match="--evaluate-saved needs --eval-env-kwargs"):
        bench.main([*argv, "--evaluate-saved"])
    bench.main([*argv, "--evaluate-saved", "--eval-env-kwargs", '{"goal_line": true}'])
    assert loaded == ["bc-seed3"]  # frozen has no finished run: skipped
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    new = rows[2:]
    assert [(r["method"], r["seed"], r["mode"], r["episode_seed"], r["eval_env_kwargs"], r["train_s"]) for r in new] == [
        ("bc", 3, m, 103_000, '{"goal_line": true}', 12.0) for m in ("stochastic", "deterministic")]
    printed = capsys.readouterr().out
    assert "held-out episodes on the training options" in printed and 'held-out episodes on {"goal_line": true}' in printed
    bench.main([*argv, "--evaluate-saved", "--eval-env-kwargs", '{"goal_line": true}'])  # already done: not again
    assert loaded == ["bc-seed3"] and len((out / "episodes.jsonl").read_text().splitlines()) == 4


def test_ppo_envs_reach_the_ppo_methods_only(tmp_path, monkeypatch):
    calls = {}
    monkeypatch.setattr(bench, "train_llm", lambda cfg, resume=False: calls.setdefault(cfg.method, cfg))
    monkeypatch.setattr(bench, "evaluate", lambda model, args, seed: [])
    monkeypatch.setattr(bench, "summary", lambda args: None)
    bench.main(["--methods", "bc", "bc+ppo", "bc+gigpo", "--seeds", "5", "--train-steps", "1024", "--ppo-envs", "8",
                "--n-envs", "4", "--group-size", "2", "--out", str(tmp_path)])
    assert {m: c.n_envs for m, c in calls.items()} == {"bc": 1, "bc+ppo": 8, "bc+gigpo": 4}
    assert calls["bc+ppo"].train_steps == 1024 and calls["bc"].train_steps == 0


def test_signal_adds_another_scripts_finished_runs_paired_by_episode(tmp_path, capsys):
    with open(tmp_path / "episodes.jsonl", "w") as f:
        for seed in (5, 6):
            for r in _rows("bc", seed, "deterministic", [False, False, True, False]):
                f.write(json.dumps({**r, "steps": 10, "train_s": 1.0}) + "\n")
    signal = tmp_path / "signal.jsonl"
    with open(signal, "w") as f:
        for seed, done in ((5, True), (6, False), (7, True)):  # 6 still training; 7 not in --out
            for phase, wins in (("before", [False, False, True, False]), ("after", [True, True, True, False])):
                for r in _rows("x", seed, "deterministic", wins):
                    f.write(json.dumps({"label": "s18", "kind": "episode", "phase": phase, "steps": 8, **r}) + "\n")
            if done:
                f.write(json.dumps({"label": "s18", "kind": "done", "seed": seed}) + "\n")
        f.write(json.dumps({"label": "other", "kind": "done", "seed": 9}) + "\n")  # not in --out
    bench.main(["--summary", "--reference", "bc", "--signal", str(signal), "s18", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert re.search(r"\| s18:after +\| deterministic +\| +1 +\| +4 +\| 0\.75", out)  # seed 5 only
    assert "s18:after − bc" in out and "+0.50 [+0.50, +0.50]" in out  # 3/4 vs 1/4 on seed 5's episodes
    assert "s18:before − bc" in out and "+0.00 [+0.00, +0.00]" in out
    with pytest.raises(ValueError, match="no finished run of label 'other'"):
        bench.main(["--summary", "--signal", str(signal), "other", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--reference must be one of"):
        bench.main(["--summary", "--reference", "s19:after", "--signal", str(signal), "s18", "--out", str(tmp_path)])


def write_checkpoint(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "steps": 10, "train_s": 1.0}) + "\n")


def test_paired_rows_over_few_seeds_are_flagged_descriptive(tmp_path, capsys):
    rows = []
    for seed, wins in ((0, [True, True, False, False]), (1, [True, False, False, False])):
        rows += _rows("bc", seed, "stochastic", [False] * 4) + _rows("bc+ppo", seed, "stochastic", wins)
    write_checkpoint(tmp_path / "episodes.jsonl", rows)
    bench.main(["--summary", "--reference", "bc", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "+0.38 [+0.25, +0.50]" in out  # two seeds: the "CI" is the range of +0.50 and +0.25
    assert "rows over 2 seed(s)" in out and "no test" in out
    rows = []
    for seed in range(5):
        rows += _rows("bc", seed, "stochastic", [False] * 4) + _rows("bc+ppo", seed, "stochastic", [True] * 4)
    write_checkpoint(tmp_path / "episodes.jsonl", rows)
    bench.main(["--summary", "--reference", "bc", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "+1.00 [+1.00, +1.00]" in out and "no test" not in out
    rows[0]["resumed"] = True  # one resumed run: the method's training time is a lower bound
    write_checkpoint(tmp_path / "episodes.jsonl", rows)
    bench.main(["--summary", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert re.search(r"\| bc +\| stochastic .*\| +≥ 1 +\|", out) and re.search(r"\| bc\+ppo +\| stochastic .*\| +1 +\|", out)


def test_trace_of_a_missing_run_names_it(tmp_path):
    with pytest.raises(ValueError, match="no finished run bc\\+ppo seed 3"):
        bench.main(["--trace", "bc+ppo", "3", "--out", str(tmp_path)])


@pytest.mark.slow
def test_trace_replays_a_sampled_evaluation_episode_on_the_runs_own_env(tmp_path, capsys):
    """A real frozen run on MiniGrid; --trace given another --env still plays the run's env (its config.json), and
    the sampled episode it replays is the one the evaluation recorded."""
    common = ["--methods", "frozen", "--seeds", "0", "--eval-episodes", "1", "--out", str(tmp_path)]
    bench.main(["--env", "EchoRL/MiniGrid-Empty-Random-5x5-v0", "--max-steps", "6", *common])
    recorded = [d for d in map(json.loads, open(tmp_path / "episodes.jsonl")) if d["mode"] == "stochastic"]
    capsys.readouterr()
    bench.main(["--trace", "frozen", "0", "--trace-mode", "stochastic", "--env", "EchoRL/BabyAI-GoToLocal-v0",
                "--eval-episodes", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "on EchoRL/MiniGrid-Empty-Random-5x5-v0" in out and "at most 6 steps" in out
    line = next(s for s in out.splitlines() if "episode seed 100000" in s)
    assert "; as recorded:" in line and f"in {recorded[0]['steps']}" in line
    assert line.split(": ", 1)[1].split(" (p=")[0].endswith(recorded[0]["actions"][0])
