"""Priority softmax sampling with importance-sampling weights (EchoRL Eq. 7; Schaul et al. 2016, Sec. 3.4).

Given scores ``s`` (for instance the plan surprise), the sampling distribution is ``P(i) = softmax(beta * s)_i``.
Samples are drawn by inverse CDF from caller-supplied uniforms ``u`` in [0, 1) -- so the kernel and the reference are
deterministic and comparable -- as ``i = #{j : cdf_j <= u * cdf_{N-1}}`` (``torch.searchsorted(..., right=True)``),
and the importance weights are ``w_i = (N * P(i))^(-beta_is) / max_batch w`` (normalised by the batch maximum, so the
largest weight is 1). The CDF is accumulated in float64 so a 10^6-entry table keeps ~1e-16 resolution.

This flat kernel is O(N) per call; :class:`echorl_agent.buffers.HotColdReplayBuffer` uses a sum tree plus exact
rejection sampling so its per-batch cost does not grow with N.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from echorl_agent.kernels._dispatch import HAS_TRITON, tl, triton, use_kernel

__all__ = ["PrioritySample", "priority_sample", "priority_sample_reference"]


class PrioritySample(NamedTuple):
    """Result of :func:`priority_sample`."""

    indices: torch.Tensor
    """``[B]`` int64 sampled positions."""
    weights: torch.Tensor
    """``[B]`` float32 importance weights ``(N P(i))^(-beta_is)``, normalised by the batch maximum."""
    probs: torch.Tensor
    """``[N]`` float32 sampling distribution ``softmax(beta * scores)``."""


def _check(scores: torch.Tensor, uniforms: torch.Tensor) -> None:
    if scores.dim() != 1 or scores.shape[0] == 0:
        raise ValueError(f"scores must be a non-empty 1-D tensor [N], got shape {tuple(scores.shape)}")
    if uniforms.dim() != 1:
        raise ValueError(f"uniforms must be 1-D [B], got shape {tuple(uniforms.shape)}")


def priority_sample_reference(
    scores: torch.Tensor, uniforms: torch.Tensor, beta: float, beta_is: float
) -> PrioritySample:
    """Torch reference: softmax probabilities, float64 inverse-CDF draw, batch-normalised IS weights.

    Args:
        scores: ``[N]`` priority scores.
        uniforms: ``[B]`` uniforms in [0, 1).
        beta: inverse temperature of the softmax.
        beta_is: importance-sampling exponent (0: no correction, 1: full correction).
    """
    _check(scores, uniforms)
    n = scores.shape[0]
    probs = torch.softmax(beta * scores.float(), dim=0)
    cdf = torch.cumsum(probs.double(), dim=0)
    target = uniforms.double() * cdf[-1]
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=n - 1)
    w = torch.exp(-beta_is * torch.log(n * probs[idx].double())).float()
    if w.numel():
        w = w / w.max()
    return PrioritySample(idx.to(torch.int64), w, probs)


if HAS_TRITON:

    @triton.jit
    def _softmax_cdf_kernel(s_ptr, p_ptr, cdf_ptr, N, beta, BLOCK: tl.constexpr):
        # Single program: pass 1 max, pass 2 normaliser, pass 3 probabilities and the float64 running CDF.
        offs0 = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, N, BLOCK):
            offs = start + offs0
            x = tl.load(s_ptr + offs, mask=offs < N, other=float("-inf")).to(tl.float32) * beta
            m = tl.maximum(m, x)
        mx = tl.max(m, axis=0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            offs = start + offs0
            x = tl.load(s_ptr + offs, mask=offs < N, other=float("-inf")).to(tl.float32) * beta
            acc += tl.where(offs < N, tl.exp(x - mx), 0.0)
        z = tl.sum(acc, axis=0)
        carry = tl.zeros([1], dtype=tl.float64)
        carry = tl.sum(carry, axis=0)
        for start in range(0, N, BLOCK):
            offs = start + offs0
            mask = offs < N
            x = tl.load(s_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32) * beta
            p = tl.where(mask, tl.exp(x - mx) / z, 0.0)
            tl.store(p_ptr + offs, p, mask=mask)
            c = carry + tl.cumsum(p.to(tl.float64), axis=0)
            tl.store(cdf_ptr + offs, c, mask=mask)
            carry = carry + tl.sum(p.to(tl.float64), axis=0)

    @triton.jit
    def _search_kernel(cdf_ptr, p_ptr, u_ptr, idx_ptr, w_ptr, N, B, beta_is, STEPS: tl.constexpr, BLOCK: tl.constexpr):
        # One program per BLOCK samples: branch-free binary search for the first cdf_j > u * cdf_{N-1}.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        bmask = offs < B
        total = tl.load(cdf_ptr + N - 1)
        t = tl.load(u_ptr + offs, mask=bmask, other=0.0).to(tl.float64) * total
        lo = tl.zeros([BLOCK], dtype=tl.int64)
        hi = tl.zeros([BLOCK], dtype=tl.int64) + N
        for _ in range(STEPS):
            active = lo < hi
            mid = (lo + hi) // 2
            v = tl.load(cdf_ptr + mid, mask=bmask & active, other=0.0)
            go_right = v <= t
            lo = tl.where(active & go_right, mid + 1, lo)
            hi = tl.where(active & (~go_right), mid, hi)
        idx = tl.minimum(lo, N - 1)
        p = tl.load(p_ptr + idx, mask=bmask, other=1.0).to(tl.float64)
        w = tl.exp(-beta_is * tl.log(p * N))
        tl.store(idx_ptr + offs, idx, mask=bmask)
        tl.store(w_ptr + offs, w.to(tl.float32), mask=bmask)


def priority_sample(
    scores: torch.Tensor,
    uniforms: torch.Tensor,
    beta: float,
    beta_is: float,
    use_triton: bool | None = None,
) -> PrioritySample:
    """Priority softmax sampling with IS weights (see :func:`priority_sample_reference`)."""
    if not use_kernel(use_triton, scores, uniforms):
        return priority_sample_reference(scores, uniforms, beta, beta_is)
    _check(scores, uniforms)
    n, b = scores.shape[0], uniforms.shape[0]
    dev = scores.device
    s = scores.float().contiguous()
    probs = torch.empty(n, dtype=torch.float32, device=dev)
    cdf = torch.empty(n, dtype=torch.float64, device=dev)
    _softmax_cdf_kernel[(1,)](s, probs, cdf, n, float(beta), BLOCK=1024)
    idx = torch.empty(b, dtype=torch.int64, device=dev)
    w = torch.empty(b, dtype=torch.float32, device=dev)
    if b:
        block = 128
        _search_kernel[(triton.cdiv(b, block),)](
            cdf, probs, uniforms.contiguous(), idx, w, n, b, float(beta_is), STEPS=int(n).bit_length() + 1, BLOCK=block
        )
        w = w / w.max()
    return PrioritySample(idx, w, probs)
