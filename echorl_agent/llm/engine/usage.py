"""Per-agent token and bandwidth accounting for LLM agents (the counters the evaluation runner reports).

Every LLM request an agent makes (a generation or a scoring call) reports how many prompt tokens came from the
prefix cache (``t'``, EchoRL's KV_frozen) and how many were prefilled (``t - t'``). From those the meter keeps:

* ``prompt_tokens`` / ``cached_tokens`` / ``generated_tokens`` / ``llm_calls`` -- monotone counters;
* ``bandwidth`` -- the summed effective attention bandwidth ``b_eff = b(s_{1:t}) - b(s_{1:t'})`` with
  ``b(s_{1:t}) = scale * t (t + 1) / 2`` (seed README; :func:`echorl_agent.llm.engine.scheduler.effective_bandwidth`);
* ``eta_bw`` -- the running *sum* of per-episode ``eta_bw = sum_t r_t / (sum b_eff + E_B[w |l_PG|])`` (seed
  README); the policy-gradient term is 0 for agents that do not learn. It is a sum so that the runner, which
  reports ``stats()`` after an episode minus before it, gets exactly that episode's ``eta_bw``;
* ``cost_usd`` -- with :class:`TokenPrices` (a hosted API's per-token prices): computed prompt tokens, cached
  prompt tokens and generated tokens, each at its own price (reported only when prices are set).
"""

from __future__ import annotations

from dataclasses import dataclass

from echorl_agent.llm.engine.scheduler import effective_bandwidth

__all__ = ["TokenMeter", "TokenPrices"]


@dataclass(frozen=True)
class TokenPrices:
    """Per-token prices of an LLM endpoint, in USD per million tokens (as API price lists give them)."""

    prompt: float = 0.0
    """Prompt tokens the server computed (not served from its prefix cache)."""
    cached: float | None = None
    """Prompt tokens served from the prefix cache (None = the ``prompt`` price: the server gives no discount)."""
    completion: float = 0.0
    """Generated tokens."""

    def __post_init__(self) -> None:
        for name in ("prompt", "cached", "completion"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ValueError(f"{name} price must be >= 0 USD per million tokens, got {name}={v!r}")

    def cost(self, cached: int, computed: int, generated: int) -> float:
        """USD for one request."""
        cached_price = self.prompt if self.cached is None else self.cached
        return (computed * self.prompt + cached * cached_price + generated * self.completion) / 1e6


@dataclass
class TokenMeter:
    """Cumulative LLM usage of one agent (see the module docstring).

    Args:
        bandwidth_scale: ``scale`` of ``b(s_{1:t})``; the default 1e-6 counts millions of query-key pairs.
        prices: per-token prices; None reports no ``cost_usd``.
    """

    bandwidth_scale: float = 1e-6
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    llm_calls: int = 0
    bandwidth: float = 0.0
    eta_bw_sum: float = 0.0
    episode_return: float = 0.0
    episode_bandwidth: float = 0.0
    prices: TokenPrices | None = None
    cost_usd: float = 0.0

    def __post_init__(self) -> None:
        if self.bandwidth_scale <= 0:
            raise ValueError(f"bandwidth_scale must be > 0, got bandwidth_scale={self.bandwidth_scale}")

    def add(self, cached: int, computed: int, generated: int = 0) -> None:
        """Record one request: ``cached`` prompt tokens from the cache, ``computed`` prefilled, ``generated``."""
        if min(cached, computed, generated) < 0:
            raise ValueError(f"token counts must be >= 0, got cached={cached}, computed={computed}, generated={generated}")
        t = cached + computed
        b_eff = effective_bandwidth(t, cached, self.bandwidth_scale)
        self.prompt_tokens += t
        self.cached_tokens += cached
        self.generated_tokens += generated
        self.llm_calls += 1
        self.bandwidth += b_eff
        self.episode_bandwidth += b_eff
        if self.prices is not None:
            self.cost_usd += self.prices.cost(cached, computed, generated)

    def start_episode(self) -> None:
        self.episode_return = 0.0
        self.episode_bandwidth = 0.0

    def reward(self, r: float, done: bool) -> None:
        """Add a reward; at the end of an episode, fold its eta_bw into :attr:`eta_bw_sum`."""
        self.episode_return += float(r)
        if done:
            if self.episode_bandwidth > 0:
                self.eta_bw_sum += self.episode_return / self.episode_bandwidth
            self.start_episode()

    def stats(self) -> dict[str, float]:
        """The counters, under the names the runner's summary reads."""
        out = {
            "prompt_tokens": float(self.prompt_tokens),
            "cached_tokens": float(self.cached_tokens),
            "generated_tokens": float(self.generated_tokens),
            "llm_calls": float(self.llm_calls),
            "bandwidth": self.bandwidth,
            "eta_bw": self.eta_bw_sum,
        }
        if self.prices is not None:
            out["cost_usd"] = self.cost_usd
        return out
