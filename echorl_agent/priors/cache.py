"""LLMPriorCache: state embedding -> LLM prior over the admissible actions, reused across similar states.

A lookup with embedding ``e`` (L2-normalised here, so cosine = inner product) and admissible actions ``A``:

1. the nearest stored embedding ``e*`` is found (:mod:`echorl_agent.priors.index`);
2. it is a **hit** when ``cos(e, e*) >= delta`` and the stored prior covers at least ``min_action_overlap`` of
   ``A``; the stored prior, restricted to ``A`` and renormalised, is returned without calling the LLM -- except
   that with probability ``r`` (the refresh rate) the LLM is asked again, the stored prior is replaced and the
   total variation between the old and the new prior is reported as the retrieval error;
3. otherwise it is a **miss**: the LLM is queried, and ``(e, prior)`` is inserted, evicting the least recently
   used entry when the cache holds ``K`` entries.

K, delta and r move online (:class:`~echorl_agent.priors.adaptive.AdaptiveController`); the running hit rate
``h`` (over the last ``hit_window`` lookups) sets the posterior temperature ``tau(h)``
(:class:`~echorl_agent.priors.posterior.PosteriorSampler`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from echorl_agent.priors.adaptive import AdaptiveConfig, AdaptiveController, AdaptiveRecord
from echorl_agent.priors.index import make_index

__all__ = ["PriorCacheConfig", "PriorLookup", "CacheCounters", "LLMPriorCache", "total_variation"]


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """``0.5 * sum |p - q|`` of two distributions over the same support."""
    return float(0.5 * np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)).sum())


@dataclass
class PriorCacheConfig:
    """Initial knobs of :class:`LLMPriorCache` (the adaptive rules move K, delta and r from here)."""

    capacity: int = 512
    """K: entries kept (least recently used evicted)."""
    delta: float = 0.95
    """Cosine similarity threshold of a hit."""
    refresh_rate: float = 0.05
    """r: probability that a hit re-queries the LLM and replaces the stored prior."""
    min_action_overlap: float = 1.0
    """Fraction of the current admissible actions the stored prior must cover for a hit (1.0 = all)."""
    index: str = "auto"
    """Nearest-neighbour backend: "auto" (numpy, then hnswlib when large), "numpy", "faiss" or "hnswlib"."""
    hit_window: int = 200
    """Lookups in the running hit rate h."""
    seed: int = 0
    """Seed of the refresh coin."""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Surrogate update rules for K, delta and r."""

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be a positive int, got capacity={self.capacity!r}; e.g. capacity=512")
        if not -1.0 <= self.delta <= 1.0:
            raise ValueError(f"delta must be a cosine similarity in [-1, 1], got delta={self.delta}; e.g. delta=0.95")
        if not 0.0 <= self.refresh_rate <= 1.0:
            raise ValueError(f"refresh_rate must be in [0, 1], got refresh_rate={self.refresh_rate}")
        if not 0.0 <= self.min_action_overlap <= 1.0:
            raise ValueError(f"min_action_overlap must be in [0, 1], got min_action_overlap={self.min_action_overlap}")
        if self.hit_window < 1:
            raise ValueError(f"hit_window must be >= 1, got hit_window={self.hit_window}")
        if isinstance(self.adaptive, dict):
            self.adaptive = AdaptiveConfig(**self.adaptive)


@dataclass
class PriorLookup:
    """The answer of :meth:`LLMPriorCache.lookup`."""

    prior: np.ndarray
    """p_prior(a|s) over the requested actions, in their order (sums to 1)."""
    hit: bool
    """True when the prior came from the cache (a refresh still counts as a hit)."""
    similarity: float
    """Cosine similarity to the nearest stored state (-inf when the cache was empty)."""
    llm_called: bool
    """True when the LLM was queried (a miss or a refresh)."""


