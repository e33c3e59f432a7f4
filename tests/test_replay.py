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
def test_evicted_transitions_are_never_sampled_until_overwritten(tmp_path):
    rng = np.random.default_rng(6)
    buf = make(hot=4, cold=4, beta=0.7, alpha=0.2)
    add_steps(buf, rng.normal(size=(7, 1, 2)).astype(np.float32), rng.normal(size=(7, 1)).astype(np.float32))
    slots, probs = buf.probabilities()
    np.testing.assert_allclose(probs, expected_probs(buf)[1], rtol=1e-9)  # the exact reference, from the fields
    assert buf.evict(np.array([1, 1, 5, 7])) == 2 and buf.num_evicted == 2  # slot 7 (cold row 3) holds nothing yet
    _, after = buf.probabilities()
    dead = np.isin(slots, [1, 5])
    assert (after[dead] == 0).all()
    np.testing.assert_allclose(after[~dead], probs[~dead] / probs[~dead].sum(), rtol=1e-9)
    counts = sample_counts(buf, slots, 20_000)
    assert counts[dead].sum() == 0 and chi_square_pvalue(counts[~dead], after[~dead]) > 1e-3
    buf.update_priorities(torch.tensor([1]), torch.tensor([5.0]))  # stays evicted
    assert buf.probabilities()[1][dead].sum() == 0
    buf.save(str(tmp_path / "r.bin"))
    other = make(hot=4, cold=4, beta=0.7, alpha=0.2)
    other.load(str(tmp_path / "r.bin"))
    assert other.num_evicted == 2
    np.testing.assert_array_equal(other.probabilities()[1], buf.probabilities()[1])
    # hot slot 1 moves to the cold tier still evicted; cold slot 5 is overwritten by a demotion and lives again
    add_steps(buf, rng.normal(size=(3, 1, 2)).astype(np.float32), np.zeros((3, 1), np.float32), start=7)
    assert buf.num_evicted == 1 and buf.evict(np.arange(8)) == 7
    with pytest.raises(ValueError, match="every stored transition is evicted"):
        buf.sample(1)


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


def _digest(buf: HotColdReplayBuffer) -> str:
    """Fingerprint of a buffer's whole state (its checksummed pickle), to prove a failed load changed nothing."""
    return buf.__getstate__()["sha256"]


def _same_data(a: HotColdReplayBuffer, b: HotColdReplayBuffer) -> bool:
    """Same stored data and counters (both tiers, leaves, plans)."""
    if (a.num_added, a.pos, a.full, a._shift, a._td_max) != (b.num_added, b.pos, b.full, b._shift, b._td_max):
        return False
    pairs = [(getattr(a, k), getattr(b, k)) for k in ("observations", "actions", "rewards", "hot_plans", "hot_td")]
    pairs.append((a.tree.leaves, b.tree.leaves))
    if a.cold is not None:
        pairs += [(a.cold.arrays[k][: a.cold.num_rows], b.cold.arrays[k][: b.cold.num_rows]) for k in a.cold.arrays]
    return all(np.array_equal(x, y) for x, y in pairs)


def _split_file(raw: bytes) -> tuple[int, dict]:
    import json
    import struct

    (hlen,) = struct.unpack("<Q", raw[8:16])
    return hlen, json.loads(raw[48 : 48 + hlen])


def _rewrite_header(raw: bytes, edit, rehash: bool) -> bytes:
    """Apply ``edit`` to the JSON header; keep the old header checksum unless ``rehash`` (a deliberate forgery)."""
    import hashlib
    import json
    import struct

    hlen, header = _split_file(raw)
    edit(header)
    new = json.dumps(header).encode()
    length = struct.pack("<Q", len(new))
    digest = hashlib.sha256(length + new).digest() if rehash else raw[16:48]
    return raw[:8] + length + digest + new + raw[48 + hlen :]


def test_single_byte_flips_raise_replay_file_error_or_load_identical_data(tmp_path):
    a = _filled()
    path = tmp_path / "replay.bin"
    a.save(path)
    raw = path.read_bytes()
    hlen, _ = _split_file(raw)
    b = _filled(seed=7)
    before = _digest(b)
    rng = np.random.default_rng(0)
    header_pos = rng.integers(0, 48 + hlen, 300)  # magic, length, header checksum, JSON header
    payload_pos = rng.integers(48 + hlen, len(raw), 100)
    outcomes = {"error": 0, "identical": 0}
    for i, p in enumerate(np.concatenate([header_pos, payload_pos])):
        data = bytearray(raw)
        data[p] ^= int(rng.integers(1, 256))
        bad = tmp_path / f"flip{i}.bin"
        bad.write_bytes(bytes(data))
        try:
            b.load(bad)
        except ReplayFileError:
            outcomes["error"] += 1
            assert _digest(b) == before, f"a failed load (flip at byte {p}) modified the buffer"
        else:  # any other exception type propagates and fails the test
            assert _same_data(a, b), f"flip at byte {p} loaded different data silently"
            outcomes["identical"] += 1
            b = _filled(seed=7)
        bad.unlink()
    assert outcomes["error"] == 400, outcomes


