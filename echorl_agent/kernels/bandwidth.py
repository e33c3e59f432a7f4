"""Attention-bandwidth kernels of the seed README (EchoRL Eq. 4-5 and the bandwidth-aware scheduler).

* Attention bandwidth cost of a context of t tokens: ``b(s_{1:t}) = scale * t (t + 1) / 2`` -- causal attention
  reads 1 + 2 + ... + t key/value rows to produce t tokens.
* Effective bandwidth cost when the first t' tokens come from a frozen prefix KV:
  ``b_eff = b(s_{1:t}) - b(s_{1:t'})`` (only the rolling part is recomputed).
* Bandwidth-aware priority of request i: ``r_i / (b_eff,i + q_i + eps)`` (q_i: queueing/length penalty).
* Bandwidth efficiency: ``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w |l_PG|])`` (episode means of return and
  effective bandwidth, batch mean of importance-weighted policy-gradient loss magnitudes).

Costs are computed in float64 (t up to ~10^7 keeps integers exact); priorities and eta_bw are float64 too.
"""

from __future__ import annotations

import torch

from echorl_agent.kernels._dispatch import HAS_TRITON, tl, triton, use_kernel

__all__ = [
    "attention_bandwidth_cost",
    "attention_bandwidth_cost_reference",
    "effective_bandwidth_cost",
    "effective_bandwidth_cost_reference",
    "bandwidth_priority",
    "bandwidth_priority_reference",
    "bandwidth_efficiency",
    "bandwidth_efficiency_reference",
]

_BLOCK = 256


# ----------------------------------------------------------------------------------------------- references
def attention_bandwidth_cost_reference(t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale * t (t + 1) / 2`` elementwise, float64."""
    tf = t.double()
    return scale * (tf * (tf + 1.0)) * 0.5


def effective_bandwidth_cost_reference(t: torch.Tensor, t_prefix: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``b(s_{1:t}) - b(s_{1:t'})`` elementwise, float64."""
    return attention_bandwidth_cost_reference(t, scale) - attention_bandwidth_cost_reference(t_prefix, scale)


def bandwidth_priority_reference(
    rewards: torch.Tensor, b_eff: torch.Tensor, q: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``r / (b_eff + q + eps)`` elementwise, float64."""
    return rewards.double() / (b_eff.double() + q.double() + eps)


def bandwidth_efficiency_reference(
    episode_returns: torch.Tensor,
    episode_b_eff: torch.Tensor,
    weights: torch.Tensor | None = None,
    pg_losses: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mean(returns) / (mean(b_eff) + mean(w * |l_PG|))`` as a float64 scalar tensor (w=1 when None)."""
    num = episode_returns.double().mean()
    den = episode_b_eff.double().mean()
    if pg_losses is not None and pg_losses.numel():
        w = torch.ones_like(pg_losses, dtype=torch.float64) if weights is None else weights.double()
        den = den + (w * pg_losses.double().abs()).mean()
    return num / den


def _check_same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_b} must have the shape of {name_a} {tuple(a.shape)}, got {tuple(b.shape)}")


# ----------------------------------------------------------------------------------------------- kernels
if HAS_TRITON:

    @triton.jit
    def _beff_kernel(t_ptr, tp_ptr, out_ptr, N, scale, HAS_PREFIX: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        t = tl.load(t_ptr + offs, mask=m, other=0).to(tl.float64)
        b = scale * (t * (t + 1.0)) * 0.5
        if HAS_PREFIX:
            tp = tl.load(tp_ptr + offs, mask=m, other=0).to(tl.float64)
            b = b - scale * (tp * (tp + 1.0)) * 0.5
        tl.store(out_ptr + offs, b, mask=m)

    @triton.jit
    def _bw_priority_kernel(r_ptr, b_ptr, q_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        r = tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float64)
        b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float64)
        q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float64)
        tl.store(out_ptr + offs, r / (b + q + eps), mask=m)

    @triton.jit
    def _eta_bw_kernel(ret_ptr, beff_ptr, w_ptr, l_ptr, out_ptr, E, B, BLOCK: tl.constexpr):
        # Single program: three float64 reductions, then the ratio.
        offs0 = tl.arange(0, BLOCK)
        sr = tl.zeros([BLOCK], dtype=tl.float64)
        sb = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(0, E, BLOCK):
            offs = start + offs0
            m = offs < E
            sr += tl.load(ret_ptr + offs, mask=m, other=0.0).to(tl.float64)
            sb += tl.load(beff_ptr + offs, mask=m, other=0.0).to(tl.float64)
        sl = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(0, B, BLOCK):
            offs = start + offs0
            m = offs < B
            w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float64)
            loss = tl.load(l_ptr + offs, mask=m, other=0.0).to(tl.float64)
            sl += w * tl.abs(loss)
        num = tl.sum(sr, axis=0) / E
        den = tl.sum(sb, axis=0) / E
        pg = tl.sum(sl, axis=0)
        pg = tl.where(B > 0, pg / tl.maximum(B, 1), 0.0)
        tl.store(out_ptr, num / (den + pg))


