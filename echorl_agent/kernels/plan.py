"""Plan kernels of the hot/cold replay (EchoRL Eq. 6-7): EMA plan update and plan surprise.

* EMA plan update: ``tau_bar' = (1 - lam) * tau_bar + lam * mean_b(plans[b])`` -- the running mean plan that the
  replay priorities measure surprise against (one EMA step per added batch of plans).
* Plan surprise: ``s_t = ||tau_t - tau_bar||^2 + alpha * |r_t|`` -- the priority score whose softmax is the sampling
  distribution of :class:`echorl_agent.replay.HotColdReplayBuffer`.

Each has a torch reference, a Triton kernel (defined only when triton imports) and a dispatcher.
"""

from __future__ import annotations

import torch

from echorl_agent.kernels._dispatch import HAS_TRITON, next_power_of_2, tl, triton, use_kernel

__all__ = ["ema_plan_update", "ema_plan_update_reference", "plan_surprise", "plan_surprise_reference"]


def _check_plans(plans: torch.Tensor, tau_bar: torch.Tensor) -> None:
    if plans.dim() != 2:
        raise ValueError(f"plans must be 2-D [N, d], got shape {tuple(plans.shape)}; reshape with plans.view(N, -1)")
    if tau_bar.dim() != 1 or tau_bar.shape[0] != plans.shape[1]:
        raise ValueError(
            f"tau_bar must be 1-D of length d={plans.shape[1]} (plans.shape[1]), got shape {tuple(tau_bar.shape)}"
        )


# ----------------------------------------------------------------------------------------------- references
def ema_plan_update_reference(tau_bar: torch.Tensor, plans: torch.Tensor, decay: float) -> torch.Tensor:
    """Torch reference of the EMA plan update: ``(1 - decay) * tau_bar + decay * plans.mean(0)``.

    Args:
        tau_bar: ``[d]`` current EMA plan.
        plans: ``[B, d]`` new plans (B >= 1).
        decay: EMA rate ``lam`` in (0, 1].

    Returns:
        ``[d]`` float32 updated EMA plan (a new tensor).
    """
    _check_plans(plans, tau_bar)
    mean = plans.float().mean(dim=0)
    return (1.0 - decay) * tau_bar.float() + decay * mean


def plan_surprise_reference(
    plans: torch.Tensor, tau_bar: torch.Tensor, rewards: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Torch reference of the plan surprise ``||tau_t - tau_bar||^2 + alpha * |r_t|`` (EchoRL Eq. 6).

    Args:
        plans: ``[N, d]`` plans tau_t.
        tau_bar: ``[d]`` EMA plan.
        rewards: ``[N]`` rewards r_t.
        alpha: reward weight.

    Returns:
        ``[N]`` float32 scores.
    """
    _check_plans(plans, tau_bar)
    diff = plans.float() - tau_bar.float()[None, :]
    return (diff * diff).sum(dim=1) + alpha * rewards.float().abs()


# ----------------------------------------------------------------------------------------------- kernels
if HAS_TRITON:

    @triton.jit
    def _ema_plan_update_kernel(tau_ptr, plans_ptr, out_ptr, B, D, decay, BLOCK_D: tl.constexpr):
        # One program per BLOCK_D columns; loop over the B rows accumulating the column sums.
        pid = tl.program_id(0)
        cols = pid * BLOCK_D + tl.arange(0, BLOCK_D)
        mask = cols < D
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for b in range(0, B):
            acc += tl.load(plans_ptr + b * D + cols, mask=mask, other=0.0).to(tl.float32)
        tau = tl.load(tau_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        out = (1.0 - decay) * tau + decay * (acc / B)
        tl.store(out_ptr + cols, out, mask=mask)

    @triton.jit
    def _plan_surprise_kernel(
        plans_ptr, tau_ptr, rew_ptr, out_ptr, N, D, alpha, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
    ):
        # One program per BLOCK_N rows; the plan dimension is looped in BLOCK_D chunks.
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            cmask = cols < D
            x = tl.load(plans_ptr + rows[:, None] * D + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
            t = tl.load(tau_ptr + cols, mask=cmask, other=0.0)
            diff = tl.where(rmask[:, None] & cmask[None, :], x.to(tl.float32) - t.to(tl.float32)[None, :], 0.0)
            acc += tl.sum(diff * diff, axis=1)
        r = tl.load(rew_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, acc + alpha * tl.abs(r), mask=rmask)


# ----------------------------------------------------------------------------------------------- dispatchers
def ema_plan_update(
    tau_bar: torch.Tensor, plans: torch.Tensor, decay: float, use_triton: bool | None = None
) -> torch.Tensor:
    """EMA plan update (see :func:`ema_plan_update_reference`), Triton kernel on CUDA or when requested."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay must be in (0, 1], got decay={decay}; it is the EMA rate lam of tau_bar")
    if plans.dim() == 1:
        plans = plans[None, :]
    if plans.shape[0] == 0:
        raise ValueError("plans must hold at least one row (got B=0); skip the update when there is no new plan")
    if not use_kernel(use_triton, tau_bar, plans):
        return ema_plan_update_reference(tau_bar, plans, decay)
    _check_plans(plans, tau_bar)
    plans_c = plans.contiguous()
    tau_c = tau_bar.contiguous()
    B, D = plans_c.shape
    out = torch.empty(D, dtype=torch.float32, device=plans.device)
    block = min(next_power_of_2(D), 1024)
    _ema_plan_update_kernel[(triton.cdiv(D, block),)](tau_c, plans_c, out, B, D, float(decay), BLOCK_D=block)
    return out


def plan_surprise(
    plans: torch.Tensor,
    tau_bar: torch.Tensor,
    rewards: torch.Tensor,
    alpha: float,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Plan surprise (see :func:`plan_surprise_reference`), Triton kernel on CUDA or when requested."""
    if rewards.shape != plans.shape[:1]:
        raise ValueError(
            f"rewards must have shape [N]=({plans.shape[0]},) matching plans, got {tuple(rewards.shape)}"
        )
    if not use_kernel(use_triton, plans, tau_bar, rewards):
        return plan_surprise_reference(plans, tau_bar, rewards, alpha)
    _check_plans(plans, tau_bar)
    plans_c, tau_c, rew_c = plans.contiguous(), tau_bar.contiguous(), rewards.contiguous()
    N, D = plans_c.shape
    out = torch.empty(N, dtype=torch.float32, device=plans.device)
    block_d = min(next_power_of_2(D), 128)
    block_n = 64
    _plan_surprise_kernel[(triton.cdiv(N, block_n),)](
        plans_c, tau_c, rew_c, out, N, D, float(alpha), BLOCK_N=block_n, BLOCK_D=block_d
    )
    return out