@pytest.mark.parametrize("rehash", [False, True], ids=["checksum-kept", "checksum-forged"])
def test_targeted_header_edits_are_refused(tmp_path, rehash):
    a = _filled()
    path = tmp_path / "replay.bin"
    a.save(path)
    raw = path.read_bytes()
    b = _filled(seed=7)
    before = _digest(b)

    def swap_arrays(h):  # exchange the table entries of two same-sized arrays (their data stay where they are)
        e = {x["name"]: x for x in h["arrays"]}
        e["observations"]["name"], e["next_observations"]["name"] = "next_observations", "observations"

    def swap_offsets(h):
        e = {x["name"]: x for x in h["arrays"]}
        e["observations"]["offset"], e["next_observations"]["offset"] = (
            e["next_observations"]["offset"], e["observations"]["offset"])

    def meta(key, value):
        return lambda h: h["meta"].__setitem__(key, value(h["meta"][key]))

    edits = {
        "pos": meta("pos", lambda v: (v + 1) % 4),
        "num_added": meta("num_added", lambda v: v + 1),
        "full": meta("full", lambda v: not v),
        "shift": meta("shift", lambda v: (float.fromhex(v) + 1.0).hex()),
        "td_max": meta("td_max", lambda v: (float.fromhex(v) / 4).hex()),
        "swapped arrays": swap_arrays,
        "swapped offsets": swap_offsets,
        "cold pos": lambda h: h["meta"]["cold"].__setitem__("pos", (h["meta"]["cold"]["pos"] + 1) % 4),
        "dropped array": lambda h: h["arrays"].pop(),
        "stats": meta("stats", lambda v: None),
        "rng": meta("rng", lambda v: {"bit_generator": "PCG64"}),
    }
    for what, edit in edits.items():
        bad = tmp_path / "edited.bin"
        bad.write_bytes(_rewrite_header(raw, edit, rehash))
        with pytest.raises(ReplayFileError, match="header checksum" if not rehash else None) as err:
            b.load(bad)
        assert not rehash or "checksum" not in str(err.value) or "array" in str(err.value), (what, err.value)
        assert _digest(b) == before, f"failed load after a {what!r} edit modified the buffer"
    b.load(path)
    assert _same_data(a, b)


def _save_forever(bufs, path) -> None:  # child of the concurrency test
    while True:
        for buf in bufs:
            buf.save(path)


def _save_stalled(buf, path) -> None:  # child of the SIGKILL test: stalls after writing, before the rename
    import os as _os
    import time

    _os.fsync = lambda fd: time.sleep(3600)
    buf.save(path)


