"""Paged attention kernel: reference vs dense causal attention, and Triton (interpreter) vs reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from echorl_agent.kernels.attention import (
    paged_attention,
    paged_attention_grouped,
    paged_attention_reference,
    positions_of_new_tokens,
    prefix_plan,
)

torch.set_num_threads(1)


def _random_paged(seed: int, ctx_lens: list[int], q_lens: list[int], block_size: int = 4, h: int = 6, h_kv: int = 2,
                  d: int = 8):
    """Dense per-sequence K/V scattered into shuffled pool blocks, plus the matching block tables."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = [(c + block_size - 1) // block_size for c in ctx_lens]
    total = sum(n_blocks) + 3
    perm = torch.randperm(total, generator=g)
    k_pool = torch.randn(total, block_size, h_kv, d, generator=g)
    v_pool = torch.randn(total, block_size, h_kv, d, generator=g)
    dense_k, dense_v, tables = [], [], torch.zeros(len(ctx_lens), max(n_blocks), dtype=torch.long)
    used = 0
    for b, (c, nb) in enumerate(zip(ctx_lens, n_blocks, strict=True)):
        ids = perm[used : used + nb]
        used += nb
        tables[b, :nb] = ids
        dense_k.append(k_pool[ids].reshape(-1, h_kv, d)[:c])
        dense_v.append(v_pool[ids].reshape(-1, h_kv, d)[:c])
    q = torch.randn(sum(q_lens), h, d, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()))
    return q, k_pool, v_pool, tables, torch.tensor(ctx_lens), cu, dense_k, dense_v


@pytest.mark.parametrize("short", [0, 4, 16])
def test_grouped_cpu_path_equals_the_reference(short):
    # long and short query runs mixed (prompt chunks and scoring candidates), batched or one by one
    ctx, ql = [7, 13, 1, 9, 40, 21], [3, 1, 1, 9, 20, 2]
    q, kp, vp, bt, cl, cu, _, _ = _random_paged(3, ctx, ql)
    ref = paged_attention_reference(q, kp, vp, bt, cl, cu, scale=8**-0.5)
    out = paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=8**-0.5, short=short)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def test_positions_of_new_tokens():
    seq, pos = positions_of_new_tokens(torch.tensor([5, 3]), torch.tensor([0, 2, 5]))
    assert seq.tolist() == [0, 0, 1, 1, 1]
    assert pos.tolist() == [3, 4, 0, 1, 2]


def test_reference_matches_dense_causal_sdpa():
    ctx, ql = [7, 13, 1, 9], [3, 1, 1, 9]
    q, kp, vp, bt, cl, cu, dk, dv = _random_paged(0, ctx, ql)
    out = paged_attention_reference(q, kp, vp, bt, cl, cu, scale=8**-0.5)
    for b in range(len(ctx)):
        qb = q[cu[b] : cu[b + 1]].transpose(0, 1)  # [H, T, D]
        k = dk[b].transpose(0, 1).repeat_interleave(3, 0)
        v = dv[b].transpose(0, 1).repeat_interleave(3, 0)
        t, s = qb.shape[1], k.shape[1]
        mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)  # bottom-right causal
        ref = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask).transpose(0, 1)
        torch.testing.assert_close(out[cu[b] : cu[b + 1]], ref, atol=1e-5, rtol=1e-5)


