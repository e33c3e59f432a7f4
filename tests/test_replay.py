"""Hot/cold prioritized replay: exact sampling distribution, tiers, persistence, threads, SB3 integration."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import DQN
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from echorl_agent import EchoDQN, EMAPlanTracker, HotColdReplayBuffer, ReplayConfig
from echorl_agent.replay import ColdStore, ReplayFileError, SumTree

torch.set_num_threads(1)

OBS = spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = spaces.Discrete(3)


def make(hot: int = 8, cold: int = 8, n_envs: int = 1, **cfg) -> HotColdReplayBuffer:
    cfg.setdefault("seed", 0)
    cfg.setdefault("plan_source", "info")
    return HotColdReplayBuffer(hot, OBS, ACT, device="cpu", n_envs=n_envs, cold_size=cold, **cfg)


def add_steps(buf: HotColdReplayBuffer, plans: np.ndarray, rewards: np.ndarray, start: int = 0) -> None:
    """One add per row of ``plans`` ([T, n_envs, d]); obs encode the step number for identification."""
    n = buf.n_envs
    for t in range(len(plans)):
        step = start + t
        obs = np.stack([np.full(3, step * 10 + e, np.float32) for e in range(n)])
        infos = [{"plan": plans[t, e]} for e in range(n)]
        buf.add(obs, obs + 1, np.full((n, 1), step % 3), rewards[t], np.zeros(n, np.float32), infos)


def expected_probs(buf: HotColdReplayBuffer) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force P(t) = softmax(beta * (||tau_t - tau_bar||^2 + alpha |r_t|)) over the stored slots."""
    slots = buf._valid_slots()
    plans = buf._field("plans", buf.hot_plans, slots).astype(np.float64)
    rewards = buf._field("rewards", buf.rewards, slots).astype(np.float64)
    td = buf._field("td", buf.hot_td, slots).astype(np.float64)
    tau = buf.tracker.tau_bar
    cfg = buf.config
    score = ((plans - tau) ** 2).sum(1) + cfg.alpha * np.abs(rewards) + cfg.td_weight * td
    logits = cfg.beta * score
    p = np.exp(logits - logits.max())
    return slots, p / p.sum()


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    exp = n * probs
    stat = float(((counts - exp) ** 2 / exp).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def sample_counts(buf: HotColdReplayBuffer, slots: np.ndarray, draws: int) -> np.ndarray:
    counts = np.zeros(len(slots))
    pos = {int(s): i for i, s in enumerate(slots)}
    for _ in range(draws // 500):
        for s in buf.sample(500).indices.tolist():
            counts[pos[s]] += 1
    return counts


# ------------------------------------------------------------------------------------------------ sampling
def test_sampling_matches_softmax_over_hot_and_cold():
    rng = np.random.default_rng(1)
    buf = make(hot=8, cold=8, beta=0.8, alpha=0.3, ema_decay=0.2)
    add_steps(buf, rng.normal(size=(14, 1, 2)).astype(np.float32), rng.normal(size=(14, 1)).astype(np.float32))
    assert buf.size() == 14 and buf.cold.num_rows == 6
    slots, probs = expected_probs(buf)
    counts = sample_counts(buf, slots, 30_000)
    assert chi_square_pvalue(counts, probs) > 1e-3
    # both tiers are actually sampled in proportion
    hot = slots < buf.hot_slots
    assert counts[~hot].sum() / counts.sum() == pytest.approx(probs[~hot].sum(), abs=0.02)


def test_sampling_stays_exact_after_tau_bar_moves_without_refresh():
    rng = np.random.default_rng(2)
    buf = make(hot=8, cold=8, beta=1.0, alpha=0.0, ema_decay=0.05, min_acceptance=1e-3, rejection_budget=1e9)
    add_steps(buf, rng.normal(size=(12, 1, 2)).astype(np.float32), np.zeros((12, 1), np.float32))
    buf.sample(1)  # anchors the tree at the current tau_bar
    refreshes = buf.stats["refreshes"]
    anchor = buf._tau_ref.copy()
    # Move tau_bar with plans pushed directly into the EMA (no new transitions): only the reference moves.
    for _ in range(3):
        buf.tracker.push(np.array([[3.0, -2.0]]))
    assert np.linalg.norm(buf.tracker.tau_bar - anchor) > 0.3
    slots, probs = expected_probs(buf)
    cand0, acc0 = buf.stats["candidates"], buf.stats["accepted"]
    counts = sample_counts(buf, slots, 30_000)
    assert buf.stats["refreshes"] == refreshes, "the rejection path, not a re-anchor, must have been used"
    assert buf.stats["candidates"] - cand0 > buf.stats["accepted"] - acc0  # some candidates were rejected
    assert chi_square_pvalue(counts, probs) > 1e-3
    # the anchored proposal alone would be visibly wrong: the correction matters
    stale = np.exp(np.log(buf.tree.leaves[slots]))
    stale /= stale.sum()
    assert np.abs(stale - probs).max() > 0.02


def test_reanchor_when_measured_acceptance_drops():
    rng = np.random.default_rng(3)
    buf = make(hot=8, cold=0, beta=1.0, ema_decay=0.5, min_acceptance=0.9, rejection_budget=1e9)
    add_steps(buf, rng.normal(size=(8, 1, 2)).astype(np.float32), np.zeros((8, 1), np.float32))
    buf.sample(4)
    before = buf.stats["refreshes"]
    buf.sample(4)
    assert buf.stats["refreshes"] == before  # tau_bar did not move: every candidate accepted
    buf.tracker.push(buf.tracker.tau_bar[None] + 0.4)
    cand, acc = buf.stats["candidates"], buf.stats["accepted"]
    buf.sample(64)  # drawn exactly from the stale anchor with rejections, then re-anchored
    assert (buf.stats["accepted"] - acc) / (buf.stats["candidates"] - cand) < 0.9
    assert buf.stats["refreshes"] == before + 1
    np.testing.assert_allclose(buf._tau_ref, buf.tracker.tau_bar)
    # absurd moves re-anchor before drawing (worst-case acceptance exp(-2 D_max) < 1e-4)
    buf.tracker.push(np.array([[500.0, 500.0]]))
    cand = buf.stats["candidates"]
    buf.sample(8)
    assert buf.stats["refreshes"] == before + 2 and buf.stats["candidates"] - cand == 8


def test_hot_fraction_mixing_and_importance_weights():
    rng = np.random.default_rng(4)
    buf = make(hot=6, cold=6, beta=0.5, alpha=0.0, hot_fraction=0.7, beta_is=1.0, beta_is_final=1.0)
    add_steps(buf, rng.normal(size=(12, 1, 2)).astype(np.float32), np.zeros((12, 1), np.float32))
    slots, _ = expected_probs(buf)
    hot = slots < buf.hot_slots
    plans = buf._field("plans", buf.hot_plans, slots).astype(np.float64)
    logits = 0.5 * ((plans - buf.tracker.tau_bar) ** 2).sum(1)
    probs = np.zeros(len(slots))
    for mask, share in ((hot, 0.7), (~hot, 0.3)):
        e = np.exp(logits[mask] - logits[mask].max())
        probs[mask] = share * e / e.sum()
    counts = sample_counts(buf, slots, 30_000)
    assert chi_square_pvalue(counts, probs) > 1e-3
    # IS weights: (N P)^-1 normalised by the batch max, exact right after an anchor
    batch = buf.sample(64)
    p = probs[np.searchsorted(slots, batch.indices.numpy())]
    w = 1.0 / p
    np.testing.assert_allclose(batch.weights.numpy().ravel(), w / w.max(), rtol=1e-5)


def test_importance_weights_follow_beta_is():
    rng = np.random.default_rng(5)
    buf = make(hot=16, cold=0, beta=1.0, beta_is=0.5, beta_is_final=0.5)
    add_steps(buf, rng.normal(size=(16, 1, 2)).astype(np.float32), np.zeros((16, 1), np.float32))
    slots, probs = expected_probs(buf)
    batch = buf.sample(200)
    p = probs[batch.indices.numpy()]
    w = p**-0.5
    np.testing.assert_allclose(batch.weights.numpy().ravel(), w / w.max(), rtol=1e-5)
    assert batch.weights.max().item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ tiers
def test_age_based_demotion_and_eviction_order():
    buf = make(hot=4, cold=6, n_envs=2, plan_source="observation")
    assert buf.buffer_size == 2 and buf.cold_rows == 3  # rows of 2 transitions
    add_steps(buf, np.zeros((7, 2, 1), np.float32), np.arange(14, dtype=np.float32).reshape(7, 2))
    # 7 adds: hot keeps the 2 newest rows (ages 0, 1), cold the next 3 (ages 2..4), rows 0 and 1 were evicted
    assert buf.size() == 5
    hot_slots = np.arange(buf.hot_slots)
    assert sorted(set(buf.ages(hot_slots).tolist())) == [0, 1]
    cold_slots = buf.hot_slots + np.arange(buf.cold_slots)
    assert sorted(set(buf.ages(cold_slots).tolist())) == [2, 3, 4]
    # the data moved with the age: the cold copy of step s holds obs = 10 s + env
    obs = buf._field("observations", buf.observations, cold_slots)[:, 0]
    seq = buf._field("seq", buf.hot_seq[:, None].repeat(2, 1), cold_slots)
    np.testing.assert_array_equal(obs, seq * 10 + np.tile([0, 1], 3))
    np.testing.assert_array_equal(buf.cold.arrays["seq"][buf.cold.oldest_first(), 0], [2, 3, 4])
    add_steps(buf, np.zeros((1, 2, 1), np.float32), np.zeros((1, 2), np.float32), start=7)
    np.testing.assert_array_equal(buf.cold.arrays["seq"][buf.cold.oldest_first(), 0], [3, 4, 5])


def test_age_threshold_sets_the_hot_tier():
    buf = make(hot=100, cold=10, age_threshold=2, plan_source="observation")
    add_steps(buf, np.zeros((5, 1, 1), np.float32), np.zeros((5, 1), np.float32))
    assert buf.buffer_size == 3 and buf.cold.num_rows == 2
    assert buf.ages(np.arange(3)).max() == 2
    with pytest.raises(ValueError, match="age_threshold"):
        make(hot=4, age_threshold=4)


def test_memmap_cold_tier_reopens(tmp_path):
    buf = make(hot=2, cold=6, plan_source="observation", cold_dir=str(tmp_path / "cold"))
    add_steps(buf, np.zeros((6, 1, 1), np.float32), np.arange(6, dtype=np.float32)[:, None])
    stored = np.array(buf.cold.arrays["observations"][: buf.cold.num_rows])
    buf.close()
    store = ColdStore.open(tmp_path / "cold")
    assert store.num_rows == 4 and store.pos == 4 and not store.full
    np.testing.assert_array_equal(store.arrays["observations"][:4], stored)
    np.testing.assert_array_equal(store.arrays["rewards"][:4, 0], [0, 1, 2, 3])
    assert np.load(tmp_path / "cold" / "rewards.npy", mmap_mode="r").shape == (6, 1)
    with pytest.raises(ValueError, match="meta.json"):
        ColdStore.open(tmp_path)


# ------------------------------------------------------------------------------------------------ persistence
def _filled(seed: int = 6, **cfg) -> HotColdReplayBuffer:
    rng = np.random.default_rng(seed)
    buf = make(hot=8, cold=8, n_envs=2, ema_decay=0.3, **cfg)
    add_steps(buf, rng.normal(size=(11, 2, 2)).astype(np.float32), rng.normal(size=(11, 2)).astype(np.float32))
    buf.sample(16)
    return buf


def _assert_same_batches(a: HotColdReplayBuffer, b: HotColdReplayBuffer) -> None:
    for _ in range(3):
        x, y = a.sample(32), b.sample(32)
        for f in x._fields:
            if x._asdict()[f] is not None:
                assert torch.equal(x._asdict()[f], y._asdict()[f]), f


def test_save_load_round_trip_is_bit_exact(tmp_path):
    a = _filled()
    path = tmp_path / "replay.bin"
    a.save(path)
    b = make(hot=8, cold=8, n_envs=2, ema_decay=0.3, seed=123)
    b.load(path)
    _assert_same_batches(a, b)
    a.update_priorities(torch.arange(4), torch.ones(4))
    b.update_priorities(torch.arange(4), torch.ones(4))
    rng = np.random.default_rng(9)
    more = rng.normal(size=(3, 2, 2)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    add_steps(a, *more, start=11)
    add_steps(b, *more, start=11)
    _assert_same_batches(a, b)
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file must be renamed away"


def test_load_rejects_corrupt_truncated_and_mismatched_files(tmp_path):
    a = _filled()
    path = tmp_path / "replay.bin"
    a.save(path)
    raw = path.read_bytes()
    b = _filled(seed=7)
    snapshot = tmp_path / "b.bin"
    b.save(snapshot)
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    with pytest.raises(ReplayFileError, match="checksum"):
        b.load(corrupt)
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ReplayFileError, match="truncated"):
        b.load(truncated)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a replay file at all")
    with pytest.raises(ReplayFileError, match="magic"):
        b.load(garbage)
    with pytest.raises(ReplayFileError, match="layout"):
        make(hot=4, cold=8, n_envs=2).load(path)
    # failed loads changed nothing: b still equals its own snapshot
    c = make(hot=8, cold=8, n_envs=2, ema_decay=0.3)
    c.load(snapshot)
    _assert_same_batches(b, c)


def test_pickle_round_trip_keeps_cold_tier():
    a = _filled()
    b = pickle.loads(pickle.dumps(a))
    assert b.cold.directory != a.cold.directory
    _assert_same_batches(a, b)


# ------------------------------------------------------------------------------------------------ threads
def test_concurrent_add_and_sample_are_consistent():
    buf = make(hot=64, cold=64, n_envs=2, plan_source="observation", seed=1)
    rng = np.random.default_rng(0)
    add_steps(buf, np.zeros((4, 2, 1), np.float32), rng.normal(size=(4, 2)).astype(np.float32))
    errors: list[BaseException] = []
    seen: list[np.ndarray] = []

    def writer() -> None:
        try:
            add_steps(buf, np.zeros((300, 2, 1), np.float32), np.ones((300, 2), np.float32), start=4)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(150):
                s = buf.sample(16)
                seen.append(s.indices.numpy())
                buf.update_priorities(s.indices, torch.rand(16))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert buf.num_added == 304 and buf.size() == 64
    assert all(((s >= 0) & (s < buf.hot_slots + buf.cold_slots)).all() for s in seen)
    # the sum tree is still the exact sum of its leaves
    buf._flush()
    assert buf.tree.total == pytest.approx(buf.tree.leaves.sum(), rel=1e-12)


# ------------------------------------------------------------------------------------------------ parts
def test_sum_tree_matches_brute_force():
    rng = np.random.default_rng(0)
    tree = SumTree(13)
    w = np.zeros(tree.capacity)
    for _ in range(5):
        idx = rng.choice(13, size=4, replace=False)
        vals = rng.random(4)
        tree.set(idx, vals)
        w[idx] = vals
    tree.set_range(2, np.array([0.5, 0.25]))
    w[2:4] = [0.5, 0.25]
    assert tree.total == pytest.approx(w.sum())
    for k in range(14):
        assert tree.prefix(k) == pytest.approx(w[:k].sum())
    u = rng.random(200) * w.sum()
    np.testing.assert_array_equal(tree.find(u), np.searchsorted(np.cumsum(w), u, side="right"))


def test_ema_plan_tracker_lazy_equals_sequential():
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(3, 4)) for _ in range(20)]
    lazy, eager = EMAPlanTracker(4, 0.1), EMAPlanTracker(4, 0.1)
    for b in batches:
        lazy.push(b)
        eager.update(b)
    np.testing.assert_allclose(lazy.tau_bar, eager.tau_bar, rtol=1e-6)
    manual = batches[0].mean(0)
    for b in batches[1:]:
        manual = 0.9 * manual + 0.1 * b.mean(0)
    np.testing.assert_allclose(lazy.tau_bar, manual, rtol=1e-12)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="plan_source.*did you mean 'td_error'"):
        ReplayConfig(plan_source="td_eror")
    with pytest.raises(ValueError, match="unknown replay option 'betta'"):
        make(betta=1.0)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        HotColdReplayBuffer(8, OBS, ACT, optimize_memory_usage=True, handle_timeout_termination=False)


