"""The prompt levers of the LLM policy (issue 89, item 4): fewer tokens prefilled per env step, same log-probs.

Every lever is opt-in (its default keeps the prompts and candidates every recipe was measured with). Each is checked
on a fixed BabyAI-GoToLocal state sequence (goal line, as the gotolocal-rl recipe): the exact tokens it saves,
counted by the engine (``num_computed_tokens``), and that the learner's log-probs still equal the rollout engine's
(the truncated IS weights stay 1) and a full HF forward of each prompt + candidate.
"""

from __future__ import annotations

import pytest
import torch

import echorl_envs  # noqa: F401
from echorl_envs.wrappers.llm import decode_llm_obs
from tests.conftest import small_llm_policy

ENV = "EchoRL/BabyAI-GoToLocal-v0"


@pytest.fixture(scope="module")
def base():
    return small_llm_policy(ENV, history=0, max_episode_steps=24)


def policy_like(base, **kw):
    """A policy on ``base``'s LM (and its engine) with other :class:`LLMPolicyConfig` options."""
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.policy import LLMPolicy

    p = LLMPolicy(base.observation_space, base.action_space, ConstantSchedule(1e-3), lm=base.lm, lora_rank=4,
                  max_kv_tokens=8192, **kw)
    p.value_head.load_state_dict(base.value_head.state_dict())
    return p


def gotolocal_states(history: int, steps: int = 5, seed: int = 3, actions: list[int] | None = None) -> list:
    """One GoToLocal episode (goal line) under the fixed actions ``t % 3`` (turn left, turn right, go forward) or
    ``actions``; it does not end within the steps taken."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    env = make_choice_env(ENV, history=history, max_episode_steps=24, env_kwargs={"goal_line": True})
    obs, _ = env.reset(seed=seed)
    rows = [obs]
    for t in range(steps if actions is None else len(actions)):
        obs, _, terminated, truncated, _ = env.step(t % 3 if actions is None else actions[t])
        assert not (terminated or truncated)
        rows.append(obs)
    return rows


def computed_tokens(policy, rows) -> int:
    """Tokens the engine prefills to score ``rows`` one step at a time from an empty prefix cache."""
    engine = policy.lm.engine
    engine.cache.invalidate()
    c0 = engine.stats.num_computed_tokens
    for r in rows:
        policy.record(r)
    return engine.stats.num_computed_tokens - c0


def hf_action_logprobs(model, prompt, cands):
    out = []
    with torch.no_grad():
        for c in cands:
            lp = torch.log_softmax(model(torch.tensor([prompt + c])).logits[0].float(), -1)
            out.append(sum(float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(c)))
    return torch.log_softmax(torch.tensor(out, dtype=torch.float64), -1)


def test_defaults_keep_the_end_token_and_the_per_turn_list():
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    cfg = LLMPolicyConfig()
    assert cfg.candidate_end_token is True and cfg.admissible_in_system is False and cfg.drop_task_lines is False

def test_the_policy_sets_its_engines_score_memo(base):
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    assert base.lm.engine.score_memo.max_tokens == LLMPolicyConfig().score_memo_tokens == 32768
    with pytest.raises(ValueError, match="score_memo_tokens"):
        LLMPolicyConfig(score_memo_tokens=-1)


def test_drop_task_lines_leaves_the_mission_line_out_of_every_turn(base):
    """GoToLocal's ``Mission: go to the red key.`` line repeats the system message's task in every observation
    turn: left out, each turn is that line's tokens shorter and nothing else changes."""
    from echorl_agent.llm_rl.prompt import render_prompt

    llm = base.lm.llm
    rows = gotolocal_states(history=2)
    sys = base.cfg.system_prompt
    for row in rows:
        state = decode_llm_obs(row)
        kept = render_prompt(llm, state, sys, show_admissible=False)[0]
        dropped = render_prompt(llm, state, sys, show_admissible=False, drop_task_lines=True)[0]
        text, short = llm.tokenizer.decode(kept), llm.tokenizer.decode(dropped)
        line = f"Mission: {state['task']}.\n"
        assert text.count(line) == len(state["history"]) + 1 and line not in short
        assert short == text.replace(line, "")
        assert len(kept) - len(dropped) == 9 * (len(state["history"]) + 1)


