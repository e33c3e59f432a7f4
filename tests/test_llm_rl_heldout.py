"""``echorl train-llm`` ends with a held-out verdict: the seeds it states, eval.json's numbers are its episodes',
the paired differences, the verdict line, ``--eval-every`` points in curve.csv, ``eval-llm`` replaying a finished run
exactly, ``--quiet``, and evaluation that leaves training unchanged. Tiny budgets on SmolLM2 (one shared LM)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re

import numpy as np
import pytest

from tests.conftest import small_llm_policy

ENV = "EchoRL/MiniGrid-Empty-5x5-v0"
VERDICT = re.compile(r"^held-out success \((\d+) episodes\): sampled (\d\.\d\d)( → \d\.\d\d \(BC\))? → (\d\.\d\d) "
                     r"\(([+-]\d\.\d\d) \[([+-]\d\.\d\d), ([+-]\d\.\d\d)\](; RL [+-]\d\.\d\d \[[+-]\d\.\d\d, [+-]\d\.\d\d\])?\), "
                     r"greedy (\d\.\d\d)( → \d\.\d\d \(BC\))? → (\d\.\d\d) \(")


@pytest.fixture(scope="module")
def lm_and_state():
    policy = small_llm_policy(ENV, history=0, max_episode_steps=4)
    state = policy.lm.trainable_state()
    yield policy.lm, state
    policy.lm.load_trainable_state(state)


def _with_lm(monkeypatch, lm, state):
    """train-llm / eval-llm on the shared LM (every fresh run starts from the same adapter)."""
    from echorl_agent.llm_rl import train as train_mod

    real_train, real_load = train_mod.train_llm, train_mod.load_trained

    def train(cfg, lm=lm, resume=False):  # load_trained calls it too (resume=True: the run's own weights)
        if not resume:
            lm.load_trainable_state(state)
        return real_train(cfg, lm=lm, resume=resume)

    monkeypatch.setattr(train_mod, "train_llm", train)
    monkeypatch.setattr(train_mod, "load_trained", lambda out: real_load(out, lm=lm))


def _cli(*argv):
    from echorl_agent import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(list(argv)) == 0
    return out.getvalue(), err.getvalue()


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def gigpo_run(lm_and_state, tmp_path_factory):
    """A finished bc+gigpo run through the CLI from the user's own --config file, --quiet, held-out every iteration."""
    lm, state = lm_and_state
    folder = tmp_path_factory.mktemp("heldout")
    mine = folder / "mine.yaml"
    mine.write_text(f"env_id: {ENV}\nmethod: bc+gigpo\nn_envs: 2\ngroup_size: 2\ntrain_steps: 8\nmax_episode_steps: 4\n"
                    "bc_episodes: 1\nbc_epochs: 1\nlearning_rate: 0.01\neval_episodes: 2\neval_every: 1\nseed: 3\n"
                    "policy_kwargs: {lora_rank: 4}\n")
    with pytest.MonkeyPatch.context() as mp:
        _with_lm(mp, lm, state)
        stdout, stderr = _cli("train-llm", "--config", str(mine), "--out", str(folder / "run"), "--quiet")
    return folder / "run", stdout, stderr


def test_eval_json_holds_its_episodes_numbers_on_the_stated_seeds(gigpo_run):
    run, stdout, _ = gigpo_run
    res = json.loads((run / "eval.json").read_text())
    rows = _rows(run / "eval_episodes.csv")
    assert res["episodes"] == 2 and res["seeds"] == [103000, 103001]  # 100000 + 1000 * seed + ep
    assert res["modes"] == ["sampled", "greedy"]
    for phase in ("before", "after_bc", "after"):
        for mode in ("sampled", "greedy"):
            mine = [r for r in rows if r["phase"] == phase and r["mode"] == mode]
            assert [int(r["episode_seed"]) for r in mine] == res["seeds"]
            assert res[phase][mode]["success"] == np.mean([r["won"] == "1" for r in mine])
            assert res[phase][mode]["return"] == pytest.approx(np.mean([float(r["return"]) for r in mine]))
            assert all(0 < int(r["steps"]) <= 4 and len(r["actions"].split(" | ")) == int(r["steps"]) for r in mine)
    for key, start in (("paired", "before"), ("paired_rl", "after_bc")):
        for mode in ("sampled", "greedy"):
            p = res[key][mode]
            assert p["diff"] == pytest.approx(res["after"][mode]["success"] - res[start][mode]["success"])
            assert p["ci"][0] <= p["diff"] <= p["ci"][1] and p["episodes"] == 2
    from echorl_agent.llm_rl.checkpoint import read_checkpoint

    assert res["env_steps"] == read_checkpoint(run)[1]["timesteps"] >= 8  # the exact env steps, rounded up to whole iterations


