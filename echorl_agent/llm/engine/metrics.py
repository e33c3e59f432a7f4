"""Attention-bandwidth bookkeeping of rollouts (seed README; EchoRL Eq. 15 for rho).

* ``b(s_{1:t}) = scale * t (t + 1) / 2`` -- key reads of causal attention over a t-token context;
* ``b_eff = b(s_{1:t}) - b(s_{1:t'})`` -- what remains when the first t' tokens come from the prefix cache;
* ``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w |l_PG|])`` -- return per unit of bandwidth (+ weighted policy-gradient
  loss magnitude, the learning cost), per episode expectations;
* ``rho = |KV_frozen| / |KV_total|`` -- cached prompt tokens over all prompt tokens.

:class:`BandwidthEfficiencyTracker` collects per-request (t, t') pairs and per-episode rewards from the engine's
real cache statistics (``GenerationResult.num_cached_tokens``) and reports them with :meth:`snapshot`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from echorl_agent.llm.engine.scheduler import attention_bandwidth, effective_bandwidth

__all__ = ["BandwidthEfficiencyTracker", "BandwidthSnapshot", "attention_bandwidth", "effective_bandwidth",
           "speedup_bound"]


def speedup_bound(rho: float, t: float) -> float:
    """gamma(rho) = 1 / (1 - rho + rho / T): prefill speed-up bound when a fraction rho of the KV is reused and a
    cached token costs 1/T of a computed one (Amdahl form used by the issue's benchmark 1)."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got rho={rho}")
    if t <= 0:
        raise ValueError(f"T must be > 0, got T={t}")
    return 1.0 / (1.0 - rho + rho / t)


@dataclass(frozen=True)
class BandwidthSnapshot:
    """Aggregates reported by :meth:`BandwidthEfficiencyTracker.snapshot`."""

    num_episodes: int
    num_requests: int
    mean_return: float
    """E[sum r] over finished episodes."""
    mean_bandwidth: float
    """E[sum b(s_{1:t})] per episode (no cache)."""
    mean_effective_bandwidth: float
    """E[sum b_eff] per episode (with the prefix cache)."""
    total_bandwidth_saved: float
    """sum over all requests of b(s_{1:t}) - b_eff = b(s_{1:t'})."""
    saved_fraction: float
    """total saved / total b."""
    reuse_rate: float
    """rho = cached prompt tokens / prompt tokens."""
    mean_pg_loss_term: float
    """E_B[w |l_PG|]."""
    eta_bw: float
    """E[sum r] / (E[sum b_eff] + E_B[w |l_PG|]); 0 when the denominator is 0."""


class BandwidthEfficiencyTracker:
    """Accumulates bandwidth and reward statistics of LLM rollouts.

    Args:
        scale: the ``scale`` of ``b(s_{1:t})``.
        loss_weight: ``w`` in ``E_B[w |l_PG|]``.
    """

    def __init__(self, scale: float = 1.0, loss_weight: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got scale={scale}")
        if loss_weight < 0:
            raise ValueError(f"loss_weight must be >= 0, got loss_weight={loss_weight}")
        self.scale = scale
        self.loss_weight = loss_weight
        self._open: dict[object, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # return, b, b_eff
        self._episodes: list[tuple[float, float, float]] = []
        self._pg_terms: list[float] = []
        self.num_requests = 0
        self.total_b = 0.0
        self.total_b_eff = 0.0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def record_request(self, num_prompt_tokens: int, num_cached_tokens: int, actor: object = 0) -> None:
        """One model call of ``actor`` over a context of t tokens, the first t' served from the cache."""
        if not 0 <= num_cached_tokens <= num_prompt_tokens:
            raise ValueError(
                f"need 0 <= num_cached_tokens <= num_prompt_tokens, got {num_cached_tokens} and {num_prompt_tokens}"
            )
        b = attention_bandwidth(num_prompt_tokens, self.scale)
        be = effective_bandwidth(num_prompt_tokens, num_cached_tokens, self.scale)
        ep = self._open[actor]
        ep[1] += b
        ep[2] += be
        self.num_requests += 1
        self.total_b += b
        self.total_b_eff += be
        self.prompt_tokens += num_prompt_tokens
        self.cached_tokens += num_cached_tokens

    def record_reward(self, reward: float, actor: object = 0) -> None:
        self._open[actor][0] += float(reward)

    def end_episode(self, actor: object = 0) -> None:
        """Close ``actor``'s episode (its return and bandwidth sums enter the expectations)."""
        ep = self._open.pop(actor, [0.0, 0.0, 0.0])
        self._episodes.append((ep[0], ep[1], ep[2]))

    def record_pg_loss(self, loss: float) -> None:
        """One minibatch's policy-gradient loss l_PG (its weighted magnitude enters eta_bw)."""
        self._pg_terms.append(self.loss_weight * abs(float(loss)))

    def snapshot(self) -> BandwidthSnapshot:
        n = len(self._episodes)
        mean_ret = sum(e[0] for e in self._episodes) / n if n else 0.0
        mean_b = sum(e[1] for e in self._episodes) / n if n else 0.0
        mean_be = sum(e[2] for e in self._episodes) / n if n else 0.0
        pg = sum(self._pg_terms) / len(self._pg_terms) if self._pg_terms else 0.0
        denom = mean_be + pg
        return BandwidthSnapshot(
            num_episodes=n,
            num_requests=self.num_requests,
            mean_return=mean_ret,
            mean_bandwidth=mean_b,
            mean_effective_bandwidth=mean_be,
            total_bandwidth_saved=self.total_b - self.total_b_eff,
            saved_fraction=(self.total_b - self.total_b_eff) / self.total_b if self.total_b else 0.0,
            reuse_rate=self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            mean_pg_loss_term=pg,
            eta_bw=mean_ret / denom if denom > 0 else 0.0,
        )