def test_dispatcher_uses_the_grouped_torch_path_on_cpu_and_rejects_bad_shapes():
    q, kp, vp, bt, cl, cu, _, _ = _random_paged(1, [5], [2])
    a = paged_attention(q, kp, vp, bt, cl, cu, scale=0.3, use_triton=False)
    assert torch.equal(a, paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=0.3))
    torch.testing.assert_close(a, paged_attention_reference(q, kp, vp, bt, cl, cu, scale=0.3), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        paged_attention_reference(q[:, :5], kp, vp, bt, cl, cu, scale=0.3)


def test_triton_kernel_matches_reference_under_interpreter():
    pytest.importorskip("triton")
    code = textwrap.dedent(
        """
        import os, torch, sys
        assert os.environ["TRITON_INTERPRET"] == "1"
        sys.path.insert(0, os.environ["TESTS_DIR"])
        from test_llm_attention_kernel import _random_paged
        from echorl_agent.kernels.attention import paged_attention, paged_attention_reference
        torch.set_num_threads(1)
        q, kp, vp, bt, cl, cu, _, _ = _random_paged(3, [7, 13, 1, 9], [3, 1, 1, 9])
        ref = paged_attention_reference(q, kp, vp, bt, cl, cu, scale=8 ** -0.5)
        out = paged_attention(q, kp, vp, bt, cl, cu, scale=8 ** -0.5)  # dispatcher picks the kernel
        err = (out - ref).abs().max().item()
        assert err < 1e-5, err
        print("max_err", err)
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1", TESTS_DIR=os.path.dirname(__file__), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "max_err" in res.stdout


def test_decode_path_matches_dense_attention():
    ctx, ql = [7, 13, 1, 9], [1, 1, 1, 1]  # pure decode step: the batched reference path
    q, kp, vp, bt, cl, cu, dk, dv = _random_paged(5, ctx, ql)
    out = paged_attention_reference(q, kp, vp, bt, cl, cu, scale=0.25)
    for b in range(len(ctx)):
        k = dk[b].transpose(0, 1).repeat_interleave(3, 0)
        v = dv[b].transpose(0, 1).repeat_interleave(3, 0)
        ref = F.scaled_dot_product_attention(q[b : b + 1].transpose(0, 1), k, v, scale=0.25).transpose(0, 1)
        torch.testing.assert_close(out[b : b + 1], ref, atol=1e-5, rtol=1e-5)


def _shared_prefix_pool(seed: int, prefixes: list[int], members: list[list[int]], block_size: int = 4, h: int = 6,
                        h_kv: int = 2, d: int = 8):
    """Scoring-style sequences: per context, members that share its full blocks and own a copy of its partial block
    (as the engine lays out candidates), then their own new tokens. Returns the paged batch and the groups."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = 2 + sum((p // block_size + 1) + sum((p % block_size + m) // block_size + 1 for m in ms)
                       for p, ms in zip(prefixes, members, strict=True))
    k_pool = torch.randn(n_blocks, block_size, h_kv, d, generator=g)
    v_pool = torch.randn(n_blocks, block_size, h_kv, d, generator=g)
    free = list(torch.randperm(n_blocks, generator=g).tolist())
    tables, ctx, ql, groups = [], [], [], []
    for p, ms in zip(prefixes, members, strict=True):
        full = [free.pop() for _ in range(p // block_size)]
        partial = free.pop() if p % block_size else None
        group = []
        for m in ms:
            own = [free.pop() for _ in range((p % block_size + m + block_size - 1) // block_size)]
            if partial is not None:
                k_pool[own[0]], v_pool[own[0]] = k_pool[partial], v_pool[partial]
                # the member's new tokens overwrite the rest of its copy
                k_pool[own[0], p % block_size :] = torch.randn(block_size - p % block_size, h_kv, d, generator=g)
            group.append(len(tables))
            tables.append(full + own)
            ctx.append(p + m)
            ql.append(m)
        groups.append(group)
    bt = torch.zeros(len(tables), max(map(len, tables)), dtype=torch.long)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t)
    q = torch.randn(sum(ql), h, d, generator=g)
    cu = torch.tensor([0] + torch.tensor(ql).cumsum(0).tolist())
    return q, k_pool, v_pool, bt, torch.tensor(ctx), cu, groups


@pytest.mark.parametrize("block_size", [4, 8])
def test_shared_prefix_plan_gives_the_reference_attention(block_size):
    # three contexts (one ending on a block boundary, one with a single candidate: left to the usual path)
    q, kp, vp, bt, cl, cu, groups = _shared_prefix_pool(5, [13, 8, 6], [[3, 2, 4, 1], [2, 5], [3]], block_size)
    plan = prefix_plan(bt, cl, cu, groups, block_size)
    assert plan is not None and plan.members == frozenset(range(6))  # the single candidate is not in a group
    ref = paged_attention_reference(q, kp, vp, bt, cl, cu, scale=8**-0.5)
    out = paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=8**-0.5, prefix=plan)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    # a member that does not share the others' prefix gives a different answer: the plan really reads the prefix once
    kp2 = kp.clone()
    kp2[bt[1, 13 // block_size], : 13 % block_size] += 1.0  # member 1's copy of the partial block differs from 0's
    ref2 = paged_attention_reference(q, kp2, vp, bt, cl, cu, scale=8**-0.5)
    out2 = paged_attention_grouped(q, kp2, vp, bt, cl, cu, scale=8**-0.5, prefix=plan)
    assert not torch.allclose(out2[cu[1] : cu[2]], ref2[cu[1] : cu[2]], atol=1e-4)


def test_bfloat16_compute_is_the_attention_of_bfloat16_rounded_inputs_on_every_path():
    """``compute_dtype=torch.bfloat16`` (the frozen layers of a bfloat16 prefill): every path of the grouped kernel
    (batched short runs, long runs one by one, the shared-prefix plan) gives the float32 attention of the
    bfloat16-rounded queries, keys and values, to within the bfloat16 rounding of the products and the output."""
    r = lambda t: t.bfloat16().float()  # noqa: E731
    ctx, ql = [7, 13, 1, 9, 40, 21], [3, 1, 1, 9, 20, 2]
    q, kp, vp, bt, cl, cu, _, _ = _random_paged(3, ctx, ql)
    ref = paged_attention_reference(r(q), r(kp), r(vp), bt, cl, cu, scale=8**-0.5)
    out = paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=8**-0.5, compute_dtype=torch.bfloat16)
    f32 = paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=8**-0.5)
    assert out.dtype == torch.float32 and not torch.equal(out, f32)  # bfloat16 really ran
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=0)
    torch.testing.assert_close(paged_attention(q, kp, vp, bt, cl, cu, 8**-0.5, use_triton=False,
                                               compute_dtype=torch.bfloat16), out, atol=0, rtol=0)
    q, kp, vp, bt, cl, cu, groups = _shared_prefix_pool(5, [13, 8, 6], [[3, 2, 4, 1], [2, 5], [3]], 4)
    plan = prefix_plan(bt, cl, cu, groups, 4)
    ref = paged_attention_reference(r(q), r(kp), r(vp), bt, cl, cu, scale=8**-0.5)
    out = paged_attention_grouped(q, kp, vp, bt, cl, cu, scale=8**-0.5, prefix=plan, compute_dtype=torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=0)


def test_prefix_plan_rejects_members_starting_at_different_positions():
    q, kp, vp, bt, cl, cu, groups = _shared_prefix_pool(1, [9], [[2, 3]])
    with pytest.raises(ValueError, match="one position"):
        prefix_plan(bt, cl + torch.tensor([0, 1]), cu, groups, 4)