def test_the_run_ends_with_the_verdict_line_after_the_files_it_wrote(gigpo_run):
    run, stdout, stderr = gigpo_run
    lines = stdout.strip().splitlines()
    res = json.loads((run / "eval.json").read_text())
    m = VERDICT.match(lines[-1])
    assert m, lines[-1]
    assert int(m[1]) == 2 and float(m[2]) == res["before"]["sampled"]["success"]
    assert float(m[4]) == res["after"]["sampled"]["success"] and m[3] and m[8]  # BC start and RL's own difference
    assert lines[-2].startswith(f"wrote {run}/: ") and all(
        f in lines[-2] for f in ("eval.json", "eval_episodes.csv", "curve.csv", "config.json", "checkpoint/"))
    assert stderr == ""  # --quiet: no first line, no bars
    steps = json.loads((run / "eval.json").read_text())["env_steps"]
    assert lines[-3] == f"trained {steps} env steps in {len(_rows(run / 'gigpo.csv'))} iterations in " + \
        lines[-3].rsplit(" in ", 1)[1] and lines[-3].endswith(" s")


def test_curve_columns_say_what_they_hold_and_eval_every_adds_heldout_rows(gigpo_run):
    run, _, _ = gigpo_run
    rows = _rows(run / "curve.csv")
    assert list(rows[0]) == ["timesteps", "success_rate", "return_mean", "episode_return", "heldout_sampled_success",
                             "heldout_greedy_success"]
    train = [r for r in rows if r["success_rate"] != ""]
    rets = [float(r["episode_return"]) for r in train]
    for i, r in enumerate(train):
        assert float(r["return_mean"]) == pytest.approx(np.mean(rets[max(0, i - 19): i + 1]))
    points = [r for r in rows if r["heldout_greedy_success"] != ""]
    gigpo = _rows(run / "gigpo.csv")
    assert [int(p["timesteps"]) for p in points] == [int(float(g["timesteps"])) for g in gigpo]  # one per iteration
    assert json.loads((run / "eval.json").read_text())["points"][-1]["heldout_greedy_success"] == float(
        points[-1]["heldout_greedy_success"])


def test_eval_llm_replays_a_finished_runs_held_out_episodes_exactly(gigpo_run, lm_and_state, monkeypatch):
    run, _, _ = gigpo_run
    lm, state = lm_and_state
    _with_lm(monkeypatch, lm, state)
    stdout, _ = _cli("eval-llm", str(run), "--quiet")
    again = [r for r in _rows(run / "eval_again_episodes.csv") if r["phase"] == "after"]
    after = [r for r in _rows(run / "eval_episodes.csv") if r["phase"] == "after"]
    assert again == after  # greedy and sampled: the trainer's generator comes back with the checkpoint
    assert VERDICT.match(stdout.strip().splitlines()[-1])
    assert json.loads((run / "eval_again.json").read_text())["paired"]["greedy"]["episodes"] == 2


def test_verdict_line_format():
    from echorl_agent.eval.verdict import verdict_line

    res = {"episodes": 20, "before": {"sampled": {"success": 0.13}, "greedy": {"success": 0.0}},
           "after": {"sampled": {"success": 0.47}, "greedy": {"success": 0.28}},
           "paired": {"sampled": {"diff": 0.34, "ci": [0.27, 0.41]}, "greedy": {"diff": 0.28, "ci": [0.19, 0.37]}}}
    assert verdict_line(res) == ("held-out success (20 episodes): sampled 0.13 → 0.47 (+0.34 [+0.27, +0.41]), "
                                 "greedy 0.00 → 0.28 (+0.28 [+0.19, +0.37])")
    assert verdict_line({"episodes": 4, "after": res["after"]}) == "held-out success (4 episodes): sampled 0.47, greedy 0.28"
    no_before = {"episodes": 40, "after_bc": {"sampled": {"success": 0.8}, "greedy": {"success": 0.9}},
                 "after": {"sampled": {"success": 0.85}, "greedy": {"success": 0.9}},
                 "paired_rl": {"sampled": {"diff": 0.05, "ci": [-0.05, 0.15]}, "greedy": {"diff": 0.0, "ci": [0.0, 0.0]}}}
    assert verdict_line(no_before) == ("held-out success (40 episodes): sampled 0.80 (BC) → 0.85 (RL +0.05 [-0.05, "
                                       "+0.15]), greedy 0.90 (BC) → 0.90 (RL +0.00 [+0.00, +0.00])")
    # imitation only (train_steps 0): the after point replays the BC policy; no "RL" difference is claimed
    assert verdict_line({**no_before, "env_steps": 0}) == ("held-out success (40 episodes): sampled 0.80 (BC), "
                                                           "greedy 0.90 (BC); no RL ran (train_steps 0)")
    assert "RL +0.05" in verdict_line({**no_before, "env_steps": 128})