def test_no_end_token_prefills_8_fewer_candidate_tokens_per_gotolocal_state(base):
    """BabyAI's seven actions are 12 action tokens; with the end token every one is run (the engine skips only a
    candidate's last token), without it 4 ("turn" once for "turn left"/"turn right", "go", "pick", "t" of
    "toggle"; "drop" and "done" are one token, read from the prompt's last logits)."""
    lean = policy_like(base, candidate_end_token=False)
    rows = gotolocal_states(history=0, steps=2)
    state = decode_llm_obs(rows[0])
    eos = base.lm.llm.eos_token_ids[0]
    r_full, r_lean = base.record(rows[0]), lean.record(rows[0])
    assert r_full.context == r_lean.context
    assert [c[-1] for c in r_full.cands] == [eos] * 7 and [c[:-1] for c in r_full.cands] == r_lean.cands
    assert sum(len(c) for c in r_lean.cands) == 12 and len(state["admissible"]) == 7
    full, short = computed_tokens(base, rows), computed_tokens(lean, rows)
    assert full - short == 8 * len(rows)


def test_the_end_token_is_scored_but_never_run_by_the_engine_or_the_learner(base):
    """A candidate is the reply ``action<end-of-turn>`` and its log-prob includes ``log P(end | prompt, action)``,
    read from the logits of the action's last token: neither the engine nor the learner ever runs the end token (a
    candidate's last token predicts past it and nothing attends to it). BabyAI's 7 candidates are 19 target tokens
    but 12 input tokens; the log-probs equal a full HF forward of each prompt + candidate (which does run it)."""
    from echorl_agent.llm_rl.forward import pack

    rows = gotolocal_states(history=0, steps=1)
    eos = base.lm.llm.eos_token_ids[0]
    engine = base.lm.engine
    engine.cache.invalidate()
    c0 = engine.stats.num_computed_tokens
    first = base.record(rows[0])
    assert engine.stats.num_computed_tokens - c0 == len(first.context) + 12  # an empty cache: prompt + 12
    assert sum(len(c) for c in first.cands) == 19 and [c[-1] for c in first.cands] == [eos] * 7
    recs = base.record_many(rows)
    logps, _, _ = base.learner_scores_many(recs)
    for rec, lp in zip(recs, logps, strict=True):
        assert [s.shape[0] for s in rec.cand_states] == [len(c) - 1 for c in rec.cands]  # no end-token row
        batch = pack(len(rec.context), rec.cands, states=rec.cand_states)
        assert eos not in batch.row_ids(rec.context)[len(rec.context):]
        torch.testing.assert_close(lp, rec.rollout_logp, atol=1e-4, rtol=0)
    ref = hf_action_logprobs(base.lm.model, recs[1].context, recs[1].cands)
    torch.testing.assert_close(recs[1].rollout_logp.double(), ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(logps[1].double(), ref, atol=1e-4, rtol=0)


def test_a_gotolocal_state_met_again_is_scored_from_the_memo(base):
    """Turning left, right, left, right meets the prompts of steps 1 and 2 again at steps 3 and 4 (history 0): the
    engine's score memo answers them with the first computation (the same record contents) and prefills nothing;
    scored again without the memo they prefill the partial last block and the 12 candidate tokens again."""
    from echorl_agent.llm.engine.score_memo import ScoreMemo

    rows = gotolocal_states(history=0, actions=[0, 1, 0, 1])
    engine = base.lm.engine
    per_step = []
    engine.cache.invalidate()
    for r in rows:
        c0 = engine.stats.num_computed_tokens
        per_step.append((base.record(r), engine.stats.num_computed_tokens - c0))
    (_, _), (r1, _), (r2, _), (r3, n3), (r4, n4) = per_step
    assert r3.context == r1.context and r4.context == r2.context and n3 == n4 == 0
    assert torch.equal(r3.rollout_logp, r1.rollout_logp) and r3.context_states is r1.context_states
    memo = engine.score_memo
    try:
        engine.score_memo = ScoreMemo(0)
        engine.cache.invalidate()
        again = []
        for r in rows:
            c0 = engine.stats.num_computed_tokens
            again.append((base.record(r), engine.stats.num_computed_tokens - c0))
    finally:
        engine.score_memo = memo
    assert all(n >= 12 for _, n in again[3:])
    for (a, _), (b, _) in zip(per_step, again, strict=True):
        torch.testing.assert_close(a.rollout_logp, b.rollout_logp, atol=5e-5, rtol=0)  # float32 summation order


@pytest.mark.parametrize("options", [
    {"candidate_end_token": False, "drop_task_lines": True, "admissible_in_system": True},
    pytest.param({"candidate_end_token": False}, marks=pytest.mark.slow),
    pytest.param({"admissible_in_system": True}, marks=pytest.mark.slow)])
def test_learner_logprobs_equal_the_rollout_engine_with_the_levers_on(base, options):
    """The truncated-IS check with each lever on: the engine's rollout log-probs, a full HF forward and the learner
    (from the captured activations, packed over a history chunk) agree, so the IS weights stay 1."""
    policy = policy_like(base, **options)
    rows = gotolocal_states(history=2, steps=2)
    recs = policy.record_many(rows)
    ref = hf_action_logprobs(policy.lm.model, recs[1].context, recs[1].cands)
    torch.testing.assert_close(recs[1].rollout_logp.double(), ref, atol=1e-4, rtol=0)
    logps, _, _ = policy.learner_scores_many(recs)
    for rec, lp in zip(recs, logps, strict=True):
        torch.testing.assert_close(lp, rec.rollout_logp, atol=1e-3, rtol=0)
    torch.testing.assert_close(policy.learner_scores(recs[1])[0].double(), ref, atol=1e-4, rtol=0)


def test_admissible_in_system_lists_the_actions_once(base):
    """With history 2 the per-turn list costs its tokens in every observation turn of the prompt; in the system
    message it is prefilled once per episode (GoToLocal's set never changes), so the prompts are shorter and the
    engine prefills fewer tokens over the episode."""
    from echorl_agent.llm_rl.prompt import render_prompt

    llm = base.lm.llm
    rows = gotolocal_states(history=2)
    states = [decode_llm_obs(r) for r in rows]
    sys = base.cfg.system_prompt
    listed = [render_prompt(llm, s, sys, show_admissible=True)[0] for s in states]
    once = [render_prompt(llm, s, sys, admissible_in_system=True)[0] for s in states]
    bare = [render_prompt(llm, s, sys, show_admissible=False)[0] for s in states]
    text = llm.tokenizer.decode(once[3])
    assert text.count("Admissible actions:") == 1 and text.index("Admissible actions:") < text.index("<|im_start|>user")
    per_list = len(listed[0]) - len(bare[0])  # the list's tokens in one turn
    assert per_list == len(once[0]) - len(bare[0]) == 22
    # every observation turn of the prompt (history + current) held one copy; now there is one in all
    assert [len(a) - len(b) for a, b in zip(listed, once, strict=True)] == [
        per_list * (len(s["history"])) for s in states]
    shown = policy_like(base, show_admissible=True)
    system = policy_like(base, admissible_in_system=True)
    # 8 turn lists of 22 tokens prefilled over the 6 steps (steps 0-3 append a turn each; step 4's window moves, so
    # turns 2-4 are prefilled again) against 1 in the system message; the rest: where the re-run partial blocks start
    assert computed_tokens(shown, rows) - computed_tokens(system, rows) == 162