@dataclass
class CacheCounters:
    """What the cache has done so far."""

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    refreshes: int = 0
    llm_queries: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits / lookups over the whole run."""
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass
class _Entry:
    embedding: np.ndarray
    prior: dict[str, float]


class LLMPriorCache:
    """Cache of LLM action priors keyed by state embeddings (module docstring).

    Args:
        dim: embedding size.
        config: knobs (:class:`PriorCacheConfig`).

    Example:
        >>> cache = LLMPriorCache(dim=2, config=PriorCacheConfig(delta=0.9, refresh_rate=0.0))
        >>> llm = lambda: np.array([0.7, 0.3])
        >>> cache.lookup(np.array([1.0, 0.0]), ["go", "stop"], llm).hit
        False
        >>> r = cache.lookup(np.array([0.99, 0.05]), ["go", "stop"], llm)
        >>> r.hit, r.prior.round(2).tolist()
        (True, [0.7, 0.3])
    """

    def __init__(self, dim: int, config: PriorCacheConfig | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int (the embedding size), got dim={dim!r}")
        self.config = config or PriorCacheConfig()
        self.dim = dim
        self.controller = AdaptiveController(self.config.capacity, self.config.delta, self.config.refresh_rate,
                                             self.config.adaptive)
        self.index = make_index(self.config.index, dim)
        self.counters = CacheCounters()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self._recent: deque[bool] = deque(maxlen=self.config.hit_window)
        self._rng = np.random.default_rng(self.config.seed)

    # ------------------------------------------------------------------ knobs
    @property
    def capacity(self) -> int:
        """K now."""
        return self.controller.capacity

    @property
    def delta(self) -> float:
        """delta now."""
        return self.controller.delta

    @property
    def refresh_rate(self) -> float:
        """r now."""
        return self.controller.refresh_rate

    @property
    def hit_rate(self) -> float:
        """h: the hit rate over the last ``hit_window`` lookups (0 before the first lookup)."""
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    @property
    def history(self) -> list[AdaptiveRecord]:
        """Trajectory of (K, delta, r) and the signals that moved them, one record per window."""
        return self.controller.history

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ signals from the learner
    def record_td_error(self, td: float) -> None:
        """Report a (mean) |TD error| of the learner using the posterior (raises delta when it climbs)."""
        self.controller.record_td_error(td)

    def record_policy_shift(self, tv: float) -> None:
        """Report a policy change (total variation between successive posteriors); refreshes follow it."""
        self.controller.record_policy_shift(tv)

    # ------------------------------------------------------------------ lookup
    def _normalise(self, embedding: np.ndarray) -> np.ndarray:
        e = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if e.shape[0] != self.dim:
            raise ValueError(f"embedding has {e.shape[0]} values, the cache was built with dim={self.dim}")
        n = float(np.linalg.norm(e))
        return e / n if n > 0 else e

    @staticmethod
    def _restrict(prior: dict[str, float], actions: Sequence[str]) -> np.ndarray:
        """The stored prior on ``actions``; actions it lacks get its smallest probability; renormalised."""
        fill = min(prior.values()) if prior else 1.0
        vals = np.array([prior.get(a, fill) for a in actions], dtype=np.float64)
        total = vals.sum()
        return vals / total if total > 0 else np.full(len(actions), 1.0 / len(actions))

    @staticmethod
    def _check_prior(p: Any, actions: Sequence[str]) -> np.ndarray:
        arr = np.asarray(p, dtype=np.float64).reshape(-1)
        if arr.shape[0] != len(actions) or not np.all(np.isfinite(arr)) or (arr < 0).any() or arr.sum() <= 0:
            raise ValueError(f"the LLM prior must be {len(actions)} non-negative finite numbers with a positive sum "
                             f"(one per action), got {arr.tolist()}")
        return arr / arr.sum()

    def lookup(self, embedding: np.ndarray, actions: Sequence[str], compute: Callable[[], Any]) -> PriorLookup:
        """p_prior(a|s) for the state with ``embedding`` over ``actions``; ``compute()`` queries the LLM and
        returns the prior over ``actions`` (called on a miss or a refresh only)."""
        actions = list(actions)
        if not actions:
            raise ValueError("actions is empty: the prior cache needs the admissible actions of the state")
        e = self._normalise(embedding)
        keys, sims = self.index.search(e, 1)
        sim = float(sims[0]) if len(keys) else float("-inf")
        hit = False
        if len(keys) and sim >= self.delta:
            entry = self._entries[int(keys[0])]
            overlap = sum(a in entry.prior for a in actions) / len(actions)
            hit = overlap >= self.config.min_action_overlap
        c = self.counters
        c.lookups += 1
        llm_called = False
        if hit:
            key = int(keys[0])
            entry = self._entries[key]
            self._entries.move_to_end(key)
            prior = self._restrict(entry.prior, actions)
            c.hits += 1
            if self.refresh_rate > 0 and self._rng.random() < self.refresh_rate:
                fresh = self._check_prior(compute(), actions)
                c.refreshes += 1
                c.llm_queries += 1
                llm_called = True
                self.controller.record_retrieval_error(total_variation(prior, fresh))
                entry.prior = dict(zip(actions, fresh.tolist(), strict=True))
                prior = fresh
        else:
            prior = self._check_prior(compute(), actions)
            c.misses += 1
            c.llm_queries += 1
            llm_called = True
            self._insert(e, dict(zip(actions, prior.tolist(), strict=True)))
        self._recent.append(hit)
        self.controller.record_lookup(hit, len(self._entries))
        self._evict()
        return PriorLookup(prior, hit, sim, llm_called)

    def _insert(self, e: np.ndarray, prior: dict[str, float]) -> None:
        key = self._next_key
        self._next_key += 1
        self.index.add(key, e)
        self._entries[key] = _Entry(e, prior)
        self._evict()

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            key, _ = self._entries.popitem(last=False)
            self.index.remove(key)
            self.counters.evictions += 1

    def stats(self) -> dict[str, float]:
        """Counters and knobs as a flat dict (for logs and the eval runner's ``stats``)."""
        c = self.counters
        return {"cache_lookups": c.lookups, "cache_hits": c.hits, "cache_misses": c.misses,
                "cache_refreshes": c.refreshes, "llm_queries": c.llm_queries, "cache_evictions": c.evictions,
                "cache_size": len(self), "cache_capacity": self.capacity, "cache_delta": self.delta,
                "cache_refresh_rate": self.refresh_rate, "cache_hit_rate": self.hit_rate}