# ------------------------------------------------------------------------------------------------ SB3
def test_plugs_into_sb3_dqn_unchanged():
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=500, learning_starts=50, train_freq=8, batch_size=16, seed=0,
                replay_buffer_class=HotColdReplayBuffer,
                replay_buffer_kwargs={"config": ReplayConfig(cold_size=200, plan_source="observation", seed=0)})
    model.learn(300)
    buf = model.replay_buffer
    assert isinstance(buf, HotColdReplayBuffer) and buf.num_added == model.num_timesteps >= 300
    batch = buf.sample(8)
    assert isinstance(batch, ReplayBufferSamples)
    assert batch.observations.shape == (8, 4) and batch.weights.shape == (8, 1) and batch.indices.shape == (8,)
    obs, actions, next_obs, dones, rewards, discounts, weights, indices = batch
    assert torch.equal(obs, batch.observations) and discounts is None


def test_plugs_into_sac_and_qrdqn():
    from sb3_contrib import QRDQN
    from stable_baselines3 import SAC

    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=200, learning_starts=32, batch_size=16, seed=0,
              policy_kwargs={"net_arch": [16]}, replay_buffer_class=HotColdReplayBuffer,
              replay_buffer_kwargs={"cold_size": 100, "plan_source": "observation", "seed": 0})
    sac.learn(64)
    batch = sac.replay_buffer.sample(4)
    assert batch.actions.dtype == torch.float32 and batch.actions.shape == (4, 1)
    qr = QRDQN("MlpPolicy", "CartPole-v1", buffer_size=200, learning_starts=32, batch_size=16, seed=0,
               policy_kwargs={"net_arch": [16], "n_quantiles": 5}, replay_buffer_class=HotColdReplayBuffer,
               replay_buffer_kwargs={"seed": 0})
    qr.learn(64)
    assert qr.replay_buffer.num_added == qr.num_timesteps


