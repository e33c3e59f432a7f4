"""Paged attention of new tokens over the cached prefix KV plus the rolling KV (EchoRL Eq. 4).

EchoRL splits a context's KV into a frozen prefix and a rolling part, KV(s_{1:t}) = KV_frozen(s_{1:t'}) U
KV_rolling(s_{t'+1:t}). In the engine both live in one block pool (vLLM/nano-vllm "paged" layout): a sequence's KV
is the list of pool blocks in its block table, the shared prefix blocks first, its own blocks after. The new tokens
of a step (a prefill chunk, or one decode token) have already been written into the pool; this kernel computes, for
each new token at absolute position ``p``, causal attention over keys ``0..p`` of its own sequence, reading them
block by block through the block table. Several sequences with different lengths go in one call (varlen batch:
``cu_q_lens`` delimits each sequence's new tokens), which is what lets decode batch across actors.

Shapes (one layer)::

    q            [N, H, D]            new tokens of all sequences, concatenated
    k_pool       [num_blocks, block_size, H_kv, D]
    v_pool       [num_blocks, block_size, H_kv, D]
    block_tables [B, max_blocks] int  pool block ids per sequence (entries past a sequence's length are unused)
    ctx_lens     [B] int              KV length of each sequence, new tokens included
    cu_q_lens    [B + 1] int          cumulative count of new tokens (sequence b owns q[cu[b]:cu[b+1]])
    out          [N, H, D]

Grouped-query attention: query head ``h`` reads KV head ``h // (H / H_kv)`` (Llama/Mistral/Qwen convention).

The torch reference is the documented meaning; the Triton kernel (one program per new token and head, online
softmax over key blocks, as in FlashAttention/vLLM's paged attention) is defined only when triton imports; the
dispatcher :func:`paged_attention` picks between them (see :mod:`echorl_agent.kernels._dispatch`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from echorl_agent.kernels._dispatch import HAS_TRITON, next_power_of_2, tl, triton, use_kernel

__all__ = [
    "decode_plan",
    "paged_attention",
    "paged_attention_grouped",
    "paged_attention_reference",
    "paged_decode_attention",
    "positions_of_new_tokens",
    "prefix_plan",
    "PrefixPlan",
]


def _check(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    cu_q_lens: torch.Tensor,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [N, H, D], got shape {tuple(q.shape)}")
    if k_pool.dim() != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(
            f"k_pool and v_pool must both be [num_blocks, block_size, H_kv, D], got {tuple(k_pool.shape)} "
            f"and {tuple(v_pool.shape)}"
        )
    if k_pool.shape[-1] != q.shape[-1]:
        raise ValueError(f"head dim differs: q has D={q.shape[-1]}, the pool has D={k_pool.shape[-1]}")
    if q.shape[1] % k_pool.shape[2] != 0:
        raise ValueError(f"H={q.shape[1]} query heads must be a multiple of H_kv={k_pool.shape[2]} KV heads")
    b = ctx_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b or cu_q_lens.shape[0] != b + 1:
        raise ValueError(
            f"block_tables must be [B, max_blocks] and cu_q_lens [B + 1] with B={b} (len(ctx_lens)), got "
            f"{tuple(block_tables.shape)} and {tuple(cu_q_lens.shape)}"
        )


def positions_of_new_tokens(ctx_lens: torch.Tensor, cu_q_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence index and absolute position of every new token.

    The new tokens of sequence ``b`` are its last ``q_len_b`` tokens, so token ``j`` of them sits at
    ``ctx_len_b - q_len_b + j``.

    Returns:
        ``(seq_idx [N], pos [N])`` int64 tensors.
    """
    q_lens = (cu_q_lens[1:] - cu_q_lens[:-1]).long()
    seq_idx = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=q_lens.device), q_lens)
    start = (ctx_lens.long() - q_lens)[seq_idx]
    offset = torch.arange(seq_idx.shape[0], device=q_lens.device) - cu_q_lens[:-1].long()[seq_idx]
    return seq_idx, start + offset