# ----------------------------------------------------------------------------------------------- dispatchers
def _grid(n: int) -> tuple[int]:
    return (max(1, triton.cdiv(n, _BLOCK)),)


def attention_bandwidth_cost(t: torch.Tensor, scale: float = 1.0, use_triton: bool | None = None) -> torch.Tensor:
    """Attention bandwidth cost ``b(s_{1:t})`` (see :func:`attention_bandwidth_cost_reference`)."""
    if bool((t < 0).any()):
        raise ValueError("t (context lengths) must be >= 0; got a negative length")
    if not use_kernel(use_triton, t):
        return attention_bandwidth_cost_reference(t, scale)
    tc = t.contiguous()
    out = torch.empty(t.shape, dtype=torch.float64, device=t.device)
    _beff_kernel[_grid(t.numel())](tc, tc, out, t.numel(), float(scale), HAS_PREFIX=False, BLOCK=_BLOCK)
    return out


def effective_bandwidth_cost(
    t: torch.Tensor, t_prefix: torch.Tensor, scale: float = 1.0, use_triton: bool | None = None
) -> torch.Tensor:
    """Effective bandwidth cost ``b(s_{1:t}) - b(s_{1:t'})`` (see :func:`effective_bandwidth_cost_reference`)."""
    _check_same("t", t, "t_prefix", t_prefix)
    if bool((t_prefix < 0).any()) or bool((t_prefix > t).any()):
        raise ValueError("t_prefix must satisfy 0 <= t_prefix <= t elementwise (the frozen prefix is part of t)")
    if not use_kernel(use_triton, t, t_prefix):
        return effective_bandwidth_cost_reference(t, t_prefix, scale)
    out = torch.empty(t.shape, dtype=torch.float64, device=t.device)
    _beff_kernel[_grid(t.numel())](
        t.contiguous(), t_prefix.contiguous(), out, t.numel(), float(scale), HAS_PREFIX=True, BLOCK=_BLOCK
    )
    return out


def bandwidth_priority(
    rewards: torch.Tensor, b_eff: torch.Tensor, q: torch.Tensor, eps: float = 1e-6, use_triton: bool | None = None
) -> torch.Tensor:
    """Bandwidth-aware priority ``r / (b_eff + q + eps)`` (see :func:`bandwidth_priority_reference`)."""
    _check_same("rewards", rewards, "b_eff", b_eff)
    _check_same("rewards", rewards, "q", q)
    if eps <= 0:
        raise ValueError(f"eps must be > 0 to keep the priority finite, got eps={eps}")
    if not use_kernel(use_triton, rewards, b_eff, q):
        return bandwidth_priority_reference(rewards, b_eff, q, eps)
    out = torch.empty(rewards.shape, dtype=torch.float64, device=rewards.device)
    _bw_priority_kernel[_grid(rewards.numel())](
        rewards.contiguous(), b_eff.contiguous(), q.contiguous(), out, rewards.numel(), float(eps), BLOCK=_BLOCK
    )
    return out


def bandwidth_efficiency(
    episode_returns: torch.Tensor,
    episode_b_eff: torch.Tensor,
    weights: torch.Tensor | None = None,
    pg_losses: torch.Tensor | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Bandwidth efficiency ``eta_bw`` (see :func:`bandwidth_efficiency_reference`); a float64 scalar tensor."""
    _check_same("episode_returns", episode_returns, "episode_b_eff", episode_b_eff)
    if episode_returns.numel() == 0:
        raise ValueError("episode_returns must hold at least one episode to average, got 0")
    if pg_losses is not None and weights is not None:
        _check_same("pg_losses", pg_losses, "weights", weights)
    if not use_kernel(use_triton, episode_returns, episode_b_eff):
        return bandwidth_efficiency_reference(episode_returns, episode_b_eff, weights, pg_losses)
    dev = episode_returns.device
    losses = pg_losses if pg_losses is not None else torch.zeros(0, device=dev)
    w = weights if weights is not None else torch.ones_like(losses)
    out = torch.empty((), dtype=torch.float64, device=dev)
    _eta_bw_kernel[(1,)](
        episode_returns.contiguous().reshape(-1),
        episode_b_eff.contiguous().reshape(-1),
        w.contiguous().reshape(-1),
        losses.contiguous().reshape(-1),
        out,
        episode_returns.numel(),
        losses.numel(),
        BLOCK=_BLOCK,
    )
    return out