def test_held_out_seeds_are_disjoint_from_training_and_stated():
    from echorl_agent.llm_rl.heldout import held_out_seeds

    assert held_out_seeds(1200, 3) == [1_300_000, 1_300_001, 1_300_002]
    assert held_out_seeds(7, 2, free_text=True) == [500_000, 500_001]
    with pytest.raises(ValueError, match="eval_episodes must be <= 1000"):
        held_out_seeds(0, 1001)


def test_bad_eval_settings_name_the_field():
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match="eval_episodes must be an int >= 0, got eval_episodes=-1"):
        LLMTrainConfig(env_id=ENV, eval_episodes=-1)
    with pytest.raises(ValueError, match="eval_every needs eval_episodes > 0"):
        LLMTrainConfig(env_id=ENV, eval_every=2)
    with pytest.raises(ValueError, match="eval_before=False skips .* method='gigpo' starts from that point"):
        LLMTrainConfig(env_id=ENV, method="gigpo", eval_episodes=2, eval_before=False)
    with pytest.raises(ValueError, match="eval_before must be True or False, got eval_before='no'"):
        LLMTrainConfig(env_id=ENV, method="bc+gigpo", eval_episodes=2, eval_before="no")
    LLMTrainConfig(env_id=ENV, method="bc+gigpo", eval_episodes=2, eval_before=False)


def test_no_eval_before_skips_the_pretrained_point_and_trains_the_same(lm_and_state, tmp_path):
    """--no-eval-before drops the "before" phase of a bc+gigpo run; BC, its held-out start of RL and RL itself are
    the same as with it (the "before" point restores the RNGs it used), and the verdict reads BC -> RL."""
    lm, state = lm_and_state
    got = {}
    for flag in ((), ("--no-eval-before",)):
        out = tmp_path / ("skip" if flag else "full")
        with pytest.MonkeyPatch.context() as mp:
            _with_lm(mp, lm, state)
            stdout, _ = _cli("train-llm", "--task", ENV, "--method", "bc+gigpo", "--n-envs", "2", "--group-size", "2",
                             "--train-steps", "8", "--max-steps", "4", "--bc-episodes", "1", "--bc-epochs", "1",
                             "--learning-rate", "0.01", "--eval-episodes", "2", "--seed", "5", "--policy-kwargs",
                             '{"lora_rank": 4}', "--out", str(out), "--quiet", *flag)
        got[bool(flag)] = (json.loads((out / "eval.json").read_text()), _rows(out / "eval_episodes.csv"),
                           _rows(out / "curve.csv"), stdout.strip().splitlines()[-1])
    (full, full_eps, full_curve, _), (skip, skip_eps, skip_curve, line) = got[False], got[True]
    assert "before" in full and "before" not in skip and "paired" not in skip
    assert {r["phase"] for r in skip_eps} == {"after_bc", "after"}
    assert [r for r in full_eps if r["phase"] != "before"] == skip_eps
    assert full_curve == skip_curve
    assert skip["paired_rl"] == full["paired_rl"]
    assert line.startswith("held-out success (2 episodes): sampled ") and "(BC) → " in line and "(RL " in line


