"""Hyperparameters of the PPO learner (:class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO`; SB3's meanings)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PPOConfig"]

_BOUNDS = {"clip_range": ("> 0", lambda v: v > 0), "target_kl": ("> 0 or None", lambda v: v > 0),
           "gae_lambda": ("in [0, 1]", lambda v: 0 <= v <= 1), "vf_coef": (">= 0", lambda v: v >= 0),
           "max_grad_norm": ("> 0", lambda v: v > 0)}


def _bad(name: str, v: Any) -> str | None:
    """The bound ``v`` breaks (None: a valid value of option ``name``)."""
    bound, ok = _BOUNDS[name]
    if name == "target_kl" and v is None:
        return None
    if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and ok(v):
        return None
    return bound


@dataclass
class PPOConfig:
    """PPO for the LM policy; the run gives ``n_steps``, ``batch_size``, ``n_epochs``, ``ent_coef``, ``gamma``,
    the rest are the learner's options (``ppo_kwargs``, ``--clip-range`` ...)."""

    n_steps: int = 64
    """Rollout length per env and update."""
    batch_size: int = 16
    """Minibatch; must divide ``n_steps * n_envs`` (advantages are normalised per minibatch, so >= 2)."""
    n_epochs: int = 2
    """Passes over each rollout."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    gamma: float = 0.99
    """Discount."""
    clip_range: float = 0.2
    """PPO's clip on the probability ratio."""
    target_kl: float | None = None
    """End an update's epochs at the first minibatch whose approximate KL to the rollout policy exceeds
    1.5 x this; None: never."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 0.5
    """Gradient clipping norm."""

    def __post_init__(self) -> None:
        for name in ("n_steps", "batch_size", "n_epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got gamma={self.gamma!r}")
        for name in _BOUNDS:
            bound = _bad(name, getattr(self, name))
            if bound is not None:
                raise ValueError(f"{name} must be a number {bound}, got {name}={getattr(self, name)!r}")

    @staticmethod
    def check_options(kwargs: dict[str, Any]) -> None:
        """Check the values of ``ppo_kwargs`` (the error names the option and its value)."""
        for name, v in kwargs.items():
            bound = _bad(name, v)
            if bound is not None:
                raise ValueError(f"ppo_kwargs[{name!r}] must be a number {bound}, got {name}={v!r}")

    @classmethod
    def from_run(cls, run: Any) -> PPOConfig:
        """The PPO hyperparameters of an :class:`~echorl_agent.llm_rl.train.LLMTrainConfig` (``gamma`` None: 0.99;
        ``ppo_kwargs`` unset: SB3's defaults)."""
        return cls(n_steps=run.n_steps, batch_size=run.batch_size, n_epochs=run.n_epochs, ent_coef=run.ent_coef,
                   gamma=0.99 if run.gamma is None else run.gamma, **run.ppo_kwargs)

    def sb3_kwargs(self) -> dict[str, Any]:
        """The ``PPO(...)`` arguments (SB3's names)."""
        return dataclasses.asdict(self)
