"""Dataclass configs of the EchoRL agent (one validated dataclass per component)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["PlanningConfig", "TRAJECTORY_ENCODERS"]

#: Trajectory-encoder types accepted by :class:`PlanningConfig`.
TRAJECTORY_ENCODERS = ("mlp", "gru", "transformer")


def _positive_int(name: str, value: Any, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}; e.g. {name}={example}")


@dataclass
class PlanningConfig:
    """Latent planning of ``EchoPolicy`` / ``EchoPPO`` (EchoRL Eq. 1-3, Algorithm 2).

    A trajectory encoder ``F_phi`` maps the window ``s_{t-k:t}`` to a Gaussian ``N(mu, sigma^2)`` over the
    plan ``tau_t`` in ``R^d`` (Eq. 1); the policy conditions on ``tau_t`` (Eq. 2); ``EchoPPO`` adds
    ``kl_coef * KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})]`` to the PPO loss (Eq. 3).
    Pass it (or its fields) through ``policy_kwargs``: ``policy_kwargs={"planning": PlanningConfig(window=4)}``
    or ``policy_kwargs={"window": 4, "latent_dim": 16}``.
    """

    window: int | None = None
    """k: the plan sees the k + 1 most recent observations; None takes k from the env's history window
    (``make_sb3_env(..., history=k)``), which must match when k is given."""
    latent_dim: int = 16
    """d: size of the plan vector tau."""
    encoder: str = "mlp"
    """Trajectory encoder F_phi: "mlp" (flattened window), "gru" (over frames) or "transformer"."""
    encoder_arch: list[int] = field(default_factory=lambda: [256, 128])
    """Hidden sizes of the MLP encoder (the EchoRL appendix uses [512, 256, 128]); the GRU/transformer width is
    ``encoder_arch[0]``."""
    dropout: float = 0.0
    """Dropout in the encoder. Keep 0 for PPO: SB3 collects rollouts in eval mode and trains in train mode, so
    dropout makes the old and new log-probabilities of the PPO ratio disagree."""
    kl_coef: float = 0.01
    """lambda_KL: weight of the plan-consistency KL in the EchoPPO loss (0 turns it off)."""
    log_std_bounds: tuple[float, float] = (-5.0, 2.0)
    """Clamp of log sigma, keeping the Gaussian KL finite."""
    num_heads: int = 2
    """Attention heads of the transformer encoder."""

    def __post_init__(self) -> None:
        _positive_int("latent_dim", self.latent_dim, "16")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0):
            raise ValueError(f"window must be an int >= 0, got window={self.window!r}; e.g. window=4")
        if self.encoder not in TRAJECTORY_ENCODERS:
            hint = difflib.get_close_matches(str(self.encoder), TRAJECTORY_ENCODERS, n=1)
            raise ValueError(
                f"encoder must be one of {list(TRAJECTORY_ENCODERS)}, got encoder={self.encoder!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        arch = list(self.encoder_arch)
        if not arch or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in arch):
            raise ValueError(f"encoder_arch must be a non-empty list of positive ints, got encoder_arch={self.encoder_arch!r}")
        self.encoder_arch = arch
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got dropout={self.dropout!r}")
        if float(self.kl_coef) < 0.0:
            raise ValueError(f"kl_coef must be >= 0, got kl_coef={self.kl_coef!r}; use 0 to disable the KL term")
        lo, hi = self.log_std_bounds
        if not lo < hi:
            raise ValueError(f"log_std_bounds must be (low, high) with low < high, got log_std_bounds={self.log_std_bounds!r}")
        _positive_int("num_heads", self.num_heads, "2")
        if self.encoder == "transformer" and arch[0] % self.num_heads:
            raise ValueError(
                f"encoder_arch[0] must be divisible by num_heads for the transformer encoder, got "
                f"encoder_arch[0]={arch[0]}, num_heads={self.num_heads}"
            )

    @classmethod
    def from_kwargs(cls, planning: PlanningConfig | dict[str, Any] | None = None, **overrides: Any) -> PlanningConfig:
        """Merge a config (or dict) with field overrides; an unknown field raises ``ValueError`` with a hint."""
        base: dict[str, Any] = {}
        if isinstance(planning, PlanningConfig):
            base = {f.name: getattr(planning, f.name) for f in fields(cls)}
        elif isinstance(planning, dict):
            base = dict(planning)
        elif planning is not None:
            raise ValueError(f"planning must be a PlanningConfig or a dict, got planning={planning!r}")
        base.update(overrides)
        names = [f.name for f in fields(cls)]
        for key in base:
            if key not in names:
                hint = difflib.get_close_matches(key, names, n=1)
                raise ValueError(
                    f"unknown planning option {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + f" (PlanningConfig fields: {names})"
                )
        return cls(**base)
