"""Typed batch of the hot/cold replay: SB3's ``ReplayBufferSamples`` plus ``weights`` and ``indices``."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from stable_baselines3.common.type_aliases import ReplayBufferSamples

__all__ = ["HotColdReplayBufferSamples"]

_BASE_FIELDS = ReplayBufferSamples._fields  # observations, actions, next_observations, dones, rewards, discounts


class HotColdReplayBufferSamples(ReplayBufferSamples):
    """``ReplayBufferSamples`` (an ``isinstance`` of it, so SB3 algorithms consume it unchanged) with two more fields.

    Attributes:
        weights: ``[B, 1]`` float32 importance-sampling weights ``(N P(t))^(-beta_is)``, normalised so the batch
            maximum is 1 (Schaul et al. 2016, Algorithm 1 line 10).
        indices: ``[B]`` int64 buffer slots, to pass back to ``HotColdReplayBuffer.update_priorities``.

    SB3's NamedTuple cannot be extended by subclassing annotations, so this class re-declares the tuple layout:
    the six SB3 fields keep their positions (and SB3's accessors), ``weights`` and ``indices`` are items 6 and 7.
    """

    __slots__ = ()
    _fields = (*_BASE_FIELDS, "weights", "indices")
    _field_defaults = {"discounts": None, "weights": None, "indices": None}

    def __new__(
        cls,
        observations: torch.Tensor,
        actions: torch.Tensor,
        next_observations: torch.Tensor,
        dones: torch.Tensor,
        rewards: torch.Tensor,
        discounts: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
    ) -> HotColdReplayBufferSamples:
        return tuple.__new__(cls, (observations, actions, next_observations, dones, rewards, discounts, weights, indices))

    weights = property(operator.itemgetter(6), doc="[B, 1] importance-sampling weights (batch max = 1).")
    indices = property(operator.itemgetter(7), doc="[B] int64 buffer slots of the sampled transitions.")

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> HotColdReplayBufferSamples:
        values = tuple(iterable)
        if len(values) != len(cls._fields):
            raise TypeError(f"expected {len(cls._fields)} arguments, got {len(values)}")
        return tuple.__new__(cls, values)

    def _replace(self, **kwargs: Any) -> HotColdReplayBufferSamples:
        unknown = set(kwargs) - set(self._fields)
        if unknown:
            raise ValueError(f"got unexpected field names: {sorted(unknown)!r}")
        return self._make(kwargs.get(name, value) for name, value in zip(self._fields, self, strict=True))

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({inner})"