def test_echo_dqn_updates_priorities_from_td_errors():
    model = EchoDQN("MlpPolicy", "CartPole-v1", buffer_size=400, learning_starts=64, train_freq=16, batch_size=32,
                    seed=0, replay_buffer_kwargs={"cold_size": 400, "seed": 0})
    model.learn(400)
    buf = model.replay_buffer
    assert buf.plan_source == "none" and buf.num_sample_calls == model._n_updates > 0
    td = np.concatenate([buf.hot_td.ravel(), buf.cold.arrays["td"][: buf.cold.num_rows].ravel()])
    # initial priority is the running max; TD updates made some entries differ from it
    assert (td != td.max()).sum() > 32
    # no plan term: P ~ (|delta| + eps)^(beta * kappa) = (|delta| + 1e-3)^0.6, i.e. proportional PER
    buf._flush()
    slots = buf._valid_slots()
    p = (buf._field("td", buf.hot_td, slots).astype(np.float64) + 1e-3) ** 0.6
    leaves = buf.tree.leaves[slots]
    np.testing.assert_allclose(leaves / leaves.sum(), p / p.sum(), rtol=1e-9)


class _TinyPlanExtractor(__import__("stable_baselines3").common.torch_layers.BaseFeaturesExtractor):
    """Features extractor exposing ``plans(obs)`` like echorl_agent.policies.PlanFeaturesExtractor."""

    def __init__(self, observation_space):
        super().__init__(observation_space, features_dim=4)
        self.plan_head = torch.nn.Linear(4, 2)

    def plans(self, obs):
        mu = self.plan_head(obs)
        return mu, torch.zeros_like(mu), mu, torch.zeros_like(mu)

    def forward(self, obs):
        return obs


