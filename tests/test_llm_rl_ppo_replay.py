"""EchoRL's hot/cold replay with the PPO learner (issue 26 item 1): ``echorl`` with ``echorl_learner="ppo"``.

Weights of the mixed batch against a hand computation, the buffer filling from PPO rollouts, replayed items scored
like a fresh forward, the config/CLI switch, train-llm through GoToLocal's truncation, checkpoint and resume, and the
replay-off ablation equal to echoppo."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import torch

from echorl_agent.llm_rl.policy import StepRecord
from echorl_agent.replay.llm import LLMReplayBuffer, LLMTransition
from tests.conftest import choice_states, small_llm_policy

ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"
GOTO = "EchoRL/BabyAI-GoToLocal-v0"


@pytest.fixture(scope="module")
def policy():
    p = small_llm_policy(ENV, history=1, max_episode_steps=4)
    state = p.lm.trainable_state()
    yield p
    p.lm.load_trainable_state(state)


@pytest.fixture()
def restore(policy):
    """Every test starts from (and leaves) the fixture's adapter weights."""
    state = {k: v.clone() for k, v in policy.lm.trainable_state().items()}
    policy.lm.load_trainable_state(state)
    yield state
    policy.lm.load_trainable_state(state)


def _records(policy, n_envs: int, steps: int, seed0: int = 0) -> tuple[list[StepRecord], list[np.ndarray]]:
    rows = choice_states(ENV, 1, n_envs, steps, seed0)
    return policy.record_many(rows), rows


def _transitions(recs: list[StepRecord], version: int) -> list[LLMTransition]:
    out = []
    for i, r in enumerate(recs):
        it = LLMTransition.from_record(r, action=i % len(r.cands), advantage=(-1.0) ** i * (0.2 + 0.3 * i),
                                       ret=0.1 * i, version=version)
        out.append(it)
    return out


def _nudge(policy, scale: float = 0.5) -> None:
    """Move the adapters (and the engine) away from the weights that produced the records: pi != mu."""
    g = torch.Generator().manual_seed(3)
    state = {k: v + scale * torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype)
             for k, v in policy.lm.trainable_state().items()}
    policy.lm.load_trainable_state(state)


