"""Group RL on the LM (issue: reward teaches the LM): GiGPO advantages by hand, batched scoring across envs, the
packed learner, group rollouts from one seed, truncation-safe training."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from echorl_agent.llm_rl.advantage import (
    anchor_groups,
    center_advantages,
    discounted_returns,
    episode_advantages,
    gigpo_advantages,
)
from echorl_agent.llm_rl.rollout import Episode, Step
from tests.conftest import choice_states, small_llm_policy


def _ep(group: int, rewards: list[float], anchors: list[str]) -> Episode:
    e = Episode(group, seed=group)
    e.steps = [Step(None, 0, r, a) for r, a in zip(rewards, anchors, strict=True)]  # type: ignore[arg-type]
    return e


def test_discounted_returns_by_hand():
    np.testing.assert_allclose(discounted_returns([0, 0, 1], 0.5), [0.25, 0.5, 1.0])
    np.testing.assert_allclose(discounted_returns([1, 1], 1.0), [2.0, 1.0])


def test_equal_returns_give_zero_episode_advantage():
    eps = [_ep(0, [0, 1], ["s", "t"]), _ep(0, [1], ["s"]), _ep(1, [0], ["u"]), _ep(1, [0], ["u"])]
    adv = episode_advantages(eps)
    np.testing.assert_allclose(adv, [0, 0, 0, 0], atol=1e-12)  # group 0 returns 1, 1; group 1 returns 0, 0


def test_anchor_state_grouping_on_hand_built_trajectories():
    # group 0: three episodes; states named by letters. Episode 2 is in another group: never mixed in.
    eps = [_ep(0, [0, 0, 1], ["A", "B", "C"]),
           _ep(0, [0, 0], ["A", "D"]),
           _ep(0, [0, 0, 1], ["A", "B", "E"]),
           _ep(1, [0], ["A"])]
    groups = anchor_groups(eps)
    assert groups[(0, "A")] == [(0, 0), (1, 0), (2, 0)]
    assert groups[(0, "B")] == [(0, 1), (2, 1)]
    assert groups[(1, "A")] == [(3, 0)]
    assert all(len(v) == 1 for k, v in groups.items() if k[1] in ("C", "D", "E"))


def test_gigpo_advantages_against_a_hand_computation():
    gamma, omega = 0.5, 1.0
    eps = [_ep(0, [0, 0, 1], ["A", "B", "C"]),   # return 1
           _ep(0, [0, 0], ["A", "D"]),           # return 0
           _ep(0, [0, 1], ["A", "B"])]           # return 1
    adv = gigpo_advantages(eps, gamma=gamma, step_weight=omega)
    r = np.array([1.0, 0.0, 1.0])
    a_ep = (r - r.mean()) / (r.std() + 1e-6)
    # anchor A: returns-to-go 0.25, 0.0, 0.5 ; anchor B: 0.5 (ep 0, t 1), 1.0 (ep 2, t 1) ; the rest singletons
    ga = np.array([0.25, 0.0, 0.5])
    sa = (ga - ga.mean()) / (ga.std() + 1e-6)
    gb = np.array([0.5, 1.0])
    sb = (gb - gb.mean()) / (gb.std() + 1e-6)
    np.testing.assert_allclose(adv[0], [a_ep[0] + sa[0], a_ep[0] + sb[0], a_ep[0]], atol=1e-9)
    np.testing.assert_allclose(adv[1], [a_ep[1] + sa[1], a_ep[1]], atol=1e-9)
    np.testing.assert_allclose(adv[2], [a_ep[2] + sa[2], a_ep[2] + sb[1]], atol=1e-9)
    # omega = 0 is GRPO: the episode advantage on every step
    grpo = gigpo_advantages(eps, gamma=gamma, step_weight=0.0)
    np.testing.assert_allclose(grpo[1], [a_ep[1], a_ep[1]])
    # "mean" normalisation only centres
    mean = gigpo_advantages(eps, gamma=gamma, step_weight=0.0, normalize="mean")
    np.testing.assert_allclose(mean[0][0], 1 - 2 / 3)


def test_centring_all_steps_or_only_the_steps_with_signal_by_hand():
    # episode 0 (weight 1): advantages 1, -1; episode 1 (weight 2): 0, 0.5, 0 (two steps without signal)
    adv = [np.array([1.0, -1.0]), np.array([0.0, 0.5, 0.0])]
    w = [1.0, 2.0]
    same, m = center_advantages(adv, w, False)
    np.testing.assert_array_equal(np.concatenate(same), [1, -1, 0, 0.5, 0])
    assert m == pytest.approx((1 - 1 + 2 * 0.5) / 8)
    every, m = center_advantages(adv, w, True)  # mean over all steps, weights 1, 1, 2, 2, 2: 1 / 8
    np.testing.assert_allclose(np.concatenate(every), [0.875, -1.125, -0.125, 0.375, -0.125])
    assert m == pytest.approx(0.0, abs=1e-12)
    live, m = center_advantages(adv, w, "signal")  # mean over the 3 steps with signal, weights 1, 1, 2: 1 / 4
    np.testing.assert_allclose(np.concatenate(live), [0.75, -1.25, 0.0, 0.25, 0.0])
    assert m == pytest.approx(0.0, abs=1e-12)
    none, m = center_advantages([np.zeros(2)], [1.0], "signal")  # no signal at all: nothing to centre
    np.testing.assert_array_equal(none[0], [0.0, 0.0])
    assert m == 0.0
    with pytest.raises(ValueError, match="center_advantages must be True, False or 'signal', got center_advantages='x'"):
        center_advantages(adv, w, "x")


def test_gigpo_config_rejects_bad_input():
    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig

    with pytest.raises(ValueError, match="group_size must be >= 2"):
        GiGPOConfig(group_size=1)
    with pytest.raises(ValueError, match="free text"):
        GiGPOConfig(env_id="EchoRL/Arithmetic-v0")
    with pytest.raises(ValueError, match="gamma"):
        GiGPOConfig(gamma=1.5)
    with pytest.raises(ValueError, match="normalize"):
        GiGPOConfig(normalize="max")
    with pytest.raises(ValueError, match="ref_kl_coef"):
        GiGPOConfig(ref_kl_coef=-0.1)
    with pytest.raises(ValueError, match="target_kl"):
        GiGPOConfig(target_kl=0.0)
    with pytest.raises(ValueError, match="sample_weighting must be 'sample' or 'episode', got sample_weighting='token'"):
        GiGPOConfig(sample_weighting="token")
    with pytest.raises(ValueError, match="center_advantages must be True, False or .signal., got center_advantages=1"):
        GiGPOConfig(center_advantages=1)


def test_episode_weighting_balances_long_failures_against_short_successes():
    from echorl_agent.llm_rl.advantage import episode_sample_weights

    # a group of a 2-step success and a 6-step failure (the step limit): episode advantages +1 / -1
    eps = [_ep(0, [0, 1], ["A", "B"]), _ep(0, [0] * 6, ["A", "C", "D", "E", "F", "G"])]
    adv = gigpo_advantages(eps, gamma=0.9, step_weight=0.0)
    steps = np.concatenate(adv)
    assert steps.mean() == pytest.approx(-0.5, abs=1e-5)  # per step: (2 * 1 - 6 * 1) / 8
    assert episode_sample_weights(eps, "sample") == [1.0, 1.0]
    w = episode_sample_weights(eps, "episode")
    assert w == pytest.approx([8 / (2 * 2), 8 / (2 * 6)])  # N / (E * len)
    ws = np.concatenate([np.full(len(a), x) for a, x in zip(adv, w, strict=True)])
    assert ws.mean() == pytest.approx(1.0)  # the loss keeps its scale
    assert (ws * steps).sum() == pytest.approx(0.0, abs=1e-5)  # each episode the same total weight


# ------------------------------------------------------------------ with the real LM
ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"


@pytest.fixture(scope="module")
def policy():
    return small_llm_policy(ENV, history=2, max_episode_steps=6)


def _states(n_envs: int, steps: int, seed0: int = 0):
    return choice_states(ENV, 2, n_envs, steps, seed0)


def test_batched_scoring_equals_one_state_at_a_time(policy):
    rows = _states(2, 2)
    policy.lm.engine.cache.invalidate()
    one = [policy.record(r) for r in rows]
    policy.lm.engine.cache.invalidate()
    many = policy.record_many(rows + [rows[0]])
    for a, b in zip(one, many, strict=False):
        torch.testing.assert_close(a.rollout_logp, b.rollout_logp, atol=1e-4, rtol=0)
        assert abs(a.value - b.value) < 1e-4
        torch.testing.assert_close(a.context_states, b.context_states, atol=1e-3, rtol=1e-4)  # batch GEMM rounding
    # the duplicated state was computed once: the same captured activations object
    assert many[-1].context_states is many[0].context_states


def test_packed_learner_equals_one_record_at_a_time(policy):
    rows = _states(2, 3)  # consecutive steps of two episodes: prompts that are prefixes of later ones
    recs = policy.record_many(rows)
    from echorl_agent.llm_rl.policy import merge_prefixes

    segments = merge_prefixes(recs)
    assert len(segments) < len(recs)  # some steps share a context
    logps, values, _ = policy.learner_scores_many(recs)
    for rec, lp, v in zip(recs, logps, values, strict=True):
        lp1, v1, _ = policy.learner_scores(rec)
        torch.testing.assert_close(lp, lp1, atol=5e-5, rtol=0)
        torch.testing.assert_close(v, v1, atol=5e-5, rtol=0)
        torch.testing.assert_close(lp, rec.rollout_logp, atol=1e-3, rtol=0)  # learner == rollout engine


def test_learner_micro_batches_keep_prefix_segments_whole():
    from types import SimpleNamespace

    from echorl_agent.llm_rl.learner import Sample, _micro

    # rollout order interleaves two chains (episode 0: contexts 1-2-3 extend each other, episode 1: 7-8) and a
    # state reached by both episodes of a group (context 1 twice); consecutive chunks of 2 would split every chain
    ctx = {"a": [1], "b": [1, 2], "c": [1, 2, 3], "d": [7], "e": [7, 8], "f": [1]}
    order = ["a", "d", "b", "e", "c", "f"]
    samples = [Sample(SimpleNamespace(context=ctx[k], name=k), 0, 1.0) for k in order]  # type: ignore[arg-type]
    chunks = _micro(samples, 2)
    names = [[s.record.name for s in ch] for ch in chunks]
    assert sorted(n for ch in names for n in ch) == sorted(order)  # every sample once
    chain = next(ch for ch in names if "c" in ch)
    assert set(chain) == {"a", "b", "c", "f"}  # one segment: larger than the size, kept whole
    assert next(ch for ch in names if "e" in ch) == ["d", "e"]
    assert len(_micro(samples, 100)) == 1


def test_truncated_final_state_gets_a_value_only_record(policy):
    from echorl_agent.llm_rl.rollout import make_choice_env

    env = make_choice_env(ENV, history=2, env_kwargs={"env_kwargs": {"max_steps": 2}})  # minigrid truncates
    obs, _ = env.reset(seed=3)
    for _ in range(2):
        obs, _, terminated, truncated, info = env.step(0)  # turn left: never reaches the goal
    assert truncated and not terminated and info["admissible_actions"] == []
    rec = policy.record(obs)
    assert len(rec.cands) == 1 and np.isfinite(rec.value)
    assert policy.predict_values(torch.as_tensor(obs[None])).shape == (1, 1)


def test_group_rollout_shares_the_start_and_detects_unreproducible_seeds(policy):
    from echorl_agent.llm_rl.rollout import collect_groups, make_choice_env

    envs = [make_choice_env(ENV, history=2, max_episode_steps=4) for _ in range(4)]
    before = policy.lm.engine.stats.num_computed_tokens
    eps = collect_groups(policy, envs, [11, 12], group_size=2, generator=torch.Generator().manual_seed(0))
    assert [e.group for e in eps] == [0, 0, 1, 1] and [e.seed for e in eps] == [11, 11, 12, 12]
    assert eps[0].steps[0].anchor == eps[1].steps[0].anchor != eps[2].steps[0].anchor
    # the two copies of a group's first state were scored once (same record contents)
    assert eps[0].steps[0].record.context_states is eps[1].steps[0].record.context_states
    assert policy.lm.engine.stats.num_computed_tokens > before
    assert all(1 <= len(e.steps) <= 4 for e in eps)

    class Unseeded:  # a wrapper whose reset ignores the seed
        def __init__(self, env, salt):
            self.env, self.salt = env, salt

        def reset(self, seed=None):
            return self.env.reset(seed=seed + self.salt)

        def step(self, a):
            return self.env.step(a)

    from echorl_agent.llm_rl.rollout import anchor_key
    from echorl_envs.wrappers.llm import decode_llm_obs

    first = anchor_key(decode_llm_obs(envs[0].reset(seed=5)[0]))
    salt = next(s for s in range(1, 50) if anchor_key(decode_llm_obs(envs[1].reset(seed=5 + s)[0])) != first)
    bad = [Unseeded(envs[0], 0), Unseeded(envs[1], salt)]
    with pytest.raises(ValueError, match="seed"):
        collect_groups(policy, bad, [5], group_size=2)


def test_train_config_rejects_bad_input():
    from echorl_agent.llm_rl.algorithms.gigpo.config import gigpo_config
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match="free text|does not fit"):
        LLMTrainConfig(env_id="EchoRL/Arithmetic-v0", method="gigpo")
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        LLMTrainConfig(env_id=ENV, method="gigpo", group_size=1)
    with pytest.raises(ValueError, match="n_envs must be a multiple of group_size"):
        LLMTrainConfig(env_id=ENV, method="gigpo", n_envs=6, group_size=4)
    with pytest.raises(ValueError, match="batch_size must be >= 2 for PPO.*got batch_size=1"):
        LLMTrainConfig(env_id=ENV, method="bc+ppo", n_steps=4, batch_size=1)
    with pytest.raises(ValueError, match="batch_size must divide n_steps"):
        LLMTrainConfig(env_id=ENV, method="ppo", n_steps=10, batch_size=4)
    with pytest.raises(ValueError, match=r"gigpo_kwargs takes .*unknown: \['epoch'\]"):
        LLMTrainConfig(env_id=ENV, method="gigpo", gigpo_kwargs={"epoch": 4})
    with pytest.raises(ValueError, match="gigpo_kwargs applies to the GiGPO methods.*method='ppo'"):
        LLMTrainConfig(env_id=ENV, method="ppo", gigpo_kwargs={"epochs": 4})
    with pytest.raises(ValueError, match=r"ppo_kwargs takes .*unknown: \['clip'\]"):
        LLMTrainConfig(env_id=ENV, method="ppo", ppo_kwargs={"clip": 0.1})
    with pytest.raises(ValueError, match="ppo_kwargs applies to the PPO methods.*method='bc\\+gigpo'"):
        LLMTrainConfig(env_id=ENV, method="bc+gigpo", ppo_kwargs={"target_kl": 0.02})
    with pytest.raises(ValueError, match="ppo_kwargs applies to the PPO methods.*method='bc'"):
        LLMTrainConfig(env_id=ENV, method="bc", ppo_kwargs={"target_kl": 0.02})
    with pytest.raises(ValueError, match=r"ppo_kwargs\['target_kl'\] must be a number > 0 or None, got target_kl=0"):
        LLMTrainConfig(env_id=ENV, method="bc+ppo", ppo_kwargs={"target_kl": 0})
    with pytest.raises(ValueError, match=r"ppo_kwargs\['gae_lambda'\] must be a number in \[0, 1\], got gae_lambda=1.5"):
        LLMTrainConfig(env_id=ENV, method="ppo", ppo_kwargs={"gae_lambda": 1.5})
    with pytest.raises(ValueError, match=r"ppo_kwargs\['clip_range'\] must be a number > 0, got clip_range='0.1'"):
        LLMTrainConfig(env_id=ENV, method="ppo", ppo_kwargs={"clip_range": "0.1"})
    LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo", ppo_kwargs={"target_kl": None, "vf_coef": 0})
    with pytest.raises(ValueError, match="bc_warm_start applies to method='echorl'.*method='gigpo'"):
        LLMTrainConfig(env_id=ENV, method="gigpo", bc_warm_start=True)
    with pytest.raises(ValueError, match="bc_warm_start applies.*echorl_learner='ppo'"):
        LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo", bc_warm_start=True)
    with pytest.raises(ValueError, match="bc_warm_start must be True or False, got bc_warm_start='yes'"):
        LLMTrainConfig(env_id=ENV, method="echorl", bc_warm_start="yes")
    with pytest.raises(ValueError, match="epochs must be a positive int"):
        gigpo_config(LLMTrainConfig(env_id=ENV, method="gigpo", gigpo_kwargs={"epochs": 0}))
    # issue 26's bad input: replay outside echorl, a plan on a free-text env
    with pytest.raises(ValueError, match="replay applies to method='echorl'.*method='bc\\+gigpo'"):
        LLMTrainConfig(env_id=ENV, method="bc+gigpo", replay={"capacity": 64})
    with pytest.raises(ValueError, match="plan_tokens=2: the latent plan needs a window"):
        LLMTrainConfig(env_id="EchoRL/Arithmetic-v0", method="grpo", policy_kwargs={"plan_tokens": 2})
    from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig

    with pytest.raises(ValueError, match="plan_tokens=2: the latent plan"):
        GRPOConfig(lm={"plan_tokens": 2})


def test_gigpo_learner_options_reach_the_gigpo_config():
    from echorl_agent.llm_rl.algorithms.gigpo.config import gigpo_config
    from echorl_agent.llm_rl.train import LLMTrainConfig

    default, _ = gigpo_config(LLMTrainConfig(env_id=ENV, method="bc+gigpo", n_envs=8, group_size=4))
    assert (default.epochs, default.minibatch_size, default.ent_coef, default.groups) == (1, None, 0.0, 2)
    tuned, pk = gigpo_config(LLMTrainConfig(env_id=ENV, method="echorl", n_envs=8, group_size=4,
                                            gigpo_kwargs={"epochs": 4, "minibatch_size": 32, "clip_range": 0.1,
                                                          "ref_kl_coef": 0.05, "sample_weighting": "episode"}))
    assert (tuned.epochs, tuned.minibatch_size, tuned.clip_range, tuned.kl_coef) == (4, 32, 0.1, 0.01)
    assert tuned.ref_kl_coef == 0.05 and default.ref_kl_coef == 0.0
    assert tuned.sample_weighting == "episode" and default.sample_weighting == "sample"
    assert pk["plan_tokens"] == 2 and tuned.replay == {"capacity": 4096, "replay_memory_mb": 1024.0}


@pytest.mark.parametrize("center", [False, True, "signal"])
def test_gigpo_episode_weighting_reaches_the_learner_and_reports_the_weighted_mean_advantage(policy, monkeypatch,
                                                                                           center):
    import echorl_agent.llm_rl.algorithms.gigpo.trainer as gigpo_mod
    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer

    seen = []
    monkeypatch.setattr(gigpo_mod, "update_policy", lambda pol, samples, **kw: seen.extend(samples) or {})
    monkeypatch.setattr(policy, "sync_engine", lambda: None)
    cfg = GiGPOConfig(env_id=ENV, groups=1, group_size=2, history=1, max_episode_steps=4, seed=3, ent_coef=0.01,
                      sample_weighting="episode", center_advantages=center, lm={"lora_rank": 4})
    lrs = [g["lr"] for g in policy.optimizer.param_groups]
    try:
        tr = GiGPOTrainer(cfg, policy)  # sets the optimizer's lr to the config's
        out = tr.iteration()
    finally:
        for g, lr in zip(policy.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
    eps = tr.last_episodes
    n, e = sum(len(ep.steps) for ep in eps), len(eps)
    want = {id(st.record): n / (e * len(ep.steps)) for ep in eps for st in ep.steps}
    assert len(seen) == n  # ent_coef > 0: every step is learned from
    assert [s.weight for s in seen] == pytest.approx([want[id(s.record)] for s in seen])
    assert out["advantage_mean"] == pytest.approx(sum(s.weight * s.advantage for s in seen) / n, abs=1e-9)
    if center:  # the loss-weighted mean advantage is removed: as much push up as down
        assert out["advantage_mean"] == pytest.approx(0.0, abs=1e-9)
    # the mean before centring: GiGPO's advantages of the same episodes, weighted as the learner weighs them
    from echorl_agent.llm_rl.advantage import gigpo_advantages

    raw = gigpo_advantages(eps, cfg.gamma, cfg.step_advantage_weight, cfg.normalize)
    w = [want[id(st.record)] for ep in eps for st in ep.steps]
    assert out["advantage_mean_raw"] == pytest.approx(np.average(np.concatenate(raw), weights=w), abs=1e-9)
    if not center:
        assert out["advantage_mean_raw"] == pytest.approx(out["advantage_mean"], abs=1e-9)


def test_a_subclass_advantages_replace_gigpos_and_nothing_else(policy, monkeypatch):
    import echorl_agent.llm_rl.algorithms.gigpo.trainer as gigpo_mod
    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer

    class Fixed(GiGPOTrainer):  # +1 on every first step, -1 on the rest
        def advantages(self, episodes):
            return [np.where(np.arange(len(ep.steps)) == 0, 1.0, -1.0) for ep in episodes]

    seen = []
    monkeypatch.setattr(gigpo_mod, "update_policy", lambda pol, samples, **kw: seen.extend(samples) or {})
    monkeypatch.setattr(policy, "sync_engine", lambda: None)
    lrs = [g["lr"] for g in policy.optimizer.param_groups]
    try:
        tr = Fixed(GiGPOConfig(env_id=ENV, groups=1, group_size=2, history=1, max_episode_steps=4, seed=3,
                               positive_advantages=True, lm={"lora_rank": 4}), policy)
        tr.iteration()
    finally:
        for g, lr in zip(policy.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
    firsts = {id(ep.steps[0].record) for ep in tr.last_episodes}
    # positive_advantages still applies after the hook: only the first steps (+1) reach the learner
    assert {id(s.record) for s in seen} == firsts and [s.advantage for s in seen] == [1.0] * len(firsts)


def test_positive_advantages_learn_only_from_steps_better_than_their_group(policy, monkeypatch):
    import echorl_agent.llm_rl.algorithms.gigpo.trainer as gigpo_mod
    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer

    with pytest.raises(ValueError, match="positive_advantages must be True or False, got positive_advantages=1"):
        GiGPOConfig(positive_advantages=1)
    seen = []
    monkeypatch.setattr(gigpo_mod, "update_policy", lambda pol, samples, **kw: seen.extend(samples) or {})
    monkeypatch.setattr(policy, "sync_engine", lambda: None)
    lrs = [g["lr"] for g in policy.optimizer.param_groups]
    try:
        for seed in range(8):  # until an iteration has a group whose episodes differ in return
            seen.clear()
            cfg = GiGPOConfig(env_id=ENV, groups=2, group_size=2, history=1, max_episode_steps=6, seed=seed,
                              center_advantages=True, positive_advantages=True, lm={"lora_rank": 4})
            tr = GiGPOTrainer(cfg, policy)
            tr.iteration()
            eps = tr.last_episodes
            adv = gigpo_advantages(eps, cfg.gamma, cfg.step_advantage_weight, cfg.normalize)
            centred, _ = center_advantages(adv, [1.0] * len(eps), True)
            want = {id(st.record): float(a) for ep, ea in zip(eps, centred, strict=True)
                    for st, a in zip(ep.steps, ea, strict=True) if a > 1e-12}
            if want:
                break
    finally:
        for g, lr in zip(policy.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
    assert want and len(want) < sum(len(ep.steps) for ep in eps)  # some steps pushed up, the others dropped
    # exactly the steps with a positive centred advantage reach the learner, each with that advantage
    assert sorted(id(s.record) for s in seen) == sorted(want)
    assert [s.advantage for s in seen] == pytest.approx([want[id(s.record)] for s in seen])
    assert all(s.advantage > 0 for s in seen)


def test_reference_kl_is_exact_and_pulls_the_policy_back(policy):
    # KL(pi || pi_ref) over the candidates: 0 at the reference, equal to a hand computation from two forwards
    # away from it, and (with zero advantages) an update on it alone brings the policy back toward the reference
    from echorl_agent.llm_rl.learner import Sample, trainable_snapshot, update_policy

    recs = policy.record_many(_states(2, 2, seed0=3))
    samples = [Sample(r, 0, 0.0) for r in recs]
    state = policy.lm.trainable_state()
    try:
        with pytest.raises(ValueError, match="ref_params"):
            update_policy(policy, samples, ref_kl_coef=0.1)
        with pytest.raises(ValueError, match="ref_kl_coef must be >= 0"):
            update_policy(policy, samples, ref_kl_coef=-1.0)
        ref = trainable_snapshot(policy)
        with torch.no_grad():
            ref_lp = policy.learner_scores_many(recs)[0]
        at_ref = update_policy(policy, samples, ref_kl_coef=1.0, ref_params=ref)
        assert at_ref["ref_kl"] == pytest.approx(0.0, abs=1e-6)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():  # move away from the reference
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))
            far_lp = policy.learner_scores_many(recs)[0]
        want = np.mean([float((a.exp() * (a - b)).sum()) for a, b in zip(far_lp, ref_lp, strict=True)])
        assert want > 1e-3
        for g in policy.optimizer.param_groups:
            g["lr"] = 1e-3
        first = update_policy(policy, samples, ref_kl_coef=1.0, ref_params=ref)
        assert first["ref_kl"] == pytest.approx(want, rel=1e-3)
        # the reference pass restored the trained weights: the loss saw pi_theta, not pi_ref
        for _ in range(5):
            last = update_policy(policy, samples, ref_kl_coef=1.0, ref_params=ref)
        assert last["ref_kl"] < 0.8 * first["ref_kl"]
    finally:
        policy.lm.load_trainable_state(state)


def test_target_kl_stops_on_the_exact_kl_over_all_actions(policy):
    # approx_kl is KL(pi_old || pi_theta) over every admissible action (a hand computation from two learner
    # passes); a tiny target stops the update after its first optimizer step, none lets every epoch step
    from echorl_agent.llm_rl.learner import Sample, update_policy

    recs = policy.record_many(_states(2, 2, seed0=5))
    samples = [Sample(r, i % len(r.cands), 1.0 if i % 2 else -1.0) for i, r in enumerate(recs)]
    state = policy.lm.trainable_state()
    lrs = [g["lr"] for g in policy.optimizer.param_groups]
    try:
        with pytest.raises(ValueError, match="target_kl must be > 0"):
            update_policy(policy, samples, target_kl=-0.01)
        for g in policy.optimizer.param_groups:
            g["lr"] = 1e-2
        with torch.no_grad():
            old = policy.learner_scores_many(recs)[0]
        out = update_policy(policy, samples, epochs=3, target_kl=1e-9)
        assert out["optimizer_steps"] == 1 and out["stopped_early"] == 1
        with torch.no_grad():
            new = policy.learner_scores_many(recs)[0]
        want = np.mean([float((a.exp() * (a - b)).sum()) for a, b in zip(old, new, strict=True)])
        assert want > 1e-6  # the one step moved the policy
        assert out["approx_kl"] == pytest.approx(want, rel=1e-3, abs=1e-7)
        free = update_policy(policy, samples, epochs=3)
        assert free["optimizer_steps"] == 3 and free["stopped_early"] == 0 and free["approx_kl"] > 0
    finally:
        for g, lr in zip(policy.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
        policy.lm.load_trainable_state(state)


@pytest.mark.parametrize("method", ["ppo", pytest.param("gigpo", marks=pytest.mark.slow),
                                    pytest.param("echorl", marks=pytest.mark.slow)])
def test_train_llm_on_gotolocal_through_the_envs_own_truncation(policy, tmp_path, method):
    # BabyAI's own step limit (3 here) truncates every episode: its final state lists no admissible action
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    state = policy.lm.trainable_state()
    try:
        cfg = LLMTrainConfig(env_id="EchoRL/BabyAI-GoToLocal-v0", method=method, train_steps=6, n_envs=2,
                             group_size=2, n_steps=3, batch_size=6, n_epochs=1, history=1,
                             env_kwargs={"env_kwargs": {"max_steps": 3}}, policy_kwargs={"lora_rank": 4},
                             bc_episodes=1, bc_epochs=1, bc_warm_start=method == "echorl", out=str(tmp_path))
        train_llm(cfg, lm=policy.lm)
    finally:
        policy.lm.load_trainable_state(state)
    rows = (tmp_path / "curve.csv").read_text().splitlines()
    assert rows[0] == "timesteps,success_rate,return_mean,episode_return,heldout_sampled_success,heldout_greedy_success"
    assert len(rows) - 1 >= 2  # both envs finished (truncated) episodes of 3 steps
    assert {int(r.split(",")[0]) % 3 for r in rows[1:]} == {0}
    assert (tmp_path / "adapter").is_dir()
    if method == "echorl":  # bc_warm_start: BC on the expert's (truncated) episode ran before GiGPO
        bc = json.loads((tmp_path / "bc.json").read_text())
        assert bc["episodes"] == 1 and 1 <= bc["transitions"] <= 3 and len(bc["losses"]) == 1
        assert bc["seconds"] > 0  # the BC stage's wall time (recipe_study's wall-time axis)
    elif method == "gigpo":
        assert not (tmp_path / "bc.json").exists()


@pytest.mark.slow
def test_echorl_on_the_lm_replays_llm_transitions_with_plan_kl(policy):
    # EchoRL on the LM: real records (captured activations, plan windows) go into the hot/cold buffer, come back
    # prioritized with their activations, and are learned from together with fresh ones under the plan KL term
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer
    from echorl_agent.llm_rl.learner import Sample, update_policy
    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_agent.llm_rl.rollout import make_choice_env

    env = make_choice_env(ENV, history=2, max_episode_steps=6)
    planned = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lm=policy.lm, lora_rank=4,
                        plan_tokens=2)
    cfg = GiGPOConfig(env_id=ENV, groups=1, group_size=2, history=2, seed=5, learning_rate=1e-3, kl_coef=0.01,
                      replay={"capacity": 64, "replay_memory_mb": 64.0}, lm={"lora_rank": 4, "plan_tokens": 2})
    tr = GiGPOTrainer(cfg, planned)
    recs = planned.record_many(_states(1, 3, seed0=7))
    assert all(r.window is not None and r.context_states is not None for r in recs)
    fresh = [(0, Sample(r, i % 2, 1.0 if i % 2 else -1.0)) for i, r in enumerate(recs)]
    version = planned.lm.engine.weight_version
    tr._remember(fresh, version)
    assert len(tr.replay) == len(recs)
    replayed = tr._replayed(len(recs))
    assert len(replayed) == len(recs) and all(0 < s.weight <= 1 for s in replayed)
    assert all(s.record.context_states is not None and s.record.window is not None for s in replayed)
    assert tr.replay.stats()["hit_rate"] == 1.0  # activations kept within the budget: nothing recomputed
    state = policy.lm.trainable_state()
    try:
        before = [p.detach().clone() for p in planned.plan.parameters()]
        upd = update_policy(planned, [s for _, s in fresh] + replayed, kl_coef=0.01)
        assert upd["num_samples"] == 2 * len(recs) and np.isfinite(upd["loss"])
        assert upd["plan_kl"] > 0  # consecutive plans differ; their KL enters the loss
        assert any(not torch.equal(a, b) for a, b in zip(before, planned.plan.parameters(), strict=True))
        # every replayed item is one of the stored transitions, tokens and rollout distribution unchanged
        stored = {tuple(r.context): r for r in recs}
        for s in replayed:
            torch.testing.assert_close(s.record.rollout_logp, stored[tuple(s.record.context)].rollout_logp)
        # after the pass, a replayed item's |delta| is |A| min(pi/mu, C) (1 - pi) under the updated weights (by hand
        # from a fresh forward), no longer the |A| it entered with: learned items cool down
        tr._reprioritize(replayed)
        with torch.no_grad():
            lps = planned.learner_scores_many([s.record for s in replayed])[0]
        want = []
        for s, lp in zip(replayed, lps, strict=True):
            p, mu = math.exp(float(lp[s.action])), math.exp(float(s.record.rollout_logp[s.action]))
            want.append(abs(s.advantage) * min(p / mu, planned.cfg.is_truncation) * (1 - p))
        got = tr.replay.index.hot_td.reshape(-1)[tr._replay_slots]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        assert np.all(got < 1.0)  # every item entered with |A| = 1
    finally:
        policy.lm.load_trainable_state(state)
