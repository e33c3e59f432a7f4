"""Resumable ``train-llm`` runs (issue 25): checkpoints written atomically, verified on load, resumed exactly (GiGPO,
echorl) or from the last update (PPO), refused on a changed config or a damaged file."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch

from tests.conftest import small_llm_policy

ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"
SEED = 21
"""With this seed (groups of 2, 4-step episodes) iteration 2 has a group with unequal returns (8 samples to learn
from); iteration 1 has none (SmolLM2 rarely reaches the goal in 4 steps). The exactness test asserts that the resumed
part learned, so it cannot pass vacuously if the seed stream (or the CPU's float rounding) changes that."""
TIMING = ("rollout_s", "learner_s", "env_steps_per_s")


@pytest.fixture(scope="module")
def lm_and_state():
    policy = small_llm_policy(ENV, history=1, max_episode_steps=4)
    state = policy.lm.trainable_state()
    yield policy.lm, state  # every fresh run below starts from this adapter
    policy.lm.load_trainable_state(state)


def _cfg(out, method="gigpo", **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    base = dict(env_id=ENV, method=method, train_steps=32, n_envs=2, group_size=2, history=1, max_episode_steps=4,
                learning_rate=1e-2, seed=SEED, policy_kwargs={"lora_rank": 4}, out=None if out is None else str(out))
    if method == "gigpo+ref":  # the KL to the start: the reference taken before the interruption must come back
        method = "gigpo"
        base.update(method=method, gigpo_kwargs={"ref_kl_coef": 0.5})
    if method == "echorl":  # replay + KL, no plan tokens (they change the prompts, and so the seed's trajectories)
        base.update(policy_kwargs={"lora_rank": 4, "plan_tokens": 0}, replay={"capacity": 64, "replay_memory_mb": 64.0})
    base.update(kw)
    return LLMTrainConfig(**base)


def _train(lm, state, cfg, resume=False):
    from echorl_agent.llm_rl.train import train_llm

    if not resume:
        lm.load_trainable_state(state)  # every fresh run starts from the same adapter
    return train_llm(cfg, lm=lm, resume=resume)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _tb_steps(folder, tag="rollout/success_rate"):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


# ------------------------------------------------------------------ a finished tiny run: layout, refusals, damage
@pytest.fixture(scope="module")
def finished(lm_and_state, tmp_path_factory):
    """One GiGPO iteration (2 one-step episodes), checkpointed at the end."""
    lm, state = lm_and_state
    out = tmp_path_factory.mktemp("finished")
    trainer = _train(lm, state, _cfg(out, train_steps=1, max_episode_steps=1))
    return out, trainer, {k: v.clone() for k, v in lm.trainable_state().items()}, state, lm


def test_checkpoint_layout_and_manifest(finished):
    out, trainer, *_ = finished
    ck = out / "checkpoint"
    manifest = json.loads((ck / "checkpoint.json").read_text())
    assert (manifest["kind"], manifest["iteration"], manifest["timesteps"], manifest["episodes"]) == ("gigpo", 1, 2, 2)
    assert manifest["config"]["method"] == "gigpo" and manifest["config"]["seed"] == SEED
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json", "policy.pt", "optimizer.pt",
            "trainer.pt"} <= set(manifest["files"])
    assert all(len(m["sha256"]) == 64 and m["size"] == (ck / f).stat().st_size for f, m in manifest["files"].items())
    # the swap left exactly one checkpoint folder
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint"]
    assert trainer.num_timesteps == 2 and len(_rows(out / "curve.csv")) == 2


def test_resume_refuses_a_changed_config_naming_the_field(finished):
    out, _, _, state, lm = finished
    with pytest.raises(ValueError, match=r"learning_rate differs \(learning_rate=0.01 in the checkpoint, 0.005 now\)"):
        _train(lm, state, _cfg(out, train_steps=4, max_episode_steps=1, learning_rate=5e-3), resume=True)
    with pytest.raises(ValueError, match=r"policy_kwargs\['lora_rank'\] differs"):
        _train(lm, state, _cfg(out, train_steps=4, max_episode_steps=1, policy_kwargs={"lora_rank": 8}), resume=True)
    with pytest.raises(ValueError, match="'gigpo' checkpoint; method 'ppo'"):
        _train(lm, state, _cfg(out, "ppo", n_steps=2, batch_size=2, max_episode_steps=1), resume=True)
    with pytest.raises(ValueError, match="'gigpo' checkpoint; method 'grpo' resumes 'grpo'"):
        _train(lm, state, _cfg(out, train_steps=4, env_id="EchoRL/Arithmetic-v0", method="grpo"), resume=True)


def test_resuming_a_finished_run_does_nothing_and_says_so(finished):
    out, _, weights, state, lm = finished
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    lm.load_trainable_state({k: v + 0.5 for k, v in weights.items()})  # the resume must load the checkpoint's adapter
    with pytest.warns(UserWarning, match="nothing to resume: .* at 2 env steps, train_steps=2"):
        trainer = _train(lm, state, _cfg(out, train_steps=2, max_episode_steps=1), resume=True)
    assert trainer.num_timesteps == 2 and trainer.num_iterations == 1 and len(trainer.history) == 1
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # nothing written


def test_load_trained_gives_a_finished_runs_model_back_without_training_or_writing(finished, tmp_path):
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer
    from echorl_agent.llm_rl.train import load_trained

    out, _, weights, _, lm = finished
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    lm.load_trainable_state({k: v + 0.5 for k, v in weights.items()})  # the load must put the run's adapter back
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading a finished run is not a resume that has nothing to do
        model = load_trained(out, lm=lm)
    assert isinstance(model, GiGPOTrainer) and (model.num_timesteps, model.num_iterations) == (2, 1)
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # nothing written
    shutil.copytree(out, tmp_path / "short")  # the same checkpoint, registered for a longer run: not finished
    manifest = json.loads((tmp_path / "short" / "checkpoint" / "checkpoint.json").read_text())
    manifest["config"]["train_steps"] = 64
    (tmp_path / "short" / "checkpoint" / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"not finished: its checkpoint is at 2 of train_steps=64 env steps"):
        load_trained(tmp_path / "short", lm=lm)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trained(tmp_path / "nothing", lm=lm)


def test_load_trained_gives_a_bc_run_back_as_the_ppo_model_it_saved(lm_and_state, tmp_path):
    from echorl_agent.llm_rl.algorithms.ppo.llm_ppo import LLMPPO
    from echorl_agent.llm_rl.train import load_trained

    lm, state = lm_and_state
    _train(lm, state, _cfg(tmp_path, "bc", train_steps=0, bc_episodes=1, bc_epochs=1, n_envs=1, n_steps=2,
                           batch_size=2))
    weights = {k: v.clone() for k, v in lm.trainable_state().items()}
    assert any(not torch.equal(weights[k], state[k]) for k in weights)  # BC moved the adapter
    lm.load_trainable_state(state)
    model = load_trained(tmp_path, lm=lm)
    assert isinstance(model, LLMPPO) and model.num_timesteps == 0
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())