# ------------------------------------------------------------------ weights of the mixed batch (hand computation)
def test_weights_are_one_on_policy_and_per_times_truncated_ratio_for_replayed(policy, restore):
    from echorl_agent.llm_rl.algorithms.ppo.replay import PPOReplay

    recs, _ = _records(policy, 2, 3)
    stored = _transitions(recs[:6], policy.lm.engine.weight_version)
    fresh = _transitions(recs[6:], policy.lm.engine.weight_version)
    _nudge(policy)  # the update's weights are not the ones that sampled the stored items
    # pi(a|s) of every stored item by a fresh learner forward, one record at a time
    by_context = {}
    for it in stored:
        lp = policy.learner_scores(StepRecord.from_transition(it))[0]
        by_context[(tuple(it.context), it.action)] = (lp[it.action] - it.rollout_logp[it.action]).exp().item()
    raw = sorted(by_context.values())
    assert raw[-1] - raw[0] > 0.05  # the nudge moved pi away from mu

    buf = LLMReplayBuffer(64, beta=1.0, alpha=0.5, td_weight=0.6, td_eps=1e-3)
    buf.add(stored)
    # which items seed 0 replays does not depend on C: find them, then put C between their smallest and largest
    # ratio (geometric mean: the ratios span orders of magnitude), so both sides of the truncation occur
    probe = PPOReplay(buf, replay_ratio=1.5, truncation=math.inf, seed=0)
    probe.begin(policy, fresh, batch_size=1)
    picked = sorted(by_context[(tuple(it.context), it.action)] for it in probe.items)
    assert picked[0] < picked[-1]
    c = math.sqrt(picked[0] * picked[-1])
    rep = PPOReplay(buf, replay_ratio=1.5, truncation=c, seed=0)
    rep.begin(policy, fresh, batch_size=1)  # 2 minibatches per epoch
    assert [it.context for it in rep.items] == [it.context for it in probe.items]
    n = len(fresh)
    assert len(rep.items) == round(1.5 * n) == len(rep.weights) - n
    assert rep.weights[:n].tolist() == [1.0] * n  # on-policy: exactly 1
    expected = torch.tensor([min(by_context[(tuple(it.context), it.action)], c) for it in rep.items])
    torch.testing.assert_close(rep.is_weights, expected, rtol=2e-4, atol=0)
    assert (rep.is_weights == c).any() and (rep.is_weights < c).any()  # both sides of the truncation occur
    torch.testing.assert_close(rep.weights[n:], rep.per_weights * expected, rtol=2e-4, atol=0)
    assert rep.per_weights.max() == 1.0 and (rep.per_weights > 0).all()
    # the items are split over the 2 minibatches of an epoch, every one exactly once, then reshuffled
    rep_items = list(rep.items)
    first = [rep.next_minibatch() for _ in range(2)]
    assert sorted(p for mb in first for p in mb.positions.tolist()) == list(range(len(rep.items)))
    second = [rep.next_minibatch() for _ in range(2)]
    assert sorted(p for mb in second for p in mb.positions.tolist()) == list(range(len(rep.items)))
    # after the update: replayed items' |delta| = |ret - V(s)| of their latest forward, the fresh items enter the
    # buffer with |delta| = |ret - value|; P = softmax(alpha |A| + td_weight log(|delta| + eps)) (Eq. 7, beta 1)
    for mb in first + second:
        pg, vf = mb.loss_terms(mb.advantages, 0.2)
        assert pg.shape == vf.shape == (len(mb),) and pg.requires_grad
    latest = {p: v for mb in second for p, v in zip(mb.positions.tolist(), mb.values.tolist(), strict=True)}
    slots = rep._slots.copy()
    rep.end(policy.lm.engine.weight_version)
    assert len(buf) == len(stored) + len(fresh)
    delta = [abs(it.ret - it.value) for it in stored + fresh]
    for p, v in latest.items():
        delta[int(slots[p])] = abs(rep_items[p].ret - v)
    adv = np.array([it.advantage for it in stored + fresh], np.float32).astype(np.float64)
    logits = 0.5 * np.abs(adv) + 0.6 * np.log(np.array(delta, np.float32).astype(np.float64) + 1e-3)
    want = np.exp(logits - logits.max())
    got_slots, probs = buf.probabilities()
    np.testing.assert_array_equal(got_slots, np.arange(len(delta)))
    np.testing.assert_allclose(probs, want / want.sum(), rtol=1e-5)


def test_replayed_item_logprob_equals_a_fresh_forward(policy, restore):
    from echorl_agent.llm_rl.algorithms.ppo.replay import PPOReplay

    recs, _ = _records(policy, 2, 1, seed0=4)
    items = _transitions(recs, policy.lm.engine.weight_version)
    assert all(it.context_states is not None for it in items)
    kept = LLMReplayBuffer(64)
    kept.add(items)
    # a budget of about one item's activations: the older items are served token-only, and the learner
    # recomputes their frozen layers from the token ids
    dropped = LLMReplayBuffer(64, replay_memory_mb=(sum(it.token_nbytes for it in items)
                                                         + items[-1].activation_nbytes) / 1e6)
    dropped.add(items)
    assert dropped.stats()["activations_dropped"] > 0
    for buf in (kept, dropped):
        rep = PPOReplay(buf, replay_ratio=2.0, truncation=1.0, seed=1)
        rep.begin(policy, items[:2], batch_size=2)
        mb = rep.next_minibatch()
        logps, _, _ = policy.learner_scores_many(mb.records)
        for rec, lp in zip(mb.records, logps, strict=True):
            token_only = StepRecord(list(rec.context), rec.num_prompt, [list(c) for c in rec.cands], rec.rollout_logp,
                                    0.0)  # a fresh forward from the token ids, every layer recomputed
            torch.testing.assert_close(lp, policy.learner_scores(token_only)[0], atol=1e-4, rtol=0)
        if buf is dropped:
            assert buf.stats()["misses"] > 0 and any(r.context_states is None for r in mb.records)
        else:
            assert buf.stats()["hit_rate"] == 1.0


