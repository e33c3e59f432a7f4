"""Online surrogate rules for the prior cache's capacity K, similarity threshold delta and refresh rate r.

Every ``interval`` lookups the controller looks at the window that just ended and moves each knob one step:

* **K (capacity)** grows by ``grow_factor`` (up to ``max_capacity``) when the window hit rate is below
  ``target_hit_rate`` while the cache is full (misses are being caused by evictions, not by novelty);
* **delta (threshold)** rises by ``delta_step`` (up to ``max_delta``) when retrievals look poor -- the total
  variation between a cached prior and the fresh LLM prior on a refresh exceeds ``retrieval_error_high``, or the
  window's mean |TD error| exceeds ``td_ratio_high`` times its long-run average -- and falls by ``delta_step``
  (down to ``min_delta``) when both are below their ``*_low`` marks;
* **r (refresh rate)** is multiplied by ``refresh_factor`` (up to ``max_refresh``) when the policy varies -- the
  mean reported policy shift (total variation between successive posteriors) exceeds ``policy_shift_high`` -- and
  divided by it (down to ``min_refresh``) when the shift is below ``policy_shift_low``.

Each update appends an :class:`AdaptiveRecord` to :attr:`AdaptiveController.history`, so the trajectories of
(K, delta, r) can be plotted next to the signals that moved them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["AdaptiveConfig", "AdaptiveRecord", "AdaptiveController"]


@dataclass
class AdaptiveConfig:
    """Surrogate update rules of :class:`AdaptiveController` (see the module docstring)."""

    enabled: bool = True
    """False keeps K, delta and r fixed (the history is still recorded)."""
    interval: int = 50
    """Lookups per update window."""
    target_hit_rate: float = 0.5
    """Grow K when the window hit rate is below this while the cache is full."""
    grow_factor: float = 1.5
    """K <- ceil(K * grow_factor)."""
    max_capacity: int = 100_000
    """Upper bound of K."""
    delta_step: float = 0.01
    """Step of delta per window."""
    min_delta: float = 0.5
    """Lower bound of delta."""
    max_delta: float = 0.999
    """Upper bound of delta."""
    retrieval_error_high: float = 0.3
    """Raise delta when the mean refresh total variation exceeds this."""
    retrieval_error_low: float = 0.1
    """Lower delta when the mean refresh total variation is below this (and TD errors are calm)."""
    td_ratio_high: float = 1.5
    """Raise delta when window mean |TD| > td_ratio_high * long-run mean |TD|."""
    td_ratio_low: float = 1.0
    """TD errors count as calm when window mean |TD| < td_ratio_low * long-run mean |TD|."""
    td_ema: float = 0.05
    """Weight of a new window in the long-run mean |TD| (an exponential moving average)."""
    refresh_factor: float = 1.5
    """r <- r * refresh_factor (or / refresh_factor)."""
    min_refresh: float = 0.005
    """Lower bound of r."""
    max_refresh: float = 0.5
    """Upper bound of r."""
    policy_shift_high: float = 0.2
    """Refresh more when the mean reported policy shift exceeds this."""
    policy_shift_low: float = 0.05
    """Refresh less when the mean reported policy shift is below this."""

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1, got interval={self.interval}")
        if self.grow_factor <= 1:
            raise ValueError(f"grow_factor must be > 1, got grow_factor={self.grow_factor}")
        if self.refresh_factor <= 1:
            raise ValueError(f"refresh_factor must be > 1, got refresh_factor={self.refresh_factor}")
        if not 0 <= self.min_delta <= self.max_delta <= 1:
            raise ValueError(f"need 0 <= min_delta <= max_delta <= 1, got min_delta={self.min_delta}, "
                             f"max_delta={self.max_delta}")
        if not 0 <= self.min_refresh <= self.max_refresh <= 1:
            raise ValueError(f"need 0 <= min_refresh <= max_refresh <= 1, got min_refresh={self.min_refresh}, "
                             f"max_refresh={self.max_refresh}")
        if not 0 < self.td_ema <= 1:
            raise ValueError(f"td_ema must be in (0, 1], got td_ema={self.td_ema}")


@dataclass
class AdaptiveRecord:
    """One update of the controller: the knobs after the update and the window's signals."""

    lookups: int
    capacity: int
    delta: float
    refresh_rate: float
    hit_rate: float
    retrieval_error: float | None
    td_error: float | None
    policy_shift: float | None

    def as_dict(self) -> dict:
        return asdict(self)


