"""The BC warm start's stage checkpoint (``<out>/bc_stage/``): a run cut during BC resumes at the epoch it reached and
ends where the uninterrupted run ends. A real SmolLM2-135M policy on MiniGrid-Empty-5x5 with DAgger rounds."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

import echorl_envs  # noqa: E402,F401
from echorl_agent.llm_rl.algorithms.bc import stage as bc_stage  # noqa: E402
from echorl_agent.llm_rl.algorithms.bc import warm_start  # noqa: E402
from echorl_envs.wrappers.llm import LLMObservationWrapper, encode_llm_obs  # noqa: E402

ENV = "EchoRL/MiniGrid-Empty-5x5-v0"


class Cut(Exception):
    """The test's stand-in for the end of a session: raised right after a stage save."""


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.policy import LLMPolicy

    env = LLMObservationWrapper(gym.make(ENV, max_episode_steps=8), history=0, max_actions=8)
    try:
        return LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lora_rank=4,
                         train_layers=2).lm
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))


def _cfg(out, **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    return LLMTrainConfig(**{"env_id": ENV, "method": "bc", "bc_episodes": 2, "bc_epochs": 2, "bc_learning_rate": 2e-3,
                             "bc_batch_size": 4, "max_episode_steps": 8, "policy_kwargs": {"lora_rank": 4},
                             "eval_episodes": 0, "out": str(out), **kw})


def _train(lm, cfg, resume=False):
    from echorl_agent.llm_rl.train import train_llm

    train_llm(cfg, lm=lm, resume=resume)
    return {k: v.clone() for k, v in lm.trainable_state().items()}


def _cut_at_first_save(lm, cfg, monkeypatch):
    """Run ``cfg`` until its BC stage's first save, then cut it; returns the real save (to put back)."""
    real_save = bc_stage.save_stage

    def save_then_cut(*a):
        real_save(*a)
        raise Cut

    monkeypatch.setattr(warm_start, "save_stage", save_then_cut)
    with pytest.raises(Cut):
        _train(lm, cfg)
    return real_save


@pytest.fixture
def fresh(lm):
    """Give every run the pretrained adapter back (the module's runs share one loaded LM)."""
    state = {k: v.clone() for k, v in lm.trainable_state().items()}
    yield
    lm.load_trainable_state(state)


def test_packed_states_come_back_byte_for_byte():
    rows = np.stack([encode_llm_obs({"obs": text, "admissible": ["a"]}, max_bytes=512)
                     for text in ("short", "é" * 40, "x" * 2000)])  # the last fills the row: no zero byte
    assert (rows[2] != 0).all()
    flat, lengths = bc_stage._pack(rows)
    assert lengths[2] == 512 and flat.size == lengths.sum()
    np.testing.assert_array_equal(bc_stage._unpack(flat, lengths, 512), rows)


@pytest.mark.slow
@pytest.mark.parametrize("cut_after", [1, 4], ids=["mid-first-clone", "end-of-dagger-round-1"])
def test_a_run_cut_during_bc_resumes_where_it_was_and_ends_as_the_uncut_run(lm, fresh, tmp_path, monkeypatch,
                                                                           cut_after):
    rounds = {"bc_dagger_rounds": 2, "bc_dagger_episodes": 2}
    init = {k: v.clone() for k, v in lm.trainable_state().items()}
    whole = _train(lm, _cfg(tmp_path / "whole", **rounds))
    whole_bc = json.loads((tmp_path / "whole" / "bc.json").read_text())
    assert len(whole_bc["losses"]) == 2 * 3  # 2 epochs, then 2 DAgger rounds of 2

    lm.load_trainable_state(init)
    real_save, saves = bc_stage.save_stage, []

    def save_then_cut(out, run, policy, stage, gen):
        saves.append((stage.round, stage.epochs))
        real_save(out, run, policy, stage, gen)
        if len(saves) == cut_after:
            raise Cut

    monkeypatch.setattr(warm_start, "save_stage", save_then_cut)
    out = tmp_path / "cut"
    with pytest.raises(Cut):
        _train(lm, _cfg(out, **rounds))
    assert not (out / "bc.json").exists() and (out / "bc_stage" / "checkpoint.json").is_file()
    manifest = json.loads((out / "bc_stage" / "checkpoint.json").read_text())
    assert (manifest["round"], manifest["epochs_done"]) == saves[-1]

    lm.load_trainable_state({k: torch.randn_like(v) for k, v in init.items()})  # the stage must bring its weights
    monkeypatch.setattr(warm_start, "save_stage", lambda *a: saves.append((a[3].round, a[3].epochs)) or real_save(*a))
    resumed = _train(lm, _cfg(out, **rounds), resume=True)
    bc = json.loads((out / "bc.json").read_text())
    assert saves == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]  # the resumed run ran only the epochs left
    assert bc["losses"][:cut_after] == whole_bc["losses"][:cut_after]
    if cut_after == 1:  # the first clone's states are scored again in the same batches: the same run, exactly
        assert bc["losses"] == whole_bc["losses"] and bc["dagger"] == whole_bc["dagger"]
        for k, v in whole.items():
            torch.testing.assert_close(resumed[k], v, rtol=0, atol=0)
    else:  # DAgger's next round scores every state afresh (the uncut run reused round 1's): float rounding moves
        assert [r["states"] for r in bc["dagger"]] == [r["states"] for r in whole_bc["dagger"]]
        np.testing.assert_allclose(bc["losses"], whole_bc["losses"], rtol=1e-3)
        for k, v in whole.items():
            torch.testing.assert_close(resumed[k], v, rtol=1e-3, atol=1e-5)


def test_a_held_out_before_point_is_kept_and_not_played_again(lm, fresh, tmp_path, monkeypatch):
    from echorl_agent.llm_rl import heldout

    out = tmp_path / "run"
    real_save = _cut_at_first_save(lm, _cfg(out, eval_episodes=2), monkeypatch)
    before = [e for e in heldout.read_episodes(out / "eval_episodes.csv") if e.phase == "before"]
    assert len(before) == 2 * 2  # written as soon as it was played: 2 episodes x 2 modes

    played = []
    real_play = heldout.play
    monkeypatch.setattr(heldout, "play", lambda *a, **kw: played.append(a[4] if len(a) > 4 else kw.get("phase"))
                        or real_play(*a, **kw))
    monkeypatch.setattr(warm_start, "save_stage", real_save)
    _train(lm, _cfg(out, eval_episodes=2), resume=True)
    assert "before" not in played and "after" in played
    rows = heldout.read_episodes(out / "eval_episodes.csv")
    assert [e for e in rows if e.phase == "before"] == before
    assert json.loads((out / "eval.json").read_text())["before"]["sampled"]["episodes"] == 2


def test_a_stage_of_another_config_or_with_a_broken_file_is_refused(lm, fresh, tmp_path, monkeypatch):
    from echorl_agent.llm_rl.train import train_llm

    _cut_at_first_save(lm, _cfg(tmp_path), monkeypatch)
    with pytest.raises(ValueError, match="bc_epochs differs"):
        train_llm(_cfg(tmp_path, bc_epochs=3), resume=True)  # refused before any model is loaded
    (tmp_path / "bc_stage" / "stage.pt").write_bytes(b"broken")
    with pytest.raises(ValueError, match="truncated or altered|corrupt"):
        train_llm(_cfg(tmp_path), resume=True)