def test_eval_env_kwargs_play_the_held_out_episodes_in_another_env(lm_and_state, tmp_path, monkeypatch):
    """``--eval-env-kwargs`` builds the held-out env with those options over ``--env-kwargs`` (GiGPO plays it in a
    batch of its own envs): here minigrid truncates every held-out episode after one step, while training plays
    the run's 4-step episodes; eval.json names the held-out env's options."""
    lm, state = lm_and_state
    _with_lm(monkeypatch, lm, state)
    run = tmp_path / "run"
    _cli("train-llm", "--task", ENV, "--method", "gigpo", "--n-envs", "2", "--group-size", "2", "--train-steps", "8",
         "--max-steps", "4", "--eval-episodes", "3", "--seed", "5", "--policy-kwargs", '{"lora_rank": 4}',
         "--eval-env-kwargs", '{"env_kwargs": {"max_steps": 1}}', "--out", str(run), "--quiet")
    res = json.loads((run / "eval.json").read_text())
    assert res["env_kwargs"] == {"env_kwargs": {"max_steps": 1}}
    rows = _rows(run / "eval_episodes.csv")
    assert len(rows) == 2 * 2 * 3 and all(r["steps"] == "1" and r["won"] == "0" for r in rows)
    episodes = [r for r in _rows(run / "curve.csv") if r["success_rate"] != ""]
    assert res["env_steps"] > len(episodes)  # training episodes run past one step (the training env's limit)
    from echorl_agent.llm_rl.heldout import HeldOutEval
    from echorl_agent.llm_rl.train import LLMTrainConfig

    cfg = LLMTrainConfig(env_id=ENV, method="bc+ppo", env_kwargs={"expert": True}, eval_episodes=1,
                         eval_env_kwargs={"env_kwargs": {"max_steps": 1}})
    env = HeldOutEval(cfg, None).env_fn()  # the PPO methods' held-out env (one at a time)
    try:
        env.reset(seed=1)
        assert env.step(0)[3] and env.unwrapped.expert  # truncated after one step; env_kwargs kept
    finally:
        env.close()
    with pytest.raises(ValueError, match="eval_env_kwargs must be a dict"):
        LLMTrainConfig(env_id=ENV, eval_env_kwargs="split=valid_unseen")
    with pytest.raises(ValueError, match="eval_env_kwargs applies to the choice-env methods"):
        LLMTrainConfig(env_id="EchoRL/Arithmetic-v0", method="grpo", bc_episodes=0,
                       eval_env_kwargs={"max_attempts": 2})


@pytest.mark.slow
def test_held_out_points_leave_training_unchanged(lm_and_state, tmp_path):
    """The same run with and without a held-out point after every iteration trains the same: the RNGs (the global
    one and the trainer's generator) come back after each point. (The evaluations before and after training are the
    studies' own, as benchmarks/gigpo_signal.py ran them: the one at the start of RL draws from the trainer's
    generator there too.) With an entropy bonus every update moves the weights, so the comparison can fail."""
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    lm, state = lm_and_state
    rows = {}
    for every in (0, 1):
        lm.load_trainable_state(state)
        cfg = LLMTrainConfig(env_id=ENV, method="gigpo", n_envs=2, group_size=2, train_steps=32, max_episode_steps=4,
                             history=1, learning_rate=1e-2, seed=21, policy_kwargs={"lora_rank": 4}, eval_episodes=2,
                             gigpo_kwargs={"ent_coef": 0.01},  # every step is learned from: weights move each update
                             eval_every=every, out=str(tmp_path / f"e{every}"))
        train_llm(cfg, lm=lm)
        rows[every] = [{k: v for k, v in r.items() if not k.endswith("_s") and k not in ("env_steps_per_s",
                                                                                          "cache_hit_rate")}
                       for r in _rows(tmp_path / f"e{every}" / "gigpo.csv")]
    assert rows[0] == rows[1]
    assert any(float(r["num_samples"]) > 0 for r in rows[0])  # something was learned, so the comparison can fail
    points = [r for r in _rows(tmp_path / "e1" / "curve.csv") if r["heldout_greedy_success"] != ""]
    assert len(points) == len(rows[1]) >= 2


def test_eval_llm_plays_the_bc_start_again_and_another_split_under_its_own_name(gigpo_run, lm_and_state,
                                                                                monkeypatch, capsys):
    run, _, _ = gigpo_run
    lm, state = lm_and_state
    _with_lm(monkeypatch, lm, state)
    own = (run / "eval.json").read_text()
    _cli("eval-llm", str(run), "--bc-start", "--prefix", "eval_bc", "--quiet")
    mine = _rows(run / "eval_bc_episodes.csv")
    theirs = _rows(run / "eval_episodes.csv")
    for phase in ("after", "after_bc"):  # greedy: the same weights on the same instances play the same episodes
        a, b = ([r for r in rows if r["phase"] == phase and r["mode"] == "greedy"] for rows in (mine, theirs))
        assert a == b and len(a) == 2, phase
    assert json.loads((run / "eval_bc.json").read_text())["paired_rl"]["greedy"]["episodes"] == 2

    _cli("eval-llm", str(run), "--eval-env-kwargs", '{"env_kwargs": {"size": 6}}', "--prefix", "eval_goal", "--quiet")
    res = json.loads((run / "eval_goal.json").read_text())  # held out in a 6x6 room
    assert res["env_kwargs"] == {"env_kwargs": {"size": 6}} and "paired" not in res  # nothing of the run's own pairs with it
    assert {r["phase"] for r in _rows(run / "eval_goal_episodes.csv")} == {"after"}
    assert (run / "eval.json").read_text() == own  # the run's own evaluation is left as it was

    from echorl_agent import cli

    for bad in ("eval", "../x"):
        with pytest.raises(SystemExit):
            cli.main(["eval-llm", str(run), "--prefix", bad])
        assert "--prefix" in capsys.readouterr().err