class AdaptiveController:
    """Holds (K, delta, r) and moves them once per window of lookups (module docstring)."""

    def __init__(self, capacity: int, delta: float, refresh_rate: float, config: AdaptiveConfig | None = None):
        self.config = config or AdaptiveConfig()
        self.capacity = int(capacity)
        self.delta = float(delta)
        self.refresh_rate = float(refresh_rate)
        self.history: list[AdaptiveRecord] = []
        self._lookups = 0
        self._hits = 0
        self._retrieval: list[float] = []
        self._td: list[float] = []
        self._shift: list[float] = []
        self._td_long: float | None = None

    # --------------------------------------------------------------------- signals
    def record_lookup(self, hit: bool, size: int) -> bool:
        """Count one lookup; returns True when it closed a window (the knobs were updated)."""
        self._lookups += 1
        self._hits += int(hit)
        if self._lookups % self.config.interval == 0:
            self._update(size)
            return True
        return False

    def record_retrieval_error(self, tv: float) -> None:
        """Total variation between a cached prior and the fresh LLM prior of the same state (on a refresh)."""
        self._retrieval.append(float(tv))

    def record_td_error(self, td: float) -> None:
        """A (mean) absolute TD error of the learner that uses the posterior."""
        self._td.append(abs(float(td)))

    def record_policy_shift(self, tv: float) -> None:
        """Total variation between successive policies/posteriors at the same state."""
        self._shift.append(float(tv))

    # --------------------------------------------------------------------- rules
    def _update(self, size: int) -> None:
        c = self.config
        hit_rate = self._hits / c.interval
        retrieval = sum(self._retrieval) / len(self._retrieval) if self._retrieval else None
        td = sum(self._td) / len(self._td) if self._td else None
        shift = sum(self._shift) / len(self._shift) if self._shift else None
        if c.enabled:
            if hit_rate < c.target_hit_rate and size >= self.capacity:
                self.capacity = min(c.max_capacity, max(self.capacity + 1, math.ceil(self.capacity * c.grow_factor)))
            td_high = td_calm = False
            if td is not None:
                if self._td_long is not None and self._td_long > 0:
                    td_high = td > c.td_ratio_high * self._td_long
                    td_calm = td < c.td_ratio_low * self._td_long
                else:
                    td_calm = True
            else:
                td_calm = True
            ret_high = retrieval is not None and retrieval > c.retrieval_error_high
            ret_low = retrieval is None or retrieval < c.retrieval_error_low
            if ret_high or td_high:
                self.delta = min(c.max_delta, self.delta + c.delta_step)
            elif ret_low and td_calm and retrieval is not None:
                # lower delta only on evidence (refreshes that agreed), never on silence
                self.delta = max(c.min_delta, self.delta - c.delta_step)
            if shift is not None:
                if shift > c.policy_shift_high:
                    self.refresh_rate = min(c.max_refresh, self.refresh_rate * c.refresh_factor)
                elif shift < c.policy_shift_low:
                    self.refresh_rate = max(c.min_refresh, self.refresh_rate / c.refresh_factor)
        if td is not None:
            self._td_long = td if self._td_long is None else (1 - c.td_ema) * self._td_long + c.td_ema * td
        self.history.append(AdaptiveRecord(self._lookups, self.capacity, self.delta, self.refresh_rate, hit_rate,
                                           retrieval, td, shift))
        self._hits = 0
        self._retrieval, self._td, self._shift = [], [], []
