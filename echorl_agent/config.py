"""Dataclass configs of the EchoRL agent (one validated dataclass per component)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["PlanningConfig", "TRAJECTORY_ENCODERS", "ReplayConfig", "PLAN_SOURCES"]

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
        return _merge_config(cls, planning, "planning", overrides)


#: Where :class:`ReplayConfig` takes the plan tau_t of a transition from.
PLAN_SOURCES = ("auto", "info", "policy", "observation", "td_error", "none")


@dataclass
class ReplayConfig:
    """Hot/cold prioritized replay of ``HotColdReplayBuffer`` (EchoRL Eq. 6-7, Algorithm 3).

    Sampling is ``P(t) = softmax(beta * score(t))`` over hot and cold transitions with
    ``score(t) = ||tau_t - tau_bar||^2 + alpha * |r_t| + td_weight * log(|delta_t| + td_eps)`` (tau_bar: EMA of
    plans; docs/equations.md).
    Pass it as ``replay_buffer_kwargs={"config": ReplayConfig(...)}`` or pass its fields directly.
    """

    cold_size: int = 0
    """Capacity of the cold tier in transitions, stored in numpy memmaps (the paper: 10**7); 0 disables it."""
    cold_dir: str | None = None
    """Folder for the cold memmaps; None uses a private temporary folder deleted at ``close()``."""
    age_threshold: int | None = None
    """Transitions older than this many ``add()`` calls move hot -> cold; None: the hot capacity minus one."""
    beta: float = 1.0
    """Inverse temperature of the sampling softmax (0: uniform)."""
    alpha: float = 0.1
    """Weight of the reward magnitude |r_t| in the score."""
    td_weight: float = 0.0
    """Weight kappa of the TD term ``kappa * log(|delta_t| + td_eps)`` of the score (``update_priorities`` sets
    |delta_t|; new transitions start at the largest seen). Without a plan term this is exactly proportional
    prioritized replay, ``P ~ (|delta| + eps)^(beta * kappa)`` (Schaul et al. 2016, alpha = beta * kappa)."""
    td_eps: float = 1e-3
    """eps of the TD term (keeps log finite and every transition sampleable)."""
    plan_source: str = "auto"
    """tau_t: "info" (``infos[i][plan_key]``), "policy" (``buffer.plan_fn(obs)``), "observation" (a fixed random
    projection of the flattened observation), "td_error" (|TD error|, d = 1), "none" (no plan term) or "auto"
    (info, then policy, then ``plan_fallback``, decided at the first ``add``)."""
    plan_fallback: str = "td_error"
    """What "auto" uses when neither info plans nor ``plan_fn`` exist: "td_error", "observation" or "none"."""
    plan_key: str = "plan"
    """Info key holding the plan for ``plan_source="info"``."""
    plan_dim: int = 16
    """d for the "observation" projection (observations with fewer features are used as they are)."""
    ema_decay: float = 0.01
    """Rate of the EMA of plans tau_bar (one step per ``add``)."""
    beta_is: float = 0.4
    """Initial importance-sampling exponent (Schaul et al. 2016)."""
    beta_is_final: float = 1.0
    """Importance-sampling exponent reached after ``beta_is_anneal_samples`` calls to ``sample``."""
    beta_is_anneal_samples: int = 100_000
    """Number of ``sample`` calls over which beta_is is annealed linearly to ``beta_is_final``."""
    hot_fraction: float | None = None
    """Optional mixing ratio: the share of each batch drawn from the hot tier (None: one softmax over both)."""
    min_acceptance: float = 0.02
    """Exact sampling re-anchors the sum tree after a draw whose measured rejection-sampling acceptance fell below
    this (see ``HotColdReplayBuffer``); lower values re-anchor less often and reject more. Exactness never depends
    on it."""
    rejection_budget: float = 0.5
    """... and once the candidates rejected since the last re-anchor exceed ``rejection_budget * N`` (N: stored
    transitions; measured here, a re-anchor costs about as much as N/2 rejected candidates)."""
    seed: int | None = None
    """Seed of the sampling generator (None: fresh entropy)."""

    def __post_init__(self) -> None:
        if isinstance(self.cold_size, bool) or not isinstance(self.cold_size, int) or self.cold_size < 0:
            raise ValueError(f"cold_size must be an int >= 0, got cold_size={self.cold_size!r}; e.g. cold_size=10**7")
        if self.age_threshold is not None and (not isinstance(self.age_threshold, int) or self.age_threshold < 0):
            raise ValueError(f"age_threshold must be None or an int >= 0, got age_threshold={self.age_threshold!r}")
        for name in ("beta", "alpha", "td_weight"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {name}={getattr(self, name)!r}")
        if self.plan_source not in PLAN_SOURCES:
            hint = difflib.get_close_matches(str(self.plan_source), PLAN_SOURCES, n=1)
            raise ValueError(
                f"plan_source must be one of {list(PLAN_SOURCES)}, got plan_source={self.plan_source!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        if self.plan_fallback not in ("td_error", "observation", "none"):
            raise ValueError(
                f"plan_fallback must be 'td_error', 'observation' or 'none', got plan_fallback={self.plan_fallback!r}"
            )
        if float(self.td_eps) <= 0.0:
            raise ValueError(f"td_eps must be > 0 (log(|delta| + td_eps) must be finite), got td_eps={self.td_eps!r}")
        _positive_int("plan_dim", self.plan_dim, "16")
        if not 0.0 < float(self.ema_decay) <= 1.0:
            raise ValueError(f"ema_decay must be in (0, 1], got ema_decay={self.ema_decay!r}; e.g. ema_decay=0.01")
        for name in ("beta_is", "beta_is_final"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {name}={getattr(self, name)!r}")
        _positive_int("beta_is_anneal_samples", self.beta_is_anneal_samples, "100_000")
        if self.hot_fraction is not None and not 0.0 <= float(self.hot_fraction) <= 1.0:
            raise ValueError(f"hot_fraction must be None or in [0, 1], got hot_fraction={self.hot_fraction!r}")
        if not 0.0 < float(self.min_acceptance) < 1.0:
            raise ValueError(f"min_acceptance must be in (0, 1), got min_acceptance={self.min_acceptance!r}; e.g. 0.02")
        if float(self.rejection_budget) <= 0.0:
            raise ValueError(
                f"rejection_budget must be > 0, got rejection_budget={self.rejection_budget!r}; e.g. 0.5"
            )

    @classmethod
    def from_kwargs(cls, config: ReplayConfig | dict[str, Any] | None = None, **overrides: Any) -> ReplayConfig:
        """Merge a config (or dict) with field overrides; an unknown field raises ``ValueError`` with a hint."""
        return _merge_config(cls, config, "replay", overrides)


def _merge_config(cls: type, config: Any, what: str, overrides: dict[str, Any]) -> Any:
    """``cls(**(config's fields | overrides))`` for a dataclass config; unknown fields raise with a close match."""
    arg = "planning" if what == "planning" else "config"
    base: dict[str, Any] = {}
    if isinstance(config, cls):
        base = {f.name: getattr(config, f.name) for f in fields(cls)}
    elif isinstance(config, dict):
        base = dict(config)
    elif config is not None:
        raise ValueError(f"{arg} must be a {cls.__name__} or a dict, got {arg}={config!r}")
    base.update(overrides)
    names = [f.name for f in fields(cls)]
    for key in base:
        if key not in names:
            hint = difflib.get_close_matches(key, names, n=1)
            raise ValueError(
                f"unknown {what} option {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                + f" ({cls.__name__} fields: {names})"
            )
    return cls(**base)