# ------------------------------------------------------------------ the PPO loop
def _cfg(out=None, **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    base = dict(env_id=ENV, method="echorl", echorl_learner="ppo", train_steps=4, n_envs=2, n_steps=1, batch_size=2,
                n_epochs=1, history=1, max_episode_steps=4, bc_episodes=1, bc_epochs=1, learning_rate=1e-2, seed=7,
                policy_kwargs={"lora_rank": 4}, replay={"capacity": 64, "replay_memory_mb": 64.0},
                out=None if out is None else str(out))
    base.update(kw)
    return LLMTrainConfig(**base)


def _train(policy, state, cfg, resume=False):
    from echorl_agent.llm_rl.train import train_llm

    if not resume:
        policy.lm.load_trainable_state(state)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PPO resumes")
        warnings.filterwarnings("ignore", message="no training episode finished")
        return train_llm(cfg, lm=policy.lm, resume=resume)


def test_buffer_fills_from_ppo_rollouts_and_updates_mix_replayed_items(policy, restore, tmp_path):
    model = _train(policy, restore, _cfg(tmp_path, checkpoint_every=1))
    buf = model.replay.buffer
    assert model.num_timesteps == 4 and len(buf) == 4  # one item per env step of the two rollouts
    assert model.logger.name_to_value["train/replayed"] == 2.0  # replay_ratio 1: the 2nd update replays 2 items
    assert model.logger.name_to_value["train/replay_items"] == 4.0
    # the last rollout's items carry SB3's GAE advantages, returns and values of that rollout, and its actions
    rb = model.rollout_buffer
    last = list(buf._items.values())[-2:]
    np.testing.assert_allclose([it.advantage for it in last], rb.advantages.reshape(-1), rtol=1e-6)
    np.testing.assert_allclose([it.ret for it in last], rb.returns.reshape(-1), rtol=1e-6)
    np.testing.assert_allclose([it.ret - it.value for it in last], rb.advantages.reshape(-1), atol=1e-6)
    assert [it.action for it in last] == rb.actions.reshape(-1).astype(int).tolist()
    assert all(it.context_states is not None and it.window is not None for it in last)  # activations, plan window
    assert {it.version for it in buf._items.values()} == {model.policy.lm.engine.weight_version - 2,
                                                          model.policy.lm.engine.weight_version - 1}
    # the checkpoint holds the buffer; a resume at the budget restores it and the replay generator
    assert (tmp_path / "checkpoint" / "replay.bin").is_file()
    rng_state = model.replay.rng.bit_generator.state
    stats = buf.stats()
    with pytest.warns(UserWarning, match="nothing to resume"):
        again = _train(policy, restore, _cfg(tmp_path, checkpoint_every=1), resume=True)
    assert again.replay.buffer.stats() == pytest.approx(stats, nan_ok=True)
    assert [it.advantage for it in again.replay.buffer._items.values()] == [it.advantage for it in buf._items.values()]
    assert again.replay.rng.bit_generator.state == rng_state
    with pytest.raises(ValueError, match=r"cannot resume .*replay\['capacity'\] differs"):
        _train(policy, restore, _cfg(tmp_path, checkpoint_every=1, replay={"off": True}), resume=True)


def test_config_cli_and_checkpoint_kind_of_the_learner(tmp_path, capsys):
    from echorl_agent import cli
    from echorl_agent.llm_rl.algorithms.registry import kind_of
    from echorl_agent.llm_rl.checkpoint import check_config
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match=r"echorl_learner must be one of \('gigpo', 'ppo'\), got echorl_learner='grpo'"):
        LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="grpo")
    with pytest.raises(ValueError, match="batch_size must divide n_steps"):  # the PPO learner's rule, not GiGPO's
        LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo", n_steps=10, batch_size=4)
    LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo", group_size=1)  # no groups with PPO
    with pytest.raises(ValueError, match="gigpo_kwargs applies to the GiGPO methods.*echorl_learner='ppo'"):
        LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo", gigpo_kwargs={"epochs": 2})
    assert LLMTrainConfig(env_id=ENV, method="echorl").learner == "gigpo"  # the default is unchanged
    assert LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo").learner == "ppo"
    assert kind_of("echorl") == "gigpo" and kind_of("echorl", "ppo") == "ppo" and kind_of("echoppo") == "ppo"
    assert LLMTrainConfig(env_id=ENV, method="echorl", replay={"off": True}).replay_kwargs() is None
    assert LLMTrainConfig(env_id=ENV, method="echoppo").replay_kwargs() is None
    # a checkpoint written before echorl_learner existed resumes with the default, and refuses "ppo"
    saved = json.loads(json.dumps(dataclasses.asdict(LLMTrainConfig(env_id=ENV, method="echorl")), default=str))
    del saved["echorl_learner"]
    check_config(saved, LLMTrainConfig(env_id=ENV, method="echorl"), tmp_path)
    with pytest.raises(ValueError, match="echorl_learner differs"):
        check_config(saved, LLMTrainConfig(env_id=ENV, method="echorl", echorl_learner="ppo"), tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["train-llm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--echorl-learner {gigpo,ppo}" in text and "(default: gigpo)" in text
    with pytest.raises(SystemExit):
        cli.main(["train-llm", "--task", ENV, "--method", "echorl", "--echorl-learner", "sac", "--out", str(tmp_path)])
    assert "invalid choice: 'sac'" in capsys.readouterr().err


@pytest.mark.slow  # ~23 s: two rollouts with scoring of GoToLocal's long prompts
def test_train_llm_echorl_ppo_on_gotolocal_through_the_envs_own_truncation(policy, restore, tmp_path):
    # as test_llm_rl_group's truncation test: BabyAI's own step limit (3) truncates every episode, whose final state
    # lists no admissible action (a value-only record); two rollouts, so the second update replays the first's items
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    cfg = LLMTrainConfig(env_id=GOTO, method="echorl", echorl_learner="ppo", train_steps=12, n_envs=2, n_steps=3,
                         batch_size=6, n_epochs=1, history=1, bc_episodes=1, bc_epochs=1,
                         env_kwargs={"env_kwargs": {"max_steps": 3}}, policy_kwargs={"lora_rank": 4},
                         replay={"capacity": 64, "replay_memory_mb": 64.0}, out=str(tmp_path))
    model = train_llm(cfg, lm=policy.lm)
    rows = (tmp_path / "curve.csv").read_text().splitlines()
    assert rows[0] == "timesteps,success_rate,return_mean,episode_return,heldout_sampled_success,heldout_greedy_success"
    assert len(rows) - 1 >= 2 and {int(r.split(",")[0]) % 3 for r in rows[1:]} == {0}
    assert (tmp_path / "adapter").is_dir() and (tmp_path / "checkpoint" / "replay.bin").is_file()
    assert len(model.replay.buffer) == 12 and model.logger.name_to_value["train/replayed"] == 6.0
    assert model.logger.name_to_value["train/replay_hit_rate"] == 1.0
    assert all(len(it.cands) > 1 for it in model.replay.buffer._items.values())  # no value-only record stored


@pytest.mark.slow
def test_replay_off_equals_echoppo_and_replay_on_departs_from_it_after_the_first_update(policy, restore):
    # by construction: echorl + ppo learner = echoppo (BC warm start, plan tokens 2, KL 0.01) + replay
    def weights(**kw):
        _train(policy, restore, _cfg(**kw))
        return {k: v.clone() for k, v in policy.lm.trainable_state().items()}

    echoppo = weights(method="echoppo", echorl_learner="gigpo", replay=None)
    off = weights(replay={"off": True})
    assert all(torch.equal(echoppo[k], off[k]) for k in echoppo)  # bit for bit
    one = weights(train_steps=2)  # one update: the buffer is still empty, so nothing is replayed
    echoppo_one = weights(method="echoppo", echorl_learner="gigpo", replay=None, train_steps=2)
    assert all(torch.equal(one[k], echoppo_one[k]) for k in one)
    on = weights()  # the second update mixes in the first rollout's items
    assert any(not torch.equal(echoppo[k], on[k]) for k in on)
