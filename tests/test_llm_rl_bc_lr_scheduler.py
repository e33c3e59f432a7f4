"""The BC learning-rate schedule (``bc_lr_scheduler``): the rate each optimizer step of a clone runs at, its resume
mid-schedule and the base rate left behind. A real SmolLM2-135M policy cloning BabyAI-GoToLocal's bot."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest

import echorl_envs  # noqa: F401
from echorl_agent.llm_rl.algorithms.bc.clone import behaviour_clone, collect_expert_states, lr_factor
from echorl_envs.wrappers.llm import LLMObservationWrapper
from tests.conftest import small_llm_policy

ENV = "EchoRL/BabyAI-GoToLocal-v0"


def make_env() -> LLMObservationWrapper:
    return LLMObservationWrapper(gym.make(ENV, goal_line=True, max_episode_steps=24), history=0, max_actions=8)


def test_the_factors():
    assert [lr_factor("constant", k, 4) for k in range(4)] == [1.0] * 4
    assert [lr_factor("linear", k, 4) for k in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [round(lr_factor("cosine", k, 4), 6) for k in range(4)] == [1.0, round((1 + math.cos(math.pi / 4)) / 2, 6),
                                                                       0.5, round((1 + math.cos(3 * math.pi / 4)) / 2, 6)]
    with pytest.raises(ValueError, match="bc_lr_scheduler must be one of"):
        lr_factor("step", 0, 4)


def test_a_bad_scheduler_is_refused_naming_the_field():
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match=r"bc_lr_scheduler must be one of \('constant', 'linear', 'cosine'\), got "
                                         r"bc_lr_scheduler='exp'"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_lr_scheduler="exp")


@pytest.fixture(scope="module")
def policy():
    return small_llm_policy(ENV, history=0, max_episode_steps=24)


def _rates(policy, monkeypatch, **kw) -> list[float]:
    seen = []
    real = policy.optimizer.step

    def step(*a, **k):
        seen.append(policy.optimizer.param_groups[0]["lr"])
        return real(*a, **k)

    monkeypatch.setattr(policy.optimizer, "step", step)
    data = collect_expert_states(make_env, episodes=1, seed=11_300)
    assert len(data.actions) == 6  # 2 minibatches of 4 per epoch
    behaviour_clone(policy, data, batch_size=4, **kw)
    monkeypatch.undo()
    return seen


def test_each_step_runs_at_its_scheduled_rate_and_the_base_rate_is_left(policy, monkeypatch):
    for g in policy.optimizer.param_groups:
        g["lr"] = 2e-3
    assert _rates(policy, monkeypatch, epochs=2) == [2e-3] * 4  # constant: the rate is never touched
    linear = _rates(policy, monkeypatch, epochs=2, lr_scheduler="linear")
    assert linear == pytest.approx([2e-3, 1.5e-3, 1e-3, 0.5e-3], rel=1e-12)
    assert policy.optimizer.param_groups[0]["lr"] == 2e-3
    # a clone resumed after its first epoch continues the schedule where it was
    resumed = _rates(policy, monkeypatch, epochs=2, epochs_done=1, lr_scheduler="linear")
    assert resumed == pytest.approx([1e-3, 0.5e-3], rel=1e-12)
    cosine = _rates(policy, monkeypatch, epochs=2, lr_scheduler="cosine")
    assert cosine == pytest.approx([2e-3 * lr_factor("cosine", k, 4) for k in range(4)], rel=1e-12)
    assert policy.optimizer.param_groups[0]["lr"] == 2e-3


def test_every_saved_epoch_holds_the_base_rate(policy, monkeypatch):
    # a BC stage is saved from on_epoch: the optimizer it writes must carry the base rate (a resumed run rebuilds the
    # schedule from it), not the last step's decayed one
    for g in policy.optimizer.param_groups:
        g["lr"] = 2e-3
    at_save = []
    data = collect_expert_states(make_env, episodes=1, seed=11_300)
    behaviour_clone(policy, data, epochs=2, batch_size=4, lr_scheduler="linear",
                    on_epoch=lambda e, loss: at_save.append(policy.optimizer.param_groups[0]["lr"]))
    assert at_save == [2e-3, 2e-3]
