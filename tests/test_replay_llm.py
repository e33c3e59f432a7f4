"""Replay of LLM transitions: Eq. 6-7 priorities, tiers, importance weights, memory budget, staleness, files."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from echorl_agent.replay import LLMReplayBuffer, LLMTransition, ReplayFileError, mix_batch, off_policy_ratio

torch.set_num_threads(1)

HIDDEN = 8


class FrozenLayers(torch.nn.Module):
    """A tiny stand-in for the frozen layers below the first trained one: token embedding, causal prefix mean
    (each token sees the context and its candidate's earlier tokens, as in the packed learner forward), Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)

    @torch.no_grad()
    def __call__(self, item: LLMTransition) -> tuple[torch.Tensor, list[torch.Tensor]]:
        def causal(ids: list[int]) -> torch.Tensor:
            x = self.embed(torch.tensor(ids))
            return self.proj(x.cumsum(0) / torch.arange(1, len(ids) + 1)[:, None])

        ctx = causal(item.context)
        return ctx, [causal(item.context + c[:-1])[len(item.context):] for c in item.cands]  # no row for the last


def make_item(i: int, advantage: float = 0.0, ret: float = 0.0, value: float | None = None, version: int = 0,
              frozen: FrozenLayers | None = None, plan: list[float] | None = None, **kw) -> LLMTransition:
    rng = np.random.default_rng(i)
    context = rng.integers(1, 64, size=5 + i % 3).tolist()
    cands = [rng.integers(1, 64, size=1 + j).tolist() for j in range(3)]
    item = LLMTransition(context=context, num_prompt=len(context), cands=cands, action=i % 3,
                         rollout_logp=torch.log_softmax(torch.tensor(rng.normal(size=3), dtype=torch.float32), 0),
                         advantage=advantage, ret=ret, value=value, version=version,
                         plan=None if plan is None else torch.tensor(plan, dtype=torch.float32), **kw)
    if frozen is not None:
        item.context_states, item.cand_states = frozen(item)
    return item


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    exp = counts.sum() * probs
    stat = float(((counts - exp) ** 2 / exp).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def draw_counts(buf: LLMReplayBuffer, slots: np.ndarray, draws: int) -> np.ndarray:
    pos = {int(s): k for k, s in enumerate(slots)}
    counts = np.zeros(len(slots))
    rng = np.random.default_rng(0)
    for _ in range(draws // 500):
        for s in buf.sample(500, rng).indices.tolist():
            counts[pos[s]] += 1
    return counts


# ------------------------------------------------------------------------------------------------ priorities
def test_priorities_match_a_hand_computation():
    buf = LLMReplayBuffer(8, beta=1.0, alpha=0.5, td_weight=0.6, td_eps=1e-3, beta_is=0.7, beta_is_final=0.7, seed=0)
    spec = [(1.5, 2.0, 0.5), (-0.2, 0.1, 0.3), (0.0, 1.0, None), (2.5, 0.0, None), (-1.0, -3.0, 0.0)]
    buf.add(make_item(i, advantage=a, ret=r, value=v) for i, (a, r, v) in enumerate(spec))
    # score(t) = alpha |A_t| + td_weight log(|delta_t| + eps), delta = ret - value (or A without a critic)
    adv = np.array([a for a, _, _ in spec], np.float32).astype(np.float64)
    delta = np.array([abs(r - v) if v is not None else abs(a) for a, r, v in spec], np.float32).astype(np.float64)
    logits = 0.5 * np.abs(adv) + 0.6 * np.log(delta + 1e-3)
    want = np.exp(logits - logits.max())
    want /= want.sum()
    slots, probs = buf.probabilities()
    np.testing.assert_array_equal(slots, np.arange(5))  # item t sits in hot slot t
    np.testing.assert_allclose(probs, want, rtol=1e-6)
    assert chi_square_pvalue(draw_counts(buf, slots, 20_000), want) > 1e-3
    # importance weights: (N P)^-beta_is normalised by the batch maximum (Schaul et al. 2016)
    batch = buf.sample(64, np.random.default_rng(1))
    w = (5 * want[batch.indices]) ** -0.7
    np.testing.assert_allclose(batch.weights.numpy(), w / w.max(), rtol=1e-5)
    # new |delta| and advantages from a learner pass move the priorities
    buf.update_priorities(np.array([3]), np.array([0.0]), advantages=np.array([0.0]))
    logits[3] = 0.6 * math.log(1e-3)
    want = np.exp(logits - logits.max())
    np.testing.assert_allclose(buf.probabilities()[1], want / want.sum(), rtol=1e-6)


def test_hot_cold_split_follows_eq_6_7_on_a_hand_built_buffer():
    beta, alpha, decay = 0.8, 0.5, 0.5
    buf = LLMReplayBuffer(4, cold_size=4, hot_fraction=0.75, beta=beta, alpha=alpha, td_weight=0.0,
                          ema_decay=decay, seed=0)
    plans = [[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [-1.0, 0.5], [0.5, 0.5], [3.0, -1.0], [0.0, 0.0]]
    advs = [0.5, -2.0, 1.0, 0.0, 3.0, -0.5, 1.5]
    buf.add(make_item(i, advantage=a, plan=p) for i, (p, a) in enumerate(zip(plans, advs, strict=True)))
    # Eq. 6: tau_bar = EMA of plans (first plan initialises it)
    tau = np.array(plans[0])
    for p in plans[1:]:
        tau = (1 - decay) * tau + decay * np.array(p)
    # Eq. 7: score = ||tau_t - tau_bar||^2 + alpha |r_t|; hot = the 4 newest items, cold = the 3 older ones
    score = np.array([((np.array(p) - tau) ** 2).sum() + alpha * abs(a) for p, a in zip(plans, advs, strict=True)])
    hot_items, cold_items = [3, 4, 5, 6], [0, 1, 2]
    want = {}
    for tier, share in ((hot_items, 0.75), (cold_items, 0.25)):
        e = np.exp(beta * (score[tier] - score[tier].max()))
        want.update(zip(tier, share * e / e.sum(), strict=True))
    slots, probs = buf.probabilities()
    seqs = buf._seqs(slots)
    assert sorted(seqs[slots < buf.index.hot_slots].tolist()) == hot_items
    assert sorted(seqs[slots >= buf.index.hot_slots].tolist()) == cold_items
    expected = np.array([want[s] for s in seqs.tolist()])
    np.testing.assert_allclose(probs, expected, rtol=1e-5)
    counts = draw_counts(buf, slots, 30_000)
    assert chi_square_pvalue(counts, expected) > 1e-3
    assert counts[slots < buf.index.hot_slots].sum() / counts.sum() == pytest.approx(0.75, abs=0.015)
    # the items served are the stored ones (payload follows its slot through the hot -> cold move)
    batch = buf.sample(32, np.random.default_rng(3))
    for it, s in zip(batch.items, buf._seqs(batch.indices).tolist(), strict=True):
        assert it.advantage == advs[s] and it.plan.tolist() == plans[s]


def test_importance_weights_are_one_for_on_policy_samples():
    buf = LLMReplayBuffer(8, seed=0)
    buf.add(make_item(i, advantage=float(i)) for i in range(6))
    fresh = [make_item(10 + i, advantage=1.0) for i in range(3)]
    replayed = buf.sample(4, np.random.default_rng(0))
    items, weights, is_replay = mix_batch(fresh, replayed)
    assert items[:3] == fresh and items[3:] == replayed.items
    assert weights[:3].tolist() == [1.0, 1.0, 1.0] and torch.equal(weights[3:], replayed.weights)
    assert is_replay.tolist() == [False] * 3 + [True] * 4
    # the off-policy ratio of an on-policy sample (learner = behaviour distribution) is exactly 1
    lp = torch.stack([it.rollout_logp[it.action] for it in fresh])
    assert off_policy_ratio(lp, lp).tolist() == [1.0, 1.0, 1.0]
    # and pi/mu, truncated, for off-policy ones
    ratio = off_policy_ratio(torch.log(torch.tensor([0.2, 0.6])), torch.log(torch.tensor([0.4, 0.3])), truncation=1.5)
    torch.testing.assert_close(ratio, torch.tensor([0.5, 1.5]))
    assert off_policy_ratio(torch.log(torch.tensor([0.6])), torch.log(torch.tensor([0.3])), None).item() == \
        pytest.approx(2.0)


# ------------------------------------------------------------------------------------------------ memory budget
def test_budget_drops_oldest_activations_and_recompute_restores_them_bit_identically():
    frozen = FrozenLayers()
    items = [make_item(i, advantage=float(i % 3), frozen=frozen) for i in range(6)]
    originals = {id(it): (it.context_states.clone(), [c.clone() for c in it.cand_states]) for it in items}
    tokens = sum(it.token_nbytes for it in items)
    acts = [it.activation_nbytes for it in items]
    budget_mb = (tokens + acts[4] + acts[5]) / 1e6  # room for the two newest items' activations
    buf = LLMReplayBuffer(8, replay_memory_mb=budget_mb, recompute=frozen, seed=0)
    buf.add(items[:3])
    assert buf.stats()["items_with_activations"] == 3
    buf.add(items[3:])
    kept = [buf._items[s].context_states is not None for s in range(6)]
    assert kept == [False, False, False, False, True, True]  # oldest dropped first, token ids kept
    st = buf.stats()
    assert st["items"] == 6 and st["activations_dropped"] == 4
    assert st["memory_mb"] == pytest.approx(budget_mb) and st["mb_per_1000"] == pytest.approx(budget_mb / 6 * 1000)
    assert [buf._items[s].context for s in range(6)] == [it.context for it in items]
    batch = buf.sample(200, np.random.default_rng(0))
    seqs = buf._seqs(batch.indices).tolist()
    for seq, it in zip(seqs, batch.items, strict=True):
        ctx, cands = originals[id(items[seq])]
        assert torch.equal(it.context_states, ctx)  # recomputed (seq < 4) or kept (seq >= 4): bit-identical
        assert all(torch.equal(a, b) for a, b in zip(it.cand_states, cands, strict=True))
    hits = sum(s >= 4 for s in seqs)
    st = buf.stats()
    assert (st["hits"], st["misses"], st["recomputed"]) == (hits, 200 - hits, 200 - hits)
    assert st["hit_rate"] == pytest.approx(hits / 200)
    assert buf._items[0].context_states is None  # serving a recomputed item does not grow the memory
    buf.recompute = lambda item: (torch.zeros(1, HIDDEN), [])  # a wrong recompute is refused by name
    with pytest.raises(ValueError, match="context_states"):
        for _ in range(20):
            buf.sample(8)


def test_budget_of_token_ids_alone_evicts_the_oldest_items():
    items = [make_item(i) for i in range(5)]
    budget_mb = sum(it.token_nbytes for it in items[2:]) / 1e6
    buf = LLMReplayBuffer(8, replay_memory_mb=budget_mb, seed=0)
    buf.add(items)
    assert sorted(buf._items) == [2, 3, 4] and buf.stats()["evicted_budget"] == 2
    assert set(buf._seqs(buf.sample(300).indices).tolist()) == {2, 3, 4}


def test_bad_input_raises_value_errors_naming_the_field():
    one = make_item(0)
    with pytest.raises(ValueError, match="replay_memory_mb"):
        LLMReplayBuffer(8, replay_memory_mb=one.token_nbytes / 2e6).add([one])
    with pytest.raises(ValueError, match="replay_memory_mb"):
        LLMReplayBuffer(8, replay_memory_mb=0)
    with pytest.raises(ValueError, match="capacity"):
        LLMReplayBuffer(0)
    with pytest.raises(ValueError, match="max_staleness"):
        LLMReplayBuffer(8, max_staleness=-1)
    buf = LLMReplayBuffer(8)
    free = dataclasses.replace(one, cands=[one.cands[0]], action=0, rollout_logp=torch.zeros(1), free_text=True)
    with pytest.raises(ValueError, match="group must be set for a free-text item"):
        buf.add([free])
    buf.add([dataclasses.replace(free, group=3)])  # with its GRPO group it is accepted
    for change, field in [({"action": 3}, "action"), ({"rollout_logp": torch.zeros(2)}, "rollout_logp"),
                          ({"num_prompt": 99}, "num_prompt"), ({"advantage": math.nan}, "advantage"),
                          ({"context_states": torch.zeros(2, HIDDEN), "cand_states": []}, "context_states")]:
        with pytest.raises(ValueError, match=field):
            buf.add([dataclasses.replace(one, **change)])
    with pytest.raises(ValueError, match="plan"):
        buf.add([make_item(1, plan=[0.0, 1.0])])  # this buffer's items have no plan
    with pytest.raises(ValueError, match="n must be"):
        buf.sample(0)
    with pytest.raises(ValueError, match="empty"):
        LLMReplayBuffer(4).sample(1)
    assert len(buf) == 1  # nothing of the refused batches was stored


# ------------------------------------------------------------------------------------------------ staleness, rings
def test_stale_items_are_evicted():
    buf = LLMReplayBuffer(8, max_staleness=1, seed=0)
    buf.add(make_item(i, advantage=1.0, version=v) for i, v in enumerate([0, 0, 1, 2, 2]))
    assert buf.set_version(2) == 2  # versions < 1 are older than 1 update
    assert sorted(buf._items) == [2, 3, 4] and buf.stats()["evicted_stale"] == 2
    slots, probs = buf.probabilities()
    assert probs[:2].tolist() == [0.0, 0.0] and probs[2:].sum() == pytest.approx(1.0)
    assert set(buf._seqs(buf.sample(300).indices).tolist()) == {2, 3, 4}
    assert buf.set_version(4) == 3 and len(buf) == 0
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    buf.add([make_item(9, version=4)])  # new items are sampleable again
    assert buf._seqs(buf.sample(4).indices).tolist() == [5] * 4


def test_stale_items_can_be_rescored_instead():
    frozen = FrozenLayers()

    def rescore(items):
        return [dataclasses.replace(it, advantage=5.0, version=7, context_states=None, cand_states=None) for it in items]

    buf = LLMReplayBuffer(8, max_staleness=2, rescore=rescore, alpha=1.0, td_weight=0.0, seed=0)
    buf.add(make_item(i, advantage=0.0, version=v, frozen=frozen) for i, v in enumerate([1, 5, 6]))
    states = buf._items[0].context_states
    assert buf.set_version(7) == 1  # version 1 < 7 - 2
    it = buf._items[0]
    assert (it.version, it.advantage) == (7, 5.0)
    assert it.context_states is states  # frozen-layer activations stay valid across weight updates
    _, probs = buf.probabilities()
    np.testing.assert_allclose(probs, np.array([math.exp(5.0), 1.0, 1.0]) / (math.exp(5.0) + 2), rtol=1e-6)
    assert buf.stats()["rescored"] == 1


def test_full_rings_forget_the_oldest_payload():
    buf = LLMReplayBuffer(4, cold_size=2, seed=0)
    for i in range(10):
        buf.add([make_item(i, advantage=float(i))])
    assert sorted(buf._items) == [4, 5, 6, 7, 8, 9]
    assert buf.stats()["token_mb"] == pytest.approx(sum(make_item(i).token_nbytes for i in range(4, 10)) / 1e6)
    for it, seq in zip(*(lambda b: (b.items, buf._seqs(b.indices).tolist()))(buf.sample(100)), strict=True):
        assert it.advantage == seq


# ------------------------------------------------------------------------------------------------ files
def assert_same_items(a: LLMReplayBuffer, b: LLMReplayBuffer) -> None:
    assert list(a._items) == list(b._items)
    for seq, it in a._items.items():
        got = b._items[seq]
        for f in dataclasses.fields(LLMTransition):
            x, y = getattr(it, f.name), getattr(got, f.name)
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), f.name
            elif f.name == "cand_states" and x is not None:
                assert all(u.dtype == v.dtype and torch.equal(u, v) for u, v in zip(x, y, strict=True)), f.name
            else:
                assert x == y, f.name


def test_save_load_round_trip_and_corruption(tmp_path):
    frozen = FrozenLayers()
    items = [make_item(i, advantage=float(i), ret=1.0, value=0.5 if i % 2 else None, version=i, frozen=frozen,
                       group=i // 2, window=torch.randn(3, HIDDEN)) for i in range(6)]
    items[1] = items[1].without_activations()
    kw = {"cold_size": 3, "max_staleness": 10, "seed": 0}
    buf = LLMReplayBuffer(3, **kw)
    buf.add(items)
    buf.update_priorities(np.array([0, 2]), np.array([3.0, 0.1]))
    buf.set_version(3)
    buf.sample(5)
    path = tmp_path / "llm.replay"
    buf.save(str(path))
    other = LLMReplayBuffer(3, **kw)
    other.load(str(path))
    assert other.stats() == buf.stats() and other.version == 3
    assert_same_items(buf, other)
    np.testing.assert_array_equal(buf.probabilities()[1], other.probabilities()[1])
    a, b = buf.sample(16), other.sample(16)  # same sampler state: the same next batch
    np.testing.assert_array_equal(a.indices, b.indices)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)
    # a flipped byte in the items' tensors (the file's last bytes) is detected and leaves the buffer as it was
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x10
    bad = tmp_path / "bad.replay"
    bad.write_bytes(bytes(raw))
    before = other.stats()
    with pytest.raises(ReplayFileError, match="checksum"):
        other.load(str(bad))
    assert other.stats() == before
    assert_same_items(buf, other)
    with pytest.raises(ReplayFileError, match="layout"):
        LLMReplayBuffer(5, **kw).load(str(path))
    # bfloat16 activations (a CUDA learner's) and evicted items round-trip too
    half = LLMReplayBuffer(4, max_staleness=0, seed=1)
    half.add(dataclasses.replace(it, context_states=it.context_states.bfloat16(),
                                 cand_states=[c.bfloat16() for c in it.cand_states]) for it in items if it is not items[1])
    half.set_version(4)  # evicts versions < 4
    half.save(str(tmp_path / "half.replay"))
    back = LLMReplayBuffer(4, max_staleness=0, seed=1)
    back.load(str(tmp_path / "half.replay"))
    assert_same_items(half, back)
    assert back.index.num_evicted == half.index.num_evicted > 0
    np.testing.assert_array_equal(half.probabilities()[1], back.probabilities()[1])
    for b_ in (buf, other, half, back):
        b_.close()


def test_files_with_a_row_for_each_candidates_last_token_load_without_it():
    # files written before the learner stopped giving a candidate's last token a row kept len(cand) rows per candidate
    from echorl_agent.replay.llm_items import pack_items, unpack_items

    item = make_item(2, frozen=FrozenLayers())
    full = [torch.cat([c, torch.randn(1, HIDDEN)]) for c in item.cand_states]
    arrays, meta = pack_items([dataclasses.replace(item, cand_states=full)])
    (back,) = unpack_items(arrays, meta)
    assert all(torch.equal(a, b) for a, b in zip(back.cand_states, item.cand_states, strict=True))
    arrays, meta = pack_items([item])  # today's layout round-trips as it is
    (same,) = unpack_items(arrays, meta)
    assert [c.shape[0] for c in same.cand_states] == [len(c) - 1 for c in item.cands]
    arrays["cand_states"] = arrays["cand_states"][:-1]  # a row count that is neither layout
    arrays["cand_states_rows"] = arrays["cand_states_rows"] - 1
    with pytest.raises(ReplayFileError, match="candidate-state rows"):
        unpack_items(arrays, meta)


# ------------------------------------------------------------------------------------------------ the real LM
@pytest.mark.slow
def test_smollm2_dropped_activations_are_recomputed_from_the_frozen_layers():
    """SmolLM2-135M: the engine's captured activations entering the first trained layer, dropped by the budget,
    are rebuilt by the frozen layers (atol 1e-4), and the learner's log-probs from them equal the engine's."""
    pytest.importorskip("peft")
    from echorl_agent.llm_rl.config import LLMPolicyConfig
    from echorl_agent.llm_rl.forward import candidate_logprobs, pack, run_layers
    from echorl_agent.llm_rl.lm import TrainableLM

    try:
        lm = TrainableLM(LLMPolicyConfig(lora_rank=4, train_layers=2, max_kv_tokens=4096))
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))
    assert lm.capture
    parts, b = lm.parts, lm.boundary

    def packed(item: LLMTransition):
        batch = pack(len(item.context), item.cands)
        return batch, torch.tensor(batch.row_ids(item.context))

    def recompute(item: LLMTransition) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, ids = packed(item)
        with torch.no_grad():
            x = run_layers(parts, parts.embed(ids), batch, 0, b)
        return x[: len(item.context)], [x[rows] for rows in batch.cand_rows]

    items, engine_logp = [], []
    for k, task in enumerate(["Go to the green goal square.", "Pick up the red key and open the door."]):
        prompt = lm.llm.chat_ids([{"role": "user", "content": task}])
        cands = [lm.llm.encode(a) for a in ("turn left", "turn right", "go forward")]
        res = lm.engine.score(prompt, cands, capture=True)
        engine_logp.append(torch.tensor(res.logprobs, dtype=torch.float64))
        items.append(LLMTransition(context=prompt, num_prompt=len(prompt), cands=cands, action=k,
                                   rollout_logp=torch.log_softmax(engine_logp[-1], 0).float(), advantage=1.0 - k,
                                   ret=1.0, value=0.2, version=lm.engine.weight_version,
                                   context_states=res.context_states, cand_states=list(res.candidate_states)))
    captured = {len(it.context): (it.context_states, it.cand_states) for it in items}
    budget = (sum(it.token_nbytes for it in items) + items[1].activation_nbytes) / 1e6  # only the newest keeps them
    buf = LLMReplayBuffer(8, replay_memory_mb=budget, recompute=recompute, seed=0)
    buf.add(items)
    assert [it.context_states is not None for it in buf._items.values()] == [False, True]
    batch = buf.sample(8, np.random.default_rng(0))
    assert 0 < buf.stats()["recomputed"] < 8
    for it in batch.items:
        k = [len(x.context) for x in items].index(len(it.context))
        ctx, cands = captured[len(it.context)]
        # The residual stream reaches |x| ~ 2.5e4 (the first token) and ~400 elsewhere; the engine's kernels and
        # the HF modules round differently, so each row agrees to 1e-4 plus 1e-6 of the row's scale (a few ulps).
        for got, want in zip([it.context_states, *it.cand_states], [ctx, *cands], strict=True):
            err = (got - want).abs().amax(-1)
            assert (err <= 1e-4 + 1e-6 * want.abs().amax(-1)).all(), err.max()
        # a replayed learner pass from the (recomputed or kept) activations equals the engine's fresh forward
        pb, _ = packed(it)
        with torch.no_grad():
            x = run_layers(parts, torch.cat([it.context_states, pb.candidate_rows(it.cand_states)]), pb, b, lm.num_layers)
            lp, _ = candidate_logprobs(parts, x, pb)
        torch.testing.assert_close(lp.double(), engine_logp[k], atol=1e-4, rtol=0)


def test_critic_free_priority_by_hand():
    # |A| * min(pi/mu, C) * (1 - pi): the gradient of the item's surrogate on its action's logit
    from echorl_agent.replay import critic_free_priority

    lp = torch.log(torch.tensor([0.5, 1.0, 1e-9, 0.2]))
    mu = torch.log(torch.tensor([0.25, 0.5, 0.5, 0.4]))
    adv = torch.tensor([2.0, 1.0, -3.0, -1.0])
    got = critic_free_priority(lp, mu, adv, truncation=1.0)
    want = torch.tensor([2.0 * 1.0 * 0.5, 0.0, 3.0 * 2e-9 * 1.0, 1.0 * 0.5 * 0.8])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
    # untruncated: the first item's ratio 2 counts in full
    assert float(critic_free_priority(lp[:1], mu[:1], adv[:1], truncation=None)) == pytest.approx(2.0 * 2.0 * 0.5)