def _wait_for(cond, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_load_during_concurrent_saves_in_another_process_sees_one_version(tmp_path):
    import multiprocessing as mp

    v1, v2 = _filled(seed=1), _filled(seed=2)
    add_steps(v2, np.ones((3, 2, 2), np.float32), np.ones((3, 2), np.float32), start=11)
    path = tmp_path / "replay.bin"
    v2.save(path)  # save() applies deferred leaf updates: both versions now equal what the child writes
    v1.save(path)
    assert not _same_data(v1, v2)
    saver = mp.get_context("fork").Process(target=_save_forever, args=([v1, v2], path), daemon=True)
    saver.start()
    try:
        c = make(hot=8, cold=8, n_envs=2, ema_decay=0.3)
        seen, loads = set(), 0
        while loads < 60 or len(seen) < 2:
            c.load(path)
            loads += 1
            match = [k for k, v in (("v1", v1), ("v2", v2)) if _same_data(v, c)]
            assert match, f"load {loads} returned a mix of versions"
            seen.add(match[0])
            assert loads < 3000, f"saw only {seen} in {loads} loads"
    finally:
        saver.kill()
        saver.join()
    assert seen == {"v1", "v2"}


def test_sigkilled_save_keeps_the_previous_file_and_its_orphan_is_removed_later(tmp_path):
    import multiprocessing as mp
    import os
    import signal

    old, new = _filled(seed=1), _filled(seed=2)
    path = tmp_path / "replay.bin"
    old.save(path)
    writer = mp.get_context("fork").Process(target=_save_stalled, args=(new, path), daemon=True)
    writer.start()
    tmps = lambda: sorted(tmp_path.glob(".replay.bin.*.tmp"))  # noqa: E731
    _wait_for(lambda: len(tmps()) == 1)
    orphan = tmps()[0]
    assert f"-{writer.pid}." in orphan.name
    c = make(hot=8, cold=8, n_envs=2, ema_decay=0.3)
    c.load(path)  # the writer is alive and holds its lock: its file must survive
    assert _same_data(old, c) and orphan.exists()
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    assert writer.exitcode == -signal.SIGKILL and orphan.exists()
    c.load(path)  # the previous file is intact; the orphan is removed by this load
    assert _same_data(old, c) and not orphan.exists()


def test_save_removes_orphans_of_dead_processes_only(tmp_path):
    import subprocess
    import sys

    from echorl_agent.replay.serialization import tmp_name

    path = tmp_path / "replay.bin"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_name(path)  # this process is alive: its name must be kept
    orphan = mine.with_name(mine.name.replace(f"-{__import__('os').getpid()}.", f"-{dead.pid}."))
    other = tmp_path / ".other.bin.x-1.tmp"
    for f in (mine, orphan, other):
        f.write_bytes(b"partial")
    _filled().save(path)
    assert mine.exists() and other.exists() and not orphan.exists()


def test_sb3_save_replay_buffer_pickle_is_checksummed(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=64, learning_starts=1000, seed=0,
                replay_buffer_class=HotColdReplayBuffer,
                replay_buffer_kwargs={"config": ReplayConfig(cold_size=32, plan_source="observation", seed=0)})
    model.learn(100)
    ref = model.replay_buffer
    path = tmp_path / "buffer.pkl"
    model.save_replay_buffer(path)
    raw = path.read_bytes()
    blob = ref.__getstate__()["state"]
    start = raw.find(blob)
    assert start > 0
    actions_at = start + blob.find(ref.actions.tobytes())  # the case: two flipped bytes in `actions`
    rng = np.random.default_rng(0)
    positions = [(actions_at, actions_at + 5)] + [tuple(rng.integers(start, start + len(blob), 2)) for _ in range(30)]
    for p, q in positions:
        data = bytearray(raw)
        data[p] ^= 0x01
        data[q] ^= 0x10
        path.write_bytes(bytes(data))
        with pytest.raises(ReplayFileError, match="checksum"):
            model.load_replay_buffer(path)
    for p in rng.integers(0, len(raw), 30):  # anywhere, including pickle opcodes: never a silent change
        data = bytearray(raw)
        data[p] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            model.load_replay_buffer(path)
        except Exception:  # noqa: BLE001 - any refusal is fine; an outer opcode flip need not be ReplayFileError
            continue
        assert _same_data(ref, model.replay_buffer)
    path.write_bytes(raw)
    model.load_replay_buffer(path)
    assert _same_data(ref, model.replay_buffer)


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


def test_sum_tree_c_kernel_is_bit_identical_to_numpy_reference():
    from echorl_agent.replay import ckernel

    if ckernel.load() is None:
        pytest.skip("the C sum-tree kernel is unavailable (no C compiler, or ECHORL_REPLAY_KERNEL=0)")
    rng = np.random.default_rng(7)
    for size in (1, 3, 13, 1000, 1 << 14):
        fast, ref = SumTree(size), SumTree(size, use_kernel=False)
        for _ in range(20):
            k = int(rng.integers(1, max(2, size // 8) + 1))
            idx = rng.integers(0, size, size=k)  # repeats included: the last write wins on both paths
            vals = rng.random(k) * rng.choice([1e-30, 1.0, 1e30])
            fast.set(idx, vals)
            ref.set(idx, vals)
            np.testing.assert_array_equal(fast.tree, ref.tree)
            u = rng.random(300) * fast.total
            np.testing.assert_array_equal(fast.find(u), ref.find(u))
    # and a whole buffer draws the same batches and weights with either tree
    bufs = []
    for use_kernel in (True, False):
        buf = make(hot=8, cold=8, beta=0.8, alpha=0.3, td_weight=0.5)
        buf.tree = SumTree(buf.hot_slots + buf.cold_slots, use_kernel=use_kernel)
        add_steps(buf, np.random.default_rng(1).normal(size=(14, 1, 2)).astype(np.float32), np.ones((14, 1), np.float32))
        bufs.append(buf)
    for _ in range(5):
        a, b = (buf.sample(32) for buf in bufs)
        torch.testing.assert_close(a.indices, b.indices, rtol=0, atol=0)
        torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)
        for buf in bufs:
            buf.update_priorities(a.indices, torch.arange(32.0))
    np.testing.assert_array_equal(bufs[0].tree.tree, bufs[1].tree.tree)


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