def test_missing_or_damaged_checkpoints_raise_naming_the_file(finished, tmp_path):
    out, _, _, state, lm = finished
    cfg = lambda d: _cfg(d, train_steps=4, max_episode_steps=1)  # noqa: E731
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'empty' / 'checkpoint'} does not exist"):
        _train(lm, state, cfg(tmp_path / "empty"), resume=True)
    with pytest.raises(ValueError, match="resume needs the output folder"):
        _train(lm, state, _cfg(None), resume=True)

    def damaged(name, damage):
        d = tmp_path / name
        shutil.copytree(out, d)
        damage(d / "checkpoint")
        return cfg(d)

    def truncate(ck):
        p = ck / "trainer.pt"
        p.write_bytes(p.read_bytes()[:-100])

    def flip(ck):
        p = ck / "adapter" / "adapter_model.safetensors"
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 1
        p.write_bytes(bytes(b))

    with pytest.raises(ValueError, match=r"trainer\.pt is truncated"):
        _train(lm, state, damaged("truncated", truncate), resume=True)
    with pytest.raises(ValueError, match=r"adapter_model\.safetensors is corrupt"):
        _train(lm, state, damaged("flipped", flip), resume=True)
    with pytest.raises(ValueError, match=r"checkpoint\.json is missing"):
        _train(lm, state, damaged("no-manifest", lambda ck: (ck / "checkpoint.json").unlink()), resume=True)
    with pytest.raises(ValueError, match=r"optimizer\.pt is missing"):
        _train(lm, state, damaged("no-optimizer", lambda ck: (ck / "optimizer.pt").unlink()), resume=True)
    # a crash between the two renames of a save leaves checkpoint.old/ complete: a resume uses it, and says so
    d = tmp_path / "mid-swap"
    shutil.copytree(out, d)
    (d / "checkpoint").rename(d / "checkpoint.old")
    with pytest.warns(UserWarning, match="checkpoint.old is complete"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="nothing to resume")
        assert _train(lm, state, _cfg(d, train_steps=2, max_episode_steps=1), resume=True).num_timesteps == 2


