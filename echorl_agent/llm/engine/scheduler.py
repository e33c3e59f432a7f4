"""Request ordering for the engine: EchoRL priority (Eq. 5), bandwidth-aware priority, prefix-match tie-break.

Each waiting request ``i`` carries a reward signal ``r_i`` (the actor's priority, e.g. its recent return; 1.0 by
default) and a compute cost ``q_i`` = the prompt tokens it still has to prefill (its uncached suffix, known from a
prefix-cache match). Policies:

* ``"priority"`` -- EchoRL Eq. 5, ``r_i / (q_i + eps)``: cheap, rewarding requests first;
* ``"bandwidth"`` -- the seed README's bandwidth-aware variant ``r_i / (b_eff,i + q_i + eps)`` with the attention
  bandwidth ``b(s_{1:t}) = scale * t (t + 1) / 2`` and ``b_eff = b(s_{1:t}) - b(s_{1:t'})`` (``t'`` = cached tokens):
  what the uncached part of a long context costs to attend over;
* ``"fcfs"`` -- arrival order.

Ties (and all of ``"fcfs"`` when ``prefix_tiebreak`` is on) are broken by the longest cached prefix first
(SGLang's cache-aware "longest prefix match" policy), then by arrival. A request that waited more than
``max_wait_steps`` scheduling steps jumps ahead (FCFS among such requests), so low-priority actors never starve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["SchedulerConfig", "Scheduler", "attention_bandwidth", "effective_bandwidth", "SchedulableRequest"]


def attention_bandwidth(t: int, scale: float = 1.0) -> float:
    """``b(s_{1:t}) = scale * t (t + 1) / 2``: key reads of causal attention over ``t`` tokens (seed README).

    The one place the formula is written: the scheduler's ``"bandwidth"`` policy, the agents' token meter
    (:class:`~echorl_agent.llm.engine.usage.TokenMeter`) and :class:`~echorl_agent.llm.engine.metrics.BandwidthEfficiencyTracker`
    all call it. ``t (t + 1)`` is an exact integer product, so the result is the float64 of the formula.
    """
    return scale * (t * (t + 1)) * 0.5


def effective_bandwidth(t: int, t_cached: int, scale: float = 1.0) -> float:
    """``b_eff = b(s_{1:t}) - b(s_{1:t'})``: the bandwidth the uncached suffix still costs (seed README)."""
    return attention_bandwidth(t, scale) - attention_bandwidth(t_cached, scale)


class SchedulableRequest(Protocol):
    priority: float
    arrival: int
    num_prompt_tokens: int


@dataclass
class SchedulerConfig:
    """How the engine orders waiting requests."""

    policy: str = "priority"
    """"priority" (r/(q+eps), EchoRL Eq. 5), "bandwidth" (r/(b_eff+q+eps)) or "fcfs"."""
    eps: float = 1.0
    """epsilon in the denominators (tokens)."""
    bandwidth_scale: float = 1e-3
    """scale of b(s_{1:t}) = scale * t(t+1)/2, in the same unit as q (tokens)."""
    prefix_tiebreak: bool = True
    """Break ties by the longest cached prefix (cache-aware scheduling)."""
    max_wait_steps: int = 64
    """Requests waiting more scheduling steps than this go first, oldest first (anti-starvation)."""

    def __post_init__(self) -> None:
        if self.policy not in ("priority", "bandwidth", "fcfs"):
            raise ValueError(f"policy must be 'priority', 'bandwidth' or 'fcfs', got policy={self.policy!r}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got eps={self.eps}")
        if self.bandwidth_scale < 0:
            raise ValueError(f"bandwidth_scale must be >= 0, got bandwidth_scale={self.bandwidth_scale}")
        if self.max_wait_steps < 1:
            raise ValueError(f"max_wait_steps must be >= 1, got max_wait_steps={self.max_wait_steps}")


class Scheduler:
    """Orders waiting requests (see the module docstring). Stateless apart from its config."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()

    def score(self, priority: float, num_prompt_tokens: int, num_cached_tokens: int) -> float:
        """The policy's score of one request (higher runs first)."""
        c = self.config
        q = num_prompt_tokens - num_cached_tokens
        if c.policy == "priority":
            return priority / (q + c.eps)
        if c.policy == "bandwidth":
            b_eff = effective_bandwidth(num_prompt_tokens, num_cached_tokens, c.bandwidth_scale)
            return priority / (b_eff + q + c.eps)
        return 0.0

    def order(self, requests: list, cached_tokens: list[int], step: int) -> list:
        """Return ``requests`` sorted best-first.

        Args:
            requests: objects with ``priority``, ``arrival`` (monotone int) and ``num_prompt_tokens``;
                those with an ``enqueued_step`` attribute take part in anti-starvation.
            cached_tokens: cached prompt tokens of each request (a prefix-cache match), same order.
            step: the engine's current scheduling step.
        """
        c = self.config

        def key(item: tuple) -> tuple:
            req, cached = item
            starving = step - getattr(req, "enqueued_step", step) > c.max_wait_steps
            s = self.score(req.priority, req.num_prompt_tokens, cached)
            tie = cached if c.prefix_tiebreak else 0
            if starving:
                return (0, 0.0, 0, req.arrival)
            return (1, -s, -tie, req.arrival)

        return [r for r, _ in sorted(zip(requests, cached_tokens, strict=True), key=key)]
