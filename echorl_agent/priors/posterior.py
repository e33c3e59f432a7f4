"""Posterior sampling over actions: an LLM prior tilted by Q-values at a hit-rate-dependent temperature.

    pi(a | s) = p_prior(a | s) * exp(Q(s, a) / tau(h)) / Z(s),        tau(h) = tau0 * exp(-kappa * h)

with ``tau0 = 0.8`` and ``kappa = 2`` (the design document's values) and ``h`` the running hit rate of the prior
cache. While the cache misses (h ~ 0) the temperature is high and the LLM prior dominates; as the cache warms up
(h -> 1) tau falls to ``0.8 e^-2 ~ 0.108`` and the learned Q-values dominate. Actions with zero prior mass
(inadmissible) get zero posterior mass. Computed in log space (``log p + Q / tau - logsumexp``) so large Q / tau
does not overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PosteriorSampler"]


@dataclass
class PosteriorSampler:
    """pi(a|s) ∝ p_prior(a|s) · exp(Q(s,a) / tau(h)), tau(h) = tau0 · exp(-kappa · h) (module docstring).

    Args:
        tau0: temperature at h = 0.
        kappa: decay rate of the temperature with the hit rate.
        min_tau: floor on tau (keeps the division finite for extreme settings).

    Example:
        >>> s = PosteriorSampler()
        >>> round(s.temperature(0.0), 3), round(s.temperature(1.0), 4)
        (0.8, 0.1083)
        >>> s.probs([0.5, 0.5], [0.0, 0.0], 0.3).tolist()  # equal Q: the prior
        [0.5, 0.5]
    """

    tau0: float = 0.8
    kappa: float = 2.0
    min_tau: float = 1e-6

    def __post_init__(self) -> None:
        if self.tau0 <= 0:
            raise ValueError(f"tau0 must be > 0, got tau0={self.tau0}; the design uses tau0=0.8")
        if self.kappa < 0:
            raise ValueError(f"kappa must be >= 0, got kappa={self.kappa}; the design uses kappa=2")
        if self.min_tau <= 0:
            raise ValueError(f"min_tau must be > 0, got min_tau={self.min_tau}")

    def temperature(self, hit_rate: float) -> float:
        """tau(h) = tau0 · exp(-kappa · h)."""
        if not 0.0 <= hit_rate <= 1.0:
            raise ValueError(f"hit_rate must be in [0, 1], got hit_rate={hit_rate}")
        return max(self.min_tau, self.tau0 * float(np.exp(-self.kappa * hit_rate)))

    def log_probs(self, prior: np.ndarray, q: np.ndarray, hit_rate: float) -> np.ndarray:
        """log pi over the last axis (``prior`` and ``q`` broadcast: ``[..., A]``); -inf where the prior is 0."""
        prior = np.asarray(prior, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        if prior.shape[-1] != q.shape[-1]:
            raise ValueError(f"prior and q must cover the same actions, got {prior.shape[-1]} and {q.shape[-1]}")
        if (prior < 0).any() or not np.all(np.isfinite(prior)):
            raise ValueError("prior must be non-negative and finite")
        if not (prior.sum(-1) > 0).all():
            raise ValueError("every prior row needs positive mass on at least one action")
        with np.errstate(divide="ignore"):
            logits = np.log(prior) + q / self.temperature(hit_rate)
        m = logits.max(-1, keepdims=True)
        return logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))

    def probs(self, prior: np.ndarray, q: np.ndarray, hit_rate: float) -> np.ndarray:
        """pi over the last axis."""
        return np.exp(self.log_probs(prior, q, hit_rate))

    def sample(self, prior: np.ndarray, q: np.ndarray, hit_rate: float, rng: np.random.Generator) -> np.ndarray:
        """One action index per row of ``[..., A]`` inputs (shape ``[...]``), by inverse-CDF sampling."""
        p = self.probs(prior, q, hit_rate)
        flat = p.reshape(-1, p.shape[-1])
        u = rng.random(flat.shape[0])[:, None]
        idx = (np.cumsum(flat, -1) < u).sum(-1)
        idx = np.minimum(idx, flat.shape[-1] - 1)
        # never land on a zero-mass action through round-off at the end of the CDF
        bad = flat[np.arange(len(idx)), idx] == 0
        if bad.any():
            idx[bad] = flat[bad].argmax(-1)
        return idx.reshape(p.shape[:-1])
