"""DAgger with the env's expert (``bc_dagger_rounds``): the policy plays, the expert labels the states it reached,
BC runs again on the aggregate. A real SmolLM2-135M policy on MiniGrid-Empty-5x5 (its expert plans from the full
state, so the same observation always gets the same label)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

import echorl_envs  # noqa: E402,F401
from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs  # noqa: E402

ENV = "EchoRL/MiniGrid-Empty-5x5-v0"


def make_env() -> LLMObservationWrapper:
    return LLMObservationWrapper(gym.make(ENV, max_episode_steps=8), history=0, max_actions=8)


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.policy import LLMPolicy

    env = make_env()
    try:
        return LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lora_rank=4,
                         train_layers=2)
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))


def _key(row: np.ndarray) -> str:
    state = decode_llm_obs(row)
    return state["obs"].split("\n", 1)[-1] if state["obs"].startswith("You ") else state["obs"]


def test_the_expert_labels_the_states_the_policy_reached(policy):
    from echorl_agent.llm_rl.algorithms.bc.clone import collect_expert_states
    from echorl_agent.llm_rl.algorithms.bc.dagger import collect_policy_states

    seeds = [3, 4, 5, 6]
    got = collect_policy_states(policy, make_env, seeds, n_envs=3, generator=torch.Generator().manual_seed(0))
    expert = collect_expert_states(make_env, episodes=len(seeds), seed=3)  # the same four start states
    assert got.data.episodes == 4 and len(got.data.returns) == 4
    assert got.steps == len(got.data.actions) + got.unlabelled and got.unlabelled == 0
    assert 4 <= got.steps <= 4 * 8 and got.success == got.data.successes / 4
    # the pretrained policy wanders: it reaches states the expert's own episodes never show ...
    policy_states = {_key(r): int(a) for r, a in zip(got.data.observations, got.data.actions, strict=True)}
    expert_states = {_key(r): int(a) for r, a in zip(expert.observations, expert.actions, strict=True)}
    assert set(policy_states) - set(expert_states)
    # ... and where both went, the label is the expert's action there
    shared = set(policy_states) & set(expert_states)
    assert shared and all(policy_states[k] == expert_states[k] for k in shared)
    # every label is an admissible slot of its own state
    for row, a in zip(got.data.observations, got.data.actions, strict=True):
        assert 0 <= a < len(decode_llm_obs(row)["admissible"])


def test_merge_keeps_every_state_and_label():
    from echorl_agent.llm_rl.algorithms.bc.clone import ExpertData
    from echorl_agent.llm_rl.algorithms.bc.dagger import merge_data

    a = ExpertData(np.ones((2, 4), np.uint8), np.array([0, 1]), 1, 1, [1.0])
    b = ExpertData(np.full((3, 6), 2, np.uint8), np.array([2, 2, 0]), 2, 0, [0.0, 0.0])
    m = merge_data(a, b)
    assert m.observations.shape == (5, 6) and m.observations[0].tolist() == [1, 1, 1, 1, 0, 0]
    assert m.actions.tolist() == [0, 1, 2, 2, 0] and m.episodes == 3 and m.returns == [1.0, 0.0, 0.0]


def test_dagger_seeds_are_disjoint_from_held_out_and_demonstration_seeds():
    from echorl_agent.llm_rl.algorithms.bc.dagger import dagger_seed
    from echorl_agent.llm_rl.heldout import held_out_seeds

    for seed in (0, 7, 1310, 99_999):
        dagger = {dagger_seed(seed, k, ep) for k in range(1, 10) for ep in range(1000)}
        assert len(dagger) == 9000
        assert not dagger & set(held_out_seeds(seed, 1000)) and not dagger & set(range(10_000 + seed,
                                                                                       10_000 + seed + 1000))
    with pytest.raises(ValueError, match="round=10"):
        dagger_seed(0, 10, 0)


def test_bc_with_dagger_rounds_records_each_round(policy, tmp_path):
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    state = policy.lm.trainable_state()
    try:
        cfg = LLMTrainConfig(env_id=ENV, method="bc", bc_episodes=2, bc_epochs=2, bc_learning_rate=2e-3,
                             bc_batch_size=4, bc_dagger_rounds=2, bc_dagger_episodes=3, max_episode_steps=8,
                             policy_kwargs={"lora_rank": 4}, eval_episodes=0, out=str(tmp_path))
        train_llm(cfg, lm=policy.lm)
    finally:
        policy.lm.load_trainable_state(state)
    bc = json.loads((tmp_path / "bc.json").read_text())
    assert bc["episodes"] == 2 and bc["expert_wins"] == 2 and len(bc["losses"]) == 2 * 3  # BC, then 2 rounds
    r1, r2 = bc["dagger"]
    assert [r1["round"], r2["round"]] == [1, 2]
    assert r1["states"] == bc["transitions"] + r1["labelled"] and r2["states"] == r1["states"] + r2["labelled"]
    assert r1["labelled"] + r1["unlabelled"] == r1["policy_steps"] and 3 <= r1["policy_steps"] <= 24
    assert 0.0 <= r1["policy_success"] <= 1.0 and bc["seconds"] > 0


def test_bad_dagger_settings_name_the_field():
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match="bc_dagger_rounds must be an int in 0..9, got bc_dagger_rounds=-1"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_dagger_rounds=-1)
    with pytest.raises(ValueError, match="bc_dagger_episodes.*got bc_dagger_episodes=0"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_dagger_episodes=0)
    with pytest.raises(ValueError, match="bc_dagger_rounds applies to a run with a BC warm start.*'gigpo'"):
        LLMTrainConfig(env_id=ENV, method="gigpo", bc_dagger_rounds=1)
    with pytest.raises(ValueError, match="bc_dagger_rounds applies.*'grpo'"):
        LLMTrainConfig(env_id="EchoRL/Arithmetic-v0", method="grpo", bc_dagger_rounds=1)


def test_cached_records_give_the_learner_exactly_what_fresh_ones_give_after_an_update(policy):
    # a record keeps the frozen layers' activations; BC's updates touch only the trained layers, so a state scored
    # before an update and cached gives the same learner log-probs (and loss) as the same state scored after it
    from echorl_agent.llm_rl.algorithms.bc.clone import behaviour_clone, collect_expert_states

    state = policy.lm.trainable_state()
    try:
        data = collect_expert_states(make_env, episodes=2, seed=11)
        cache: dict = {}
        first = behaviour_clone(policy, data, epochs=1, batch_size=4, cache=cache)
        assert len(cache) == len({policy._key(r) for r in data.observations}) and first[0] > 0
        cached = [cache[policy._key(r)] for r in data.observations]
        policy.recording = True
        try:
            fresh = policy.record_many(list(data.observations))  # scored under the updated weights
        finally:
            policy.recording = False
            policy.clear_store()
        with torch.no_grad():
            a = policy.learner_scores_many(cached)[0]
            b = policy.learner_scores_many(fresh)[0]
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
        assert not torch.equal(cached[0].rollout_logp, fresh[0].rollout_logp)  # the weights did move
        # a second call with the cache scores no state again
        calls = []
        orig = policy.record_many
        policy.record_many = lambda rows: calls.append(len(rows)) or orig(rows)
        try:
            behaviour_clone(policy, data, epochs=1, batch_size=4, cache=cache)
        finally:
            del policy.record_many
        assert calls == []
    finally:
        policy.lm.load_trainable_state(state)