# ----------------------------------------------------------------------------------------------- reference
def _sequence_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                 ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[ctx, H_kv, D]`` of one sequence, gathered from its blocks (``table`` = its block ids)."""
    block_size, h_kv, d = k_pool.shape[1:]
    ids = table[: (ctx + block_size - 1) // block_size]
    k = k_pool[ids].reshape(-1, h_kv, d)[:ctx]
    v = v_pool[ids].reshape(-1, h_kv, d)[:ctx]
    return k, v


def paged_attention_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    cu_q_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference: per sequence, gather its KV blocks and run causal softmax attention.

    ``out[i] = softmax(scale * q[i] K_{0..p_i}^T) V_{0..p_i}`` with ``p_i`` the absolute position of new token
    ``i`` (bottom-right aligned causal mask), computed in float32.

    Returns:
        ``[N, H, D]`` tensor in ``q``'s dtype.
    """
    _check(q, k_pool, v_pool, block_tables, ctx_lens, cu_q_lens)
    n, h, d = q.shape
    h_kv = k_pool.shape[2]
    group = h // h_kv
    if n == ctx_lens.shape[0] and n > 0:  # pure decode step: one new token per sequence
        return _decode_reference(q, k_pool, v_pool, block_tables, ctx_lens, scale)
    out = torch.empty_like(q)
    cu = cu_q_lens.tolist()
    lens = ctx_lens.tolist()
    for b, ctx in enumerate(lens):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        k, v = _sequence_kv(k_pool, v_pool, block_tables[b], ctx)  # [S, H_kv, D]
        qb = q[lo:hi].transpose(0, 1).float()  # [H, T, D]
        kb = k.transpose(0, 1).float().repeat_interleave(group, dim=0)  # [H, S, D]
        vb = v.transpose(0, 1).float().repeat_interleave(group, dim=0)
        scores = torch.matmul(qb, kb.transpose(1, 2)) * scale  # [H, T, S]
        t = hi - lo
        if t > 1:
            pos = torch.arange(ctx - t, ctx, device=q.device)[:, None]
            keys = torch.arange(ctx, device=q.device)[None, :]
            scores = scores.masked_fill(keys > pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.matmul(probs, vb).transpose(0, 1).to(q.dtype)
    return out


def paged_attention_grouped(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    cu_q_lens: torch.Tensor,
    scale: float,
    short: int = 16,
    prefix: PrefixPlan | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """:func:`paged_attention_reference` arranged for the CPU: the same float32 softmax attention, with fewer copies.

    torch's fused ``scaled_dot_product_attention`` (grouped-query, so K and V are never repeated per query head;
    masked tiles skipped, no ``[H, T, S]`` score tensor to scale, mask and softmax op by op), and all sequences with
    at most ``short`` new tokens (scoring candidates, short turns) are gathered and attended in one padded batch
    instead of one call each.

    ``prefix`` (optional, :func:`prefix_plan`) names groups of sequences that hold the same KV before their new
    tokens, which start at the same position in each (the candidates of one scoring context): a group's shared keys
    are gathered once and all its new tokens attend to them in one pass. The result is the same attention; a wrong
    promise gives wrong outputs, so only callers that built the sequences that way pass it.

    ``compute_dtype``: queries, keys and values are cast to it for the fused attention (float32 by default;
    ``torch.bfloat16`` in the frozen layers of a bfloat16 prefill, where the CPU's bfloat16 units compute the
    products and the kernel accumulates and normalises in float32). Pure decode steps always compute in float32.
    """
    _check(q, k_pool, v_pool, block_tables, ctx_lens, cu_q_lens)
    n, h, d = q.shape
    block_size, h_kv = k_pool.shape[1], k_pool.shape[2]
    if n == ctx_lens.shape[0] and n > 0 and prefix is None:  # pure decode step: one new token per sequence
        return _decode_reference(q, k_pool, v_pool, block_tables, ctx_lens, scale)
    out = torch.empty_like(q)
    cu = cu_q_lens.tolist()
    lens = ctx_lens.tolist()
    qlen = [cu[b + 1] - cu[b] for b in range(len(lens))]
    done: frozenset[int] = frozenset()
    dt = compute_dtype
    if prefix is not None:
        _shared_prefix_attention(q, k_pool, v_pool, prefix, scale, out, dt)
        done = prefix.members
    batched = [b for b in range(len(lens)) if 0 < qlen[b] <= short and b not in done]
    if batched:
        nb, t_max = len(batched), max(qlen[b] for b in batched)
        n_blocks = (max(lens[b] for b in batched) + block_size - 1) // block_size
        tb = block_tables[batched, :n_blocks]
        k = k_pool[tb].reshape(nb, n_blocks * block_size, h_kv, d).transpose(1, 2).to(dt)  # [B, H_kv, S, D]
        v = v_pool[tb].reshape(nb, n_blocks * block_size, h_kv, d).transpose(1, 2).to(dt)
        rows = torch.zeros(nb, t_max, dtype=torch.long, device=q.device)
        valid = torch.zeros(nb, t_max, dtype=torch.bool, device=q.device)
        for i, b in enumerate(batched):
            rows[i, : qlen[b]] = torch.arange(cu[b], cu[b + 1], device=q.device)
            valid[i, : qlen[b]] = True
        start = torch.tensor([lens[b] - qlen[b] for b in batched], device=q.device)
        pos = start[:, None] + torch.arange(t_max, device=q.device)[None, :]  # absolute position of each query
        allowed = torch.arange(n_blocks * block_size, device=q.device)[None, None, :] <= pos[:, :, None]
        o = F.scaled_dot_product_attention(q[rows].to(dt).transpose(1, 2), k, v, attn_mask=allowed[:, None],
                                           scale=scale, enable_gqa=True)  # [B, H, T, D]
        out[rows[valid]] = o.transpose(1, 2)[valid].to(q.dtype)
    for b in range(len(lens)):
        t, ctx = qlen[b], lens[b]
        if t <= short or b in done:
            continue
        lo, hi = cu[b], cu[b + 1]
        # whole blocks, the keys past the context masked: the same key count as any other path that reads this
        # sequence's blocks, so a row's result does not depend on whether its prefix came from the cache
        ids = block_tables[b, : (ctx + block_size - 1) // block_size]
        k = k_pool[ids].reshape(1, -1, h_kv, d).transpose(1, 2).to(dt)  # [1, H_kv, S, D]
        v = v_pool[ids].reshape(1, -1, h_kv, d).transpose(1, 2).to(dt)
        qb = q[lo:hi].to(dt).transpose(0, 1)[None]  # [1, H, T, D]
        causal = torch.ones(t, k.shape[2], dtype=torch.bool, device=q.device).tril(ctx - t)  # bottom-right aligned
        o = F.scaled_dot_product_attention(qb, k, v, attn_mask=causal, scale=scale, enable_gqa=True)
        out[lo:hi] = o[0].transpose(0, 1).to(q.dtype)
    return out


class PrefixPlan(NamedTuple):
    """Gather indices and mask for sequence groups that share their KV before their new tokens, built once per step
    by :func:`prefix_plan` and used by every layer (see :func:`paged_attention_grouped`)."""

    members: frozenset[int]
    """Sequences attended through the plan (the others take the usual paths)."""
    prefix_blocks: torch.Tensor
    """``[G, P]`` pool blocks of each group's shared prefix (its first member's), zero-padded."""
    new_slots: torch.Tensor
    """``[G, T]`` pool slot of each group's new tokens, members one after another (padding: slot 0)."""
    rows: torch.Tensor
    """``[G, T]`` flat-batch row of each of those tokens (padding: row 0)."""
    valid: torch.Tensor
    """``[G, T]`` True on real tokens."""
    mask: torch.Tensor
    """``[G, 1, T, P * block_size + T]`` keys each query may see: its group's prefix, then its own sequence's new
    tokens up to itself."""


def prefix_plan(block_tables: torch.Tensor, ctx_lens: torch.Tensor, cu_q_lens: torch.Tensor,
                groups: list[list[int]], block_size: int) -> PrefixPlan | None:
    """The :class:`PrefixPlan` of ``groups`` (lists of sequence indices; groups of one are left out), or None.

    Raises:
        ValueError: a group's sequences start their new tokens at different positions.
    """
    groups = [g for g in groups if len(g) > 1]
    if not groups:
        return None
    dev = block_tables.device
    lens, cu = ctx_lens.tolist(), cu_q_lens.tolist()
    tables = block_tables.tolist()
    starts = []
    for g in groups:
        p = lens[g[0]] - (cu[g[0] + 1] - cu[g[0]])
        if any(lens[b] - (cu[b + 1] - cu[b]) != p for b in g):
            raise ValueError(f"a prefix group's sequences must start their new tokens at one position, got group {g}")
        starts.append(p)
    t_max = max(sum(cu[b + 1] - cu[b] for b in g) for g in groups)
    n_pre = (max(starts) + block_size - 1) // block_size
    prefix_blocks = torch.zeros(len(groups), n_pre, dtype=torch.long)
    slots = torch.zeros(len(groups), t_max, dtype=torch.long)
    rows = torch.zeros(len(groups), t_max, dtype=torch.long)
    valid = torch.zeros(len(groups), t_max, dtype=torch.bool)
    mask = torch.zeros(len(groups), t_max, n_pre * block_size + t_max, dtype=torch.bool)
    for i, (g, p) in enumerate(zip(groups, starts, strict=True)):
        nb = (p + block_size - 1) // block_size
        prefix_blocks[i, :nb] = torch.tensor(tables[g[0]][:nb], dtype=torch.long)
        mask[i, :, :p] = True
        o = 0
        for b in g:
            m = cu[b + 1] - cu[b]
            slots[i, o : o + m] = torch.tensor([tables[b][q // block_size] * block_size + q % block_size
                                                for q in range(p, p + m)])
            rows[i, o : o + m] = torch.arange(cu[b], cu[b + 1])
            valid[i, o : o + m] = True
            col = n_pre * block_size + o
            mask[i, o : o + m, col : col + m] = torch.ones(m, m, dtype=torch.bool).tril()
            o += m
        mask[i, o:, 0] = True  # padding queries see one key (their outputs are dropped)
    return PrefixPlan(frozenset(b for g in groups for b in g), prefix_blocks.to(dev), slots.to(dev), rows.to(dev),
                      valid.to(dev), mask[:, None].to(dev))


def _shared_prefix_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, plan: PrefixPlan,
                             scale: float, out: torch.Tensor, dt: torch.dtype = torch.float32) -> None:
    """The plan's queries over their group's prefix (gathered once per group) and their own new keys, into ``out``:
    one padded batch, ``[G, H, T, D]`` queries over ``[G, H_kv, P * block_size + T, D]`` keys."""
    _, _, h_kv, d = k_pool.shape
    n_g = plan.prefix_blocks.shape[0]

    def keys(pool: torch.Tensor) -> torch.Tensor:
        pre = pool[plan.prefix_blocks].reshape(n_g, -1, h_kv, d)
        new = pool.view(-1, h_kv, d)[plan.new_slots]
        return torch.cat([pre, new], dim=1).to(dt).transpose(1, 2)  # [G, H_kv, S, D]

    o = F.scaled_dot_product_attention(q[plan.rows].to(dt).transpose(1, 2), keys(k_pool), keys(v_pool),
                                       attn_mask=plan.mask, scale=scale, enable_gqa=True)  # [G, H, T, D]
    out[plan.rows[plan.valid]] = o.transpose(1, 2)[plan.valid].to(q.dtype)


def decode_plan(
    block_tables: torch.Tensor, ctx_lens: torch.Tensor, block_size: int, h_kv: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices and padding mask of a decode step, shared by every layer of the step.

    A layer's pool ``[num_blocks, block_size, H_kv, D]`` viewed as rows ``[num_blocks * block_size * H_kv, D]``
    holds key ``s`` (slot ``block_tables[b, s // block_size] * block_size + s % block_size``) of KV head ``k`` of
    sequence ``b`` in row ``slot * H_kv + k``. Gathering the rows in ``[B, H_kv, S]`` order yields K and V already
    laid out head-major, so the two attention matmuls need no permute copies.

    Returns:
        ``(rows [B * H_kv * S] int64, mask [B, 1, 1, S] float32)`` with ``S`` the longest context rounded up to
        whole blocks; ``mask`` is 0 on keys ``< ctx_lens[b]`` and ``-inf`` on the padding after them.
    """
    b = ctx_lens.shape[0]
    n_blocks = (int(ctx_lens.max()) + block_size - 1) // block_size
    s = n_blocks * block_size
    dev = block_tables.device
    keys = torch.arange(s, device=dev)
    slots = block_tables[:, :n_blocks].long().repeat_interleave(block_size, dim=1) * block_size + keys % block_size
    heads = torch.arange(h_kv, device=dev)
    rows = (slots[:, None, :] * h_kv + heads[None, :, None]).reshape(-1)  # [B, H_kv, S]
    mask = torch.zeros(b, 1, 1, s, dtype=torch.float32, device=dev)
    mask.masked_fill_((keys[None, :] >= ctx_lens[:, None])[:, None, None, :], float("-inf"))
    return rows, mask


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    plan: tuple[torch.Tensor, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Decode-step attention (one query per sequence, at its last position) with a precomputed :func:`decode_plan`.

    ``out[b, h] = softmax(scale * q[b, h] K_b^T + mask_b) V_b`` over sequence ``b``'s keys, computed in float32;
    query head ``h`` reads KV head ``h // (H / H_kv)``.

    Returns:
        ``[B, H, D]`` tensor in ``q``'s dtype.
    """
    rows, mask = plan
    b, h, d = q.shape
    h_kv = k_pool.shape[2]
    s = mask.shape[-1]
    k = k_pool.reshape(-1, d).index_select(0, rows).view(b, h_kv, s, d).float()
    v = v_pool.reshape(-1, d).index_select(0, rows).view(b, h_kv, s, d).float()
    qg = q.float().view(b, h_kv, h // h_kv, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale).add_(mask)  # [B, H_kv, G, S]
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).reshape(b, h, d).to(q.dtype)


def _decode_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The reference for a decode step (one query per sequence, at its last position): all sequences at once,
    their blocks gathered into a padded ``[B, H_kv, S_max, D]`` tensor and the padding masked out."""
    plan = decode_plan(block_tables, ctx_lens, k_pool.shape[1], k_pool.shape[2])
    return paged_decode_attention(q, k_pool, v_pool, plan, scale)


# ----------------------------------------------------------------------------------------------- triton
if HAS_TRITON:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        block_tables_ptr,
        seq_idx_ptr,
        pos_ptr,
        scale,
        stride_qn,
        stride_qh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
    ):
        # One program per (new token i, query head h): online softmax over the key blocks 0..pos_i.
        i = tl.program_id(0)
        h = tl.program_id(1)
        kv_h = h // GROUP
        seq = tl.load(seq_idx_ptr + i)
        pos = tl.load(pos_ptr + i)
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(q_ptr + i * stride_qn + h * stride_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        offs_s = tl.arange(0, BLOCK_SIZE)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        n_blocks = pos // BLOCK_SIZE + 1
        for j in range(0, n_blocks):
            blk = tl.load(block_tables_ptr + seq * stride_bt + j)
            tok = j * BLOCK_SIZE + offs_s
            valid = tok <= pos
            base = blk * stride_kb + kv_h * stride_kh
            kv_off = base + offs_s[:, None] * stride_ks + offs_d[None, :]
            kv_mask = valid[:, None] & d_mask[None, :]
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            s = tl.where(valid, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(out_ptr + i * stride_qn + h * stride_qh + offs_d, out, mask=d_mask)


def _paged_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    cu_q_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    _check(q, k_pool, v_pool, block_tables, ctx_lens, cu_q_lens)
    n, h, d = q.shape
    block_size, h_kv = k_pool.shape[1], k_pool.shape[2]
    if block_size != next_power_of_2(block_size):
        raise ValueError(f"the Triton kernel needs a power-of-two block_size, got block_size={block_size}")
    q_c = q.contiguous()
    k_c = k_pool.contiguous()
    v_c = v_pool.contiguous()
    bt = block_tables.to(torch.int32).contiguous()
    seq_idx, pos = positions_of_new_tokens(ctx_lens, cu_q_lens)
    out = torch.empty(q_c.shape, dtype=torch.float32, device=q.device)
    if n == 0:
        return out.to(q.dtype)
    _paged_attention_kernel[(n, h)](
        q_c,
        k_c,
        v_c,
        out,
        bt,
        seq_idx.to(torch.int32),
        pos.to(torch.int32),
        float(scale),
        q_c.stride(0),
        q_c.stride(1),
        k_c.stride(0),
        k_c.stride(1),
        k_c.stride(2),
        bt.stride(0),
        GROUP=h // h_kv,
        HEAD_DIM=d,
        BLOCK_D=next_power_of_2(d),
        BLOCK_SIZE=block_size,
    )
    return out.to(q.dtype)


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    cu_q_lens: torch.Tensor,
    scale: float,
    use_triton: bool | None = None,
    prefix: PrefixPlan | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Attention of new tokens over their sequences' paged KV (prefix + rolling); see the module docstring.

    Args:
        q: ``[N, H, D]`` queries of the new tokens (RoPE applied).
        k_pool: ``[num_blocks, block_size, H_kv, D]`` keys of one layer (new tokens already written).
        v_pool: same shape, values.
        block_tables: ``[B, max_blocks]`` pool block ids per sequence.
        ctx_lens: ``[B]`` KV length per sequence, new tokens included.
        cu_q_lens: ``[B + 1]`` cumulative new-token counts.
        scale: softmax scale, usually ``D ** -0.5``.
        use_triton: True = Triton kernel, False = torch reference, None = kernel on CUDA (or when
            ``TRITON_INTERPRET=1`` / ``ECHORL_USE_TRITON=1``), :func:`paged_attention_grouped` otherwise.
        prefix: sequences sharing their KV before their new tokens (:func:`prefix_plan`, for
            :func:`paged_attention_grouped`); the Triton kernel reads each sequence's own blocks and ignores it.
        compute_dtype: what :func:`paged_attention_grouped` casts queries, keys and values to (``torch.bfloat16``
            for the frozen layers of a bfloat16 prefill); the Triton kernel and decode steps compute in float32.

    Returns:
        ``[N, H, D]`` attention outputs.
    """
    if use_kernel(use_triton, q, k_pool):
        return _paged_attention_triton(q, k_pool, v_pool, block_tables, ctx_lens, cu_q_lens, scale)
    return paged_attention_grouped(q, k_pool, v_pool, block_tables, ctx_lens, cu_q_lens, scale, prefix=prefix,
                                   compute_dtype=compute_dtype)