# ------------------------------------------------------------------ exactness: interrupted + resumed == uninterrupted
def _assert_same_history(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if k not in TIMING and k != "cache_hit_rate":  # wall clock; cache hits (the cache is empty after a resume)
                assert x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])), (k, x[k], y[k])


@pytest.mark.slow
@pytest.mark.parametrize(("method", "stop"), [("gigpo", 8), ("echorl", 16), ("gigpo+ref", 16)])
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(lm_and_state, tmp_path, method, stop):
    # gigpo: interrupted after iteration 1 (no update yet), so the update of iteration 2 runs after the resume;
    # echorl: interrupted after iteration 2's update, so the resumed run's updates replay the buffer's items with the
    # restored Adam moments; gigpo+ref: interrupted after iteration 2's update, so a resumed run that took its
    # reference from the checkpoint's weights (not the start's) would learn differently. The uninterrupted run checkpoints at the same iteration (a save empties the prefix
    # cache as a resume does; see algorithms.gigpo.checkpoint.save_gigpo).
    lm, state = lm_and_state
    every = stop // 8
    a = _train(lm, state, _cfg(tmp_path / "a", method, checkpoint_every=every))
    wa = lm.trainable_state()
    opt_a = a.policy.optimizer.state_dict()
    first = _train(lm, state, _cfg(tmp_path / "b", method, train_steps=stop, checkpoint_every=every))
    assert first.num_timesteps == stop
    at_checkpoint = lm.trainable_state()
    b = _train(lm, state, _cfg(tmp_path / "b", method, checkpoint_every=every), resume=True)
    wb = lm.trainable_state()

    assert b.num_timesteps == a.num_timesteps == 32 and b.num_iterations == a.num_iterations == 4
    assert b.episodes_done == a.episodes_done
    _assert_same_history(a.history, b.history)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit for bit
    assert any(not torch.equal(at_checkpoint[k], wb[k]) for k in wb)  # and the resumed part did learn
    for sa, sb in zip(opt_a["state"].values(), b.policy.optimizer.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    if method == "gigpo+ref":
        assert all(torch.equal(x, y) for x, y in zip(a.ref_params, b.ref_params, strict=True))
        assert sum(h["ref_kl"] > 0 for h in b.history[2:]) > 0  # the resumed updates moved away from the start
    if method == "echorl":
        assert b.replay.stats() == pytest.approx(a.replay.stats(), nan_ok=True) and len(b.replay) == len(a.replay) > 0
        assert sum(h["replayed"] for h in b.history[2:]) > 0
    # the output files hold the whole run: curve.csv identical, gigpo.csv equal but for wall-clock columns
    assert (tmp_path / "b" / "curve.csv").read_text() == (tmp_path / "a" / "curve.csv").read_text()
    ra, rb = _rows(tmp_path / "a" / "gigpo.csv"), _rows(tmp_path / "b" / "gigpo.csv")
    assert [{k: v for k, v in r.items() if k not in TIMING + ("cache_hit_rate",)} for r in rb] == \
           [{k: v for k, v in r.items() if k not in TIMING + ("cache_hit_rate",)} for r in ra]
    # TensorBoard goes on at the checkpoint's env step: every iteration logged once
    assert _tb_steps(tmp_path / "b" / "tb") == _tb_steps(tmp_path / "a" / "tb") == [int(h["timesteps"]) for h in a.history]


# ------------------------------------------------------------------ PPO: SB3 save/load, reset_num_timesteps=False
def test_ppo_resume_continues_from_the_last_update(lm_and_state, tmp_path):
    lm, state = lm_and_state
    kw = dict(n_envs=1, n_steps=2, batch_size=2, n_epochs=1, max_episode_steps=1, checkpoint_every=1)
    model = _train(lm, state, _cfg(tmp_path, "ppo", train_steps=2, **kw))
    saved = {k: v.clone() for k, v in model.policy.state_dict().items()}
    assert model.num_timesteps == 2 and len(_rows(tmp_path / "curve.csv")) == 2
    # resuming at the budget restores, trains nothing
    lm.load_trainable_state(state)
    with pytest.warns(UserWarning, match="nothing to resume"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PPO resumes")
        same = _train(lm, state, _cfg(tmp_path, "ppo", train_steps=2, **kw), resume=True)
    assert all(torch.equal(saved[k], v) for k, v in same.policy.state_dict().items())  # value head, adapter
    assert same.num_timesteps == 2 and same._n_updates == model._n_updates == 1
    opt_a, opt_b = model.policy.optimizer.state_dict()["state"], same.policy.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys() and all(torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"]) for i in opt_a)
    # resuming with a larger budget goes on from step 2: curve rows kept, one more update, TensorBoard run reused
    with pytest.warns(UserWarning, match="not exactly: the envs' states are not saved"):
        more = _train(lm, state, _cfg(tmp_path, "ppo", train_steps=4, **kw), resume=True)
    assert more.num_timesteps == 4 and more._n_updates == 2
    assert [int(r["timesteps"]) for r in _rows(tmp_path / "curve.csv")] == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["llm_1"]
    assert _tb_steps(tmp_path / "tb" / "llm_1", "time/fps") == [2, 4]
    assert json.loads((tmp_path / "checkpoint" / "checkpoint.json").read_text())["timesteps"] == 4
    np.testing.assert_equal(len(more.policy.state_dict()), len(saved))


def test_ppo_kwargs_reach_the_update_and_target_kl_ends_its_epochs(lm_and_state, tmp_path):
    lm, state = lm_and_state
    kw = dict(n_envs=1, n_steps=4, batch_size=2, n_epochs=3, max_episode_steps=2, learning_rate=5e-2)
    free = _train(lm, state, _cfg(None, "ppo", train_steps=4, **kw))
    assert free._n_updates == 3 and free.target_kl is None and free.clip_range(1.0) == 0.2  # SB3's defaults
    # the first minibatch is on-policy (its KL ~0, below any bound); after its step the policy moved, so a tiny
    # target_kl stops the update inside the first epoch
    stopped = _train(lm, state, _cfg(None, "ppo", train_steps=4, ppo_kwargs={"target_kl": 1e-9, "clip_range": 0.1,
                                                                              "gae_lambda": 0.9}, **kw))
    assert stopped._n_updates == 1 and stopped.target_kl == 1e-9 and stopped.gae_lambda == 0.9
    assert stopped.clip_range(1.0) == 0.1
    assert stopped.logger.name_to_value["train/approx_kl"] > 1.5e-9
    roomy = _train(lm, state, _cfg(None, "ppo", train_steps=4, ppo_kwargs={"target_kl": 1e6}, **kw))
    assert roomy._n_updates == 3


def test_a_checkpoint_written_before_ppo_kwargs_existed_resumes(lm_and_state, tmp_path):
    """Fields added later (``ppo_kwargs``, a dict field) count as their defaults in an older checkpoint."""
    from echorl_agent.llm_rl.checkpoint import check_config

    lm, state = lm_and_state
    cfg = _cfg(tmp_path, "ppo", train_steps=2, n_envs=1, n_steps=2, batch_size=2, n_epochs=1, max_episode_steps=1)
    saved = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    del saved["ppo_kwargs"]
    check_config(saved, cfg, tmp_path)  # no error
    with pytest.raises(ValueError, match=r"ppo_kwargs\['target_kl'\] differs \(ppo_kwargs\['target_kl'\]='<unset>'"):
        check_config(saved, dataclasses.replace(cfg, ppo_kwargs={"target_kl": 0.02}), tmp_path)
    from echorl_agent import cli

    with pytest.raises(SystemExit, match="echorl train-llm: ppo_kwargs applies to the PPO methods.*method='bc'"):
        cli.main(["train-llm", "--task", ENV, "--method", "bc", "--ppo-kwargs", '{"target_kl": 0.02}',
                  "--out", str(tmp_path / "cli")])


def test_cli_resume_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    from echorl_agent import cli

    with pytest.raises(SystemExit):
        cli.main(["train-llm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--resume continue the run in OUT from OUT/checkpoint/" in text
    assert "--checkpoint-every N write OUT/checkpoint/ every N iterations" in text and "(default: 10)" in text
    with pytest.raises(SystemExit, match=f"no checkpoint to resume from: {tmp_path / 'checkpoint'} does not exist"):
        cli.main(["train-llm", "--task", ENV, "--method", "gigpo", "--group-size", "2", "--resume",
                  "--out", str(tmp_path)])


@pytest.mark.slow
def test_grpo_resumes_exactly(lm_and_state, tmp_path):
    # 2 GRPO steps straight vs 1 step, a checkpoint, and a resumed second step: same completions, same weights
    lm, state = lm_and_state
    kw = dict(env_id="EchoRL/Arithmetic-v0", method="grpo", bc_episodes=1, bc_epochs=1, checkpoint_every=1, learning_rate=1e-2,
              grpo_kwargs={"group_size": 2, "prompts_per_step": 1, "max_tokens": 4, "lr": 1e-2})
    straight = _train(lm, state, _cfg(tmp_path / "a", train_steps=4, **kw))
    w_straight = {k: v.clone() for k, v in lm.trainable_state().items()}
    _train(lm, state, _cfg(tmp_path / "b", train_steps=2, **kw))
    manifest = json.loads((tmp_path / "b" / "checkpoint" / "checkpoint.json").read_text())
    assert (manifest["kind"], manifest["iteration"], manifest["timesteps"]) == ("grpo", 1, 2)
    assert {"lm.pt", "optimizer.pt", "grpo.pt", "adapter/adapter_model.safetensors"} <= set(manifest["files"])
    lm.load_trainable_state({k: v + 0.5 for k, v in state.items()})  # the resume must load the checkpoint's weights
    resumed = _train(lm, state, _cfg(tmp_path / "b", train_steps=4, **kw), resume=True)
    assert resumed.num_steps == straight.num_steps == 2
    assert any(not torch.equal(w_straight[k], state[k]) for k in state)  # the steps really updated the weights
    assert all(torch.equal(w_straight[k], v) for k, v in lm.trainable_state().items())
    assert [h["reward_mean"] for h in resumed.history] == [h["reward_mean"] for h in straight.history]
    assert _rows(tmp_path / "a" / "curve.csv") == _rows(tmp_path / "b" / "curve.csv")


def test_gigpo_rows_of_a_run_resumed_from_an_older_checkpoint_gain_the_new_columns(tmp_path):
    # rows restored from a checkpoint written before a statistic existed lack its key; later rows have it
    from types import SimpleNamespace

    from echorl_agent.llm_rl.algorithms.gigpo.run import write_gigpo_rows

    trainer = SimpleNamespace(episodes_done=[(4, True, 1.0)],
                              history=[{"iteration": 1.0, "loss": 0.5}, {"iteration": 2.0, "loss": 0.25,
                                                                          "advantage_mean": -0.1}])
    write_gigpo_rows(trainer, tmp_path)
    lines = (tmp_path / "gigpo.csv").read_text().splitlines()
    assert lines == ["iteration,loss,advantage_mean", "1.0,0.5,", "2.0,0.25,-0.1"]
