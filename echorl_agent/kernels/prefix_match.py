"""Batched prefix match: the longest common prefix (LCP) of token-id arrays.

The rollout engine's prefix cache asks, for each request, how many leading prompt tokens it shares with a cached
sequence; that count is the frozen part ``|KV_frozen(s_{1:t'})|`` of EchoRL Eq. 4 and decides how much prefill is
skipped. ``longest_common_prefix(a, a_len, b, b_len)[i]`` is the largest ``k <= min(a_len[i], b_len[i])`` with
``a[i, :k] == b[i, :k]``. ``b`` (and ``b_len``) may have a leading dimension of 1 to match one sequence against many.
"""

from __future__ import annotations

import torch

from echorl_agent.kernels._dispatch import HAS_TRITON, next_power_of_2, tl, triton, use_kernel

__all__ = ["longest_common_prefix", "longest_common_prefix_reference"]


def _normalize(
    a: torch.Tensor, a_len: torch.Tensor | None, b: torch.Tensor, b_len: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if a.dim() == 1:
        a = a[None, :]
    if b.dim() == 1:
        b = b[None, :]
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be [B, L] token-id tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    B = a.shape[0]
    if b.shape[0] not in (1, B):
        raise ValueError(f"b must have batch size 1 or B={B} (a.shape[0]), got b.shape={tuple(b.shape)}")
    if a_len is None:
        a_len = torch.full((B,), a.shape[1], dtype=torch.int64, device=a.device)
    if b_len is None:
        b_len = torch.full((b.shape[0],), b.shape[1], dtype=torch.int64, device=b.device)
    a_len = a_len.reshape(-1).to(torch.int64)
    b_len = b_len.reshape(-1).to(torch.int64)
    if a_len.shape[0] != B or b_len.shape[0] != b.shape[0]:
        raise ValueError(
            f"a_len must have B={B} entries and b_len b.shape[0]={b.shape[0]}, got {a_len.shape[0]} and {b_len.shape[0]}"
        )
    if bool((a_len > a.shape[1]).any()) or bool((b_len > b.shape[1]).any()) or bool((a_len < 0).any()):
        raise ValueError("a_len/b_len must lie in [0, L] of their arrays; got a length beyond the padded width")
    b = b.expand(B, -1)
    b_len = b_len.expand(B)
    return a, a_len, b, b_len


def longest_common_prefix_reference(
    a: torch.Tensor,
    a_len: torch.Tensor | None,
    b: torch.Tensor,
    b_len: torch.Tensor | None,
) -> torch.Tensor:
    """Torch reference of the batched longest common prefix.

    Args:
        a: ``[B, La]`` (or ``[La]``) token ids, right-padded with anything.
        a_len: ``[B]`` valid lengths of ``a`` rows (None: all ``La``).
        b: ``[B, Lb]`` or ``[1, Lb]`` (or ``[Lb]``) token ids.
        b_len: ``[B]`` or ``[1]`` valid lengths of ``b`` rows (None: all ``Lb``).

    Returns:
        ``[B]`` int64 LCP lengths.
    """
    a, a_len, b, b_len = _normalize(a, a_len, b, b_len)
    L = min(a.shape[1], b.shape[1])
    min_len = torch.minimum(a_len, b_len)
    if L == 0:
        return torch.zeros_like(min_len)
    cols = torch.arange(L, device=a.device)[None, :]
    eq = (a[:, :L] == b[:, :L]) & (cols < min_len[:, None])
    return torch.cumprod(eq.to(torch.int64), dim=1).sum(dim=1)


if HAS_TRITON:

    @triton.jit
    def _lcp_kernel(a_ptr, b_ptr, alen_ptr, blen_ptr, out_ptr, stride_a, stride_b, BLOCK: tl.constexpr):
        # One program per row: scan BLOCK columns at a time, stop at the first mismatch.
        row = tl.program_id(0)
        n = tl.minimum(tl.load(alen_ptr + row), tl.load(blen_ptr + row))
        first = n
        for c0 in range(0, n, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            m = cols < n
            x = tl.load(a_ptr + row * stride_a + cols, mask=m, other=0)
            y = tl.load(b_ptr + row * stride_b + cols, mask=m, other=0)
            mis = tl.where(m & (x != y), cols, n)
            first = tl.minimum(first, tl.min(mis, axis=0))
        tl.store(out_ptr + row, first)


def longest_common_prefix(
    a: torch.Tensor,
    a_len: torch.Tensor | None,
    b: torch.Tensor,
    b_len: torch.Tensor | None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Batched longest common prefix (see :func:`longest_common_prefix_reference`); kernel on CUDA or on request."""
    if not use_kernel(use_triton, a, b):
        return longest_common_prefix_reference(a, a_len, b, b_len)
    a, a_len, b, b_len = _normalize(a, a_len, b, b_len)
    B = a.shape[0]
    out = torch.empty(B, dtype=torch.int64, device=a.device)
    if B == 0:
        return out
    a_c = a.to(torch.int64).contiguous()
    # An expanded b (stride 0 on the batch axis) is read without materialising the copies.
    b64 = b.to(torch.int64)
    if b64.stride(1) != 1:
        b64 = b64.contiguous()
    stride_b = b64.stride(0)
    block = min(next_power_of_2(min(a.shape[1], b.shape[1])), 256)
    _lcp_kernel[(B,)](
        a_c, b64, a_len.contiguous(), b_len.contiguous(), out, a_c.stride(0), stride_b, BLOCK=block
    )
    return out
