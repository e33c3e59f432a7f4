"""The statistics of echorl's tables and benchmarks, in one place.

Agents that played the same task instances are compared instance by instance, which is far more sensitive than
comparing two independent success rates:

* :func:`paired_bootstrap` -- 95% percentile-bootstrap CI of the mean paired difference (instances resampled with
  a fixed seed, so the same rows always give the same interval).
* :func:`ratio_bootstrap` -- 95% percentile-bootstrap CI of a pooled ratio sum(num) / sum(den) over paired units
  (e.g. seeds: LLM queries without ÷ with a cache), resampling the units jointly.
* :func:`mcnemar_exact` -- McNemar's exact test for paired binary outcomes (two-sided binomial test on the
  discordant pairs; McNemar 1947, the exact form of Fagerland et al. 2013).

And for one rate, and for the seed studies of ``benchmarks/`` (resumable JSON-lines files, one line per run):

* :func:`wilson_interval` / :func:`success_text` -- Wilson score interval of a success rate, and its table cell;
* :func:`bootstrap_text` -- a mean and its bootstrap CI over seeds as a table cell;
* :func:`read_jsonl` -- the records a seed study wrote so far (none when the file does not exist yet).

>>> success_text(7, 10, counts=True)
'0.70 [0.40, 0.89] (7/10)'
>>> bootstrap_text([0.1, 0.3, 0.2], signed=True)
'+0.200 [+0.100, +0.300]'
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["paired_bootstrap", "ratio_bootstrap", "mcnemar_exact", "wilson_interval", "success_text",
           "bootstrap_text", "read_jsonl", "BOOTSTRAP_SEED", "BOOTSTRAP_RESAMPLES"]

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


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when ``n == 0``.

    Better than the normal approximation at the small n and extreme rates typical of agent benchmarks.
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def success_text(wins: int, n: int, counts: bool = False, digits: int = 2) -> str:
    """``"rate [low, high]"`` with the Wilson 95% interval; ``counts`` appends ``" (wins/n)"``."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got n={n}")
    lo, hi = wilson_interval(wins, n)
    return f"{wins / n:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" + (f" ({wins}/{n})" if counts else "")


def bootstrap_text(values: Sequence[float], signed: bool = False, digits: int = 3) -> str:
    """``"mean [low, high]"`` of :func:`paired_bootstrap` over ``values`` (e.g. one value per seed); ``signed``
    prints a sign on every number (for differences)."""
    m, lo, hi = paired_bootstrap(values)
    f = f"{'+' if signed else ''}.{digits}f"
    return f"{m:{f}} [{lo:{f}}, {hi:{f}}]"


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file, one per non-empty line; [] when the file does not exist (yet)."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
