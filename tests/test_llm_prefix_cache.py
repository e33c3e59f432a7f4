"""Prefix cache, scheduler and bandwidth metrics (no model needed)."""

from __future__ import annotations

import pytest

from echorl_agent.llm.engine.metrics import BandwidthEfficiencyTracker, speedup_bound
from echorl_agent.llm.engine.prefix_cache import PrefixCache, PrefixCacheConfig
from echorl_agent.llm.engine.scheduler import (
    Scheduler,
    SchedulerConfig,
    attention_bandwidth,
    effective_bandwidth,
)


def _cache(num_blocks=8, bs=4, **kw):
    return PrefixCache(num_blocks, PrefixCacheConfig(block_size=bs, max_tokens=num_blocks * bs), **kw)


def _fill(cache, tokens):
    """Allocate + register all full blocks, as the engine does after computing the KV."""
    alloc = cache.allocate(tokens)
    prev = alloc.block_hashes[-1] if alloc.block_hashes else None
    bs = cache.block_size
    for i in range(len(alloc.block_hashes), len(tokens) // bs):
        prev = cache.register(alloc.block_table[i], prev, tokens[i * bs : (i + 1) * bs])
    return alloc


def test_match_shares_blocks_and_counts_tokens():
    c = _cache()
    a = _fill(c, list(range(10)))  # blocks [0..3], [4..7] registered, [8, 9] partial
    assert a.num_cached_tokens == 0 and len(a.block_table) == 3
    b = c.allocate(list(range(9)) + [99, 100, 101])
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert c.blocks[a.block_table[0]].ref_count == 2
    assert (c.stats.num_cached_tokens, c.stats.num_computed_tokens) == (8, 14)
    assert c.stats.reuse_rate == pytest.approx(8 / 22)


def test_fully_cached_prompt_recomputes_last_block():
    c = _cache()
    a = _fill(c, list(range(8)))
    c.release(a.block_table)
    b = c.allocate(list(range(8)))
    assert b.num_cached_tokens == 4  # the last token must be computed to get its logits
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_lru_eviction_never_serves_a_different_prefix():
    c = _cache(num_blocks=4)
    a = _fill(c, list(range(16)))
    c.release(a.block_table)
    assert c.num_cached_blocks == 4 and c.num_free_blocks == 4
    b = _fill(c, [100 + i for i in range(8)])  # evicts the 2 least recently used blocks of A (its tail)
    assert c.stats.num_evicted_blocks == 2
    ids, _ = c.match(list(range(16)))
    assert len(ids) == 2  # A's first two blocks survived, the evicted tail is not matched
    assert all(c.blocks[i].tokens == tuple(range(4 * k, 4 * k + 4)) for k, i in enumerate(ids))
    assert set(ids).isdisjoint(b.block_table)


def test_reset_forgets_every_block_and_may_set_the_version_back():
    c = _cache()
    a = _fill(c, list(range(10)))
    with pytest.raises(RuntimeError, match="in use"):
        c.reset()  # a request still holds its blocks
    c.release(a.block_table)
    assert c.invalidate() == 1 and c.invalidate() == 2
    c.release(_fill(c, list(range(8))).block_table)  # registered under version 2, evictable
    assert c.num_cached_blocks > 0
    c.reset(weight_version=1)  # back to a version the old weights used: safe, nothing stays registered
    assert c.weight_version == 1 and c.num_cached_blocks == 0 and c.num_free_blocks == c.num_blocks
    assert c.match(list(range(8))) == ([], [])
    b = c.allocate(list(range(8)))
    assert b.num_cached_tokens == 0 and b.block_table == [0, 1]  # fresh blocks, in order
    with pytest.raises(ValueError, match="weight_version"):
        c.release(b.block_table)
        c.reset(weight_version=-1)


def test_hash_collision_is_detected_by_token_check():
    c = _cache(hash_fn=lambda prev, toks: 7)  # every block collides
    _fill(c, [1, 2, 3, 4, 5])
    ids, _ = c.match([9, 9, 9, 9, 9])
    assert ids == [] and c.stats.num_hash_collisions == 1
    assert c.match([1, 2, 3, 4, 0])[0] != []


def test_caching_switch_and_budget_validation():
    c = PrefixCache(8, PrefixCacheConfig(block_size=4, max_tokens=32, enable_prefix_caching=False))
    _fill(c, list(range(12)))
    assert c.match(list(range(12))) == ([], []) and c.num_cached_blocks == 0
    assert PrefixCacheConfig(block_size=16, max_bytes=16 * 100 * 5).num_blocks(bytes_per_token=100) == 5
    with pytest.raises(ValueError, match="block_size"):
        PrefixCacheConfig(block_size=0)
    with pytest.raises(MemoryError):
        _cache(num_blocks=2).allocate(list(range(20)))


class _Req:
    def __init__(self, arrival, n, priority=1.0, enqueued_step=0):
        self.arrival, self.num_prompt_tokens, self.priority, self.enqueued_step = arrival, n, priority, enqueued_step


def test_scheduler_priority_eq5_and_bandwidth_policy():
    reqs = [_Req(0, 100, 1.0), _Req(1, 10, 1.0), _Req(2, 100, 20.0)]
    # r/(q+eps): 1/101, 1/11, 20/101 -> order 2, 1, 0
    s = Scheduler(SchedulerConfig(policy="priority", eps=1.0))
    assert [r.arrival for r in s.order(reqs, [0, 0, 0], step=0)] == [2, 1, 0]
    assert s.score(3.0, 10, 4) == pytest.approx(3.0 / 7.0)
    bw = Scheduler(SchedulerConfig(policy="bandwidth", eps=1.0, bandwidth_scale=1.0))
    # b_eff(100, 0) = 5050 -> 20/(5050+100+1) < 1/(55+10+1)
    assert [r.arrival for r in bw.order(reqs, [0, 0, 0], step=0)] == [1, 2, 0]
    assert bw.score(1.0, 10, 4) == pytest.approx(1.0 / (effective_bandwidth(10, 4) + 6 + 1))


def test_scheduler_prefix_tiebreak_fcfs_and_starvation():
    reqs = [_Req(0, 50), _Req(1, 50), _Req(2, 50, enqueued_step=0)]
    fcfs = Scheduler(SchedulerConfig(policy="fcfs"))
    assert [r.arrival for r in fcfs.order(reqs, [0, 32, 16], step=0)] == [1, 2, 0]
    plain = Scheduler(SchedulerConfig(policy="fcfs", prefix_tiebreak=False))
    assert [r.arrival for r in plain.order(reqs, [0, 32, 16], step=0)] == [0, 1, 2]
    starving = [_Req(0, 1000, 0.01, enqueued_step=0), _Req(1, 1, 5.0, enqueued_step=99)]
    s = Scheduler(SchedulerConfig(max_wait_steps=10))
    assert [r.arrival for r in s.order(starving, [0, 0], step=100)] == [0, 1]
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="lifo")


def test_bandwidth_formulas_and_tracker():
    assert attention_bandwidth(4, scale=0.5) == 5.0
    assert effective_bandwidth(4, 2) == 10 - 3
    assert speedup_bound(0.0, 10) == 1.0 and speedup_bound(0.8, 10) == pytest.approx(1 / (0.2 + 0.08))
    tr = BandwidthEfficiencyTracker(scale=1.0, loss_weight=2.0)
    tr.record_request(4, 0, actor="a")
    tr.record_request(6, 4, actor="a")
    tr.record_reward(1.0, actor="a")
    tr.end_episode("a")
    tr.record_pg_loss(-0.5)
    snap = tr.snapshot()
    assert snap.mean_bandwidth == 10 + 21 and snap.mean_effective_bandwidth == 10 + 11
    assert snap.total_bandwidth_saved == 10 and snap.reuse_rate == pytest.approx(0.4)
    assert snap.eta_bw == pytest.approx(1.0 / (21 + 1.0))