def test_echo_dqn_takes_plans_from_the_q_network_extractor():
    model = EchoDQN("MlpPolicy", "CartPole-v1", buffer_size=200, learning_starts=100, seed=0,
                    policy_kwargs={"features_extractor_class": _TinyPlanExtractor}, replay_buffer_kwargs={"seed": 0})
    model.learn(40)
    buf = model.replay_buffer
    assert buf.plan_source == "policy" and buf.plan_dim == 2
    with torch.no_grad():
        expected = model.q_net.features_extractor.plan_head(torch.as_tensor(buf.observations[:40, 0]))
    np.testing.assert_allclose(buf.hot_plans[:40, 0], expected.numpy(), rtol=1e-5, atol=1e-6)
    # tau_bar is the EMA (decay 0.01) of exactly these plans, one step per add
    ema = buf.hot_plans[0, 0].astype(np.float64)
    for row in buf.hot_plans[1:40, 0]:
        ema = 0.99 * ema + 0.01 * row
    np.testing.assert_allclose(buf.tracker.tau_bar, ema, rtol=1e-5)


def test_td_error_plans_follow_update_priorities():
    buf = make(hot=8, cold=8, plan_source="td_error")
    add_steps(buf, np.zeros((10, 1, 1), np.float32), np.zeros((10, 1), np.float32))
    buf.update_priorities(np.array([0, 9]), np.array([-2.5, 0.75]))
    np.testing.assert_array_equal(buf.hot_plans[..., 0], buf.hot_td)  # tau = |delta|
    assert buf.hot_td[0, 0] == 2.5 and buf.cold.arrays["td"][1, 0] == 0.75


# ------------------------------------------------------------------------------------------------ learning (slow)
DQN_CARTPOLE = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                    target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))  # rl-zoo CartPole-v1


@pytest.mark.slow
def test_echo_dqn_learns_cartpole_as_well_as_sb3_buffer():
    from stable_baselines3.common.evaluation import evaluate_policy

    scores = {"sb3": [], "echo": []}
    for seed in (0, 1):
        for name in scores:
            if name == "sb3":
                model = DQN("MlpPolicy", "CartPole-v1", seed=seed, **DQN_CARTPOLE)
            else:
                model = EchoDQN("MlpPolicy", "CartPole-v1", seed=seed, replay_buffer_kwargs={"seed": seed},
                                **DQN_CARTPOLE)
            model.learn(25_000)
            mean, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=20, deterministic=True)
            scores[name].append(mean)
    sb3, echo = np.mean(scores["sb3"]), np.mean(scores["echo"])
    assert echo >= 0.9 * sb3, scores
