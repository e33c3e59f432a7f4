"""``train-llm --init-from RUN_DIR``: an earlier run's LoRA adapter starts a new run in place of its BC warm start
(BC once, RL variants from it). A real SmolLM2-135M policy on MiniGrid-Empty-5x5."""

from __future__ import annotations

import csv
import json

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

from tests.conftest import small_llm_policy  # noqa: E402

ENV = "EchoRL/MiniGrid-Empty-5x5-v0"


@pytest.fixture(scope="module")
def lm():
    policy = small_llm_policy(ENV, history=0, max_episode_steps=6)
    state = {k: v.clone() for k, v in policy.lm.trainable_state().items()}
    yield policy.lm, state
    policy.lm.load_trainable_state(state)


def _cfg(out, **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    return LLMTrainConfig(**{"env_id": ENV, "method": "bc+gigpo", "bc_episodes": 2, "bc_epochs": 2,
                             "bc_learning_rate": 2e-3, "bc_batch_size": 4, "train_steps": 0, "max_episode_steps": 6,
                             "n_envs": 2, "group_size": 2, "policy_kwargs": {"lora_rank": 4}, "eval_episodes": 2,
                             "eval_before": False, "seed": 5, "out": str(out), **kw})


def _greedy(run, phase):
    with open(run / "eval_episodes.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["phase"] == phase and r["mode"] == "greedy"]


def test_a_run_started_from_another_runs_adapter_skips_bc_and_plays_that_start(lm, tmp_path):
    from echorl_agent.llm_rl.train import train_llm

    model, pretrained = lm
    model.load_trainable_state(pretrained)
    train_llm(_cfg(tmp_path / "bc"), lm=model)
    cloned = {k: v.clone() for k, v in model.trainable_state().items()}
    assert any(not torch.equal(cloned[k], pretrained[k]) for k in cloned)  # BC moved the adapter

    model.load_trainable_state(pretrained)
    train_llm(_cfg(tmp_path / "rl", init_from=str(tmp_path / "bc")), lm=model)
    bc = json.loads((tmp_path / "rl" / "bc.json").read_text())
    assert bc == {"init_from": str(tmp_path / "bc"), "losses": [], "seconds": 0.0}  # nothing was cloned
    for k, v in model.trainable_state().items():  # no RL ran: the run ends where it started, the loaded adapter
        torch.testing.assert_close(v, cloned[k], rtol=0, atol=0)
    assert _greedy(tmp_path / "rl", "after_bc") == _greedy(tmp_path / "bc", "after_bc") != []


def test_a_start_that_does_not_fit_is_refused_naming_why(lm, tmp_path):
    from echorl_agent.llm_rl.train import train_llm

    model, pretrained = lm
    model.load_trainable_state(pretrained)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="adapter_model.safetensors is missing"):
        train_llm(_cfg(tmp_path / "a", init_from=str(tmp_path / "empty")), lm=model)
    folder = tmp_path / "other" / "adapter"
    folder.mkdir(parents=True)
    from safetensors.torch import save_file

    wrong = {k: torch.zeros(v.shape[0] * 2, *v.shape[1:]) for k, v in pretrained.items()}  # another rank
    save_file(wrong, str(folder / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="does not fit this run's policy"):
        train_llm(_cfg(tmp_path / "b", init_from=str(tmp_path / "other")), lm=model)
    with pytest.raises(ValueError, match="init_from replaces the start"):
        _cfg(tmp_path / "c", init_from=str(tmp_path / "other"), bc_noise=0.1)
