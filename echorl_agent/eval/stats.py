"""Paired statistics for side-by-side tables: agents that played the same task instances are compared instance by
instance, which is far more sensitive than comparing two independent success rates.

* :func:`paired_bootstrap` -- 95% percentile-bootstrap CI of the mean paired difference (instances resampled with
  a fixed seed, so the same rows always give the same interval).
* :func:`ratio_bootstrap` -- 95% percentile-bootstrap CI of a pooled ratio sum(num) / sum(den) over paired units
  (e.g. seeds: LLM queries without ÷ with a cache), resampling the units jointly.
* :func:`mcnemar_exact` -- McNemar's exact test for paired binary outcomes (two-sided binomial test on the
  discordant pairs; McNemar 1947, the exact form of Fagerland et al. 2013).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["paired_bootstrap", "ratio_bootstrap", "mcnemar_exact", "BOOTSTRAP_SEED", "BOOTSTRAP_RESAMPLES"]

#: Fixed seed and size of the paired bootstrap (results must not change between two runs of the same command).
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 10_000


def paired_bootstrap(diffs: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                     level: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-instance differences and its percentile-bootstrap CI.

    Args:
        diffs: one difference per task instance (e.g. success of agent − success of the reference).
        resamples: bootstrap resamples.
        seed: RNG seed of the resampling.
        level: confidence level.

    Returns:
        (mean, low, high); (nan, nan, nan) for no instance.
    """
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        return math.nan, math.nan, math.nan
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got level={level!r}")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(d.mean()), float(lo), float(hi)


def ratio_bootstrap(num: Sequence[float], den: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float, float]:
    """Pooled ratio ``sum(num) / sum(den)`` and its percentile-bootstrap CI, resampling units (seeds) jointly.

    Pooling sums rather than averaging per-unit ratios keeps one unit with a tiny denominator from dominating.

    Args:
        num: one numerator per unit (e.g. LLM queries of the uncached agent on one seed).
        den: the same units' denominators (e.g. queries of the cached agent on that seed); must pair with ``num``.
        resamples: bootstrap resamples.
        seed: RNG seed of the resampling.
        level: confidence level.

    Returns:
        (ratio, low, high); (nan, nan, nan) for no unit.
    """
    n, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if n.shape != d.shape:
        raise ValueError(f"num and den must pair up, got len(num)={n.size}, len(den)={d.size}")
    if n.size == 0:
        return math.nan, math.nan, math.nan
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got level={level!r}")
    if d.sum() <= 0:
        raise ValueError(f"den must have a positive sum, got sum(den)={d.sum()}")
    idx = np.random.default_rng(seed).integers(0, n.size, size=(resamples, n.size))
    sums = d[idx].sum(axis=1)
    ratios = n[idx].sum(axis=1)[sums > 0] / sums[sums > 0]
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(n.sum() / d.sum()), float(lo), float(hi)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired successes ``a[i]`` vs ``b[i]`` (1.0 with no discordant pair).

    Only discordant pairs carry information: with n01 = #(a fails, b succeeds) and n10 = #(a succeeds, b fails),
    under the null each discordant pair goes either way with probability 1/2, so
    p = min(1, 2 · P[Binomial(n01 + n10, 1/2) <= min(n01, n10)]).
    """
    if len(a) != len(b):
        raise ValueError(f"a and b must pair up, got len(a)={len(a)}, len(b)={len(b)}")
    n10 = sum(bool(x) and not bool(y) for x, y in zip(a, b, strict=True))
    n01 = sum(bool(y) and not bool(x) for x, y in zip(a, b, strict=True))
    n = n10 + n01
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(n10, n01) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)
