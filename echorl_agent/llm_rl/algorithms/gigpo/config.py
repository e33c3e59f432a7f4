"""Hyperparameters of GiGPO (:class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer`), and how a
``train-llm`` run's config maps onto them (:func:`gigpo_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import echorl_envs
from echorl_agent.llm_rl.algorithms.echorl.config import PLAN_DEFAULTS
from echorl_agent.llm_rl.config import LLMPolicyConfig

__all__ = ["GiGPOConfig", "gigpo_config"]


@dataclass
class GiGPOConfig:
    """Hyperparameters of :class:`GiGPOTrainer` (the LM part is an :class:`LLMPolicyConfig`)."""

    env_id: str = "EchoRL/BabyAI-GoToLocal-v0"
    """A choice env (``info["admissible_actions"]`` non-empty)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` arguments of the env."""
    group_size: int = 4
    """K: episodes per group, all from one seed."""
    groups: int = 2
    """Groups (distinct seeds) per iteration; ``groups * group_size`` envs step together."""
    step_advantage_weight: float = 1.0
    """omega: weight of the anchor-state step advantage (0 = GRPO over episodes)."""
    gamma: float = 0.95
    """Discount of the step-level returns."""
    normalize: str = "std"
    """"std" (divide by the group's std, GRPO) or "mean" (centre only)."""
    sample_weighting: str = "sample"
    """How the steps' loss terms are weighted: "sample" (each step 1) or "episode" (each episode the same total
    weight, ``N / (E * len(episode))``; see :func:`~echorl_agent.llm_rl.advantage.episode_sample_weights`)."""
    center_advantages: bool | str = False
    """True: subtract the loss-weighted mean advantage of the iteration's steps from every step's advantage, so the
    update pushes sampled actions up and down with equal weight (every step is then learned from, including the steps
    of groups without reward variance, which get a constant -mean). "signal": the same over the steps whose advantage
    is non-zero only; steps without signal stay at 0 (and are not learned from)."""
    positive_advantages: bool = False
    """True: after any centring, steps whose advantage is <= 0 are dropped and only the better-than-their-group
    actions are pushed up (advantage-weighted imitation of the group's better episodes, as rejection-sampling
    fine-tuning; no gradient pushes a sampled action down)."""
    history: int = 2
    """History window k of the prompts."""
    max_episode_steps: int | None = None
    """Per-episode step cap (None: the env's own limit)."""
    learning_rate: float = 1e-4
    """Adam's learning rate."""
    clip_range: float = 0.2
    """PPO-style clip on the ratio pi / pi_old of every step's action."""
    epochs: int = 1
    """Passes over an iteration's samples."""
    minibatch_size: int | None = None
    """Samples per optimizer step (None: one step per iteration over all samples)."""
    micro_batch: int = 16
    """Samples per learner forward (memory, not maths: gradients accumulate over a minibatch)."""
    ent_coef: float = 0.0
    """Entropy bonus over the admissible actions."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    seed: int = 0
    """Seeds the group seeds, the action samples and the minibatch orders."""
    kl_coef: float = 0.0
    """lambda_KL of the KL between consecutive plans (with ``lm.plan_tokens > 0``; EchoRL's plan term)."""
    ref_kl_coef: float = 0.0
    """beta of KL(pi || pi_ref) over the admissible actions of every visited state, pi_ref = the policy when RL
    started (after any BC warm start); 0: off. With it on, every step of an iteration is learned from, including
    steps whose advantage is 0 (they still carry the KL term)."""
    target_kl: float | None = None
    """Stop an iteration's update once a minibatch's exact KL(pi_old || pi) over the admissible actions exceeds
    1.5 x this (SB3's ``target_kl``); None: never."""
    replay: dict[str, Any] | None = None
    """Hot/cold prioritized replay of LLM transitions (:class:`~echorl_agent.replay.llm.LLMReplayBuffer` keyword
    arguments, e.g. ``{"capacity": 4096, "replay_memory_mb": 1024}``); None: no replay."""
    replay_ratio: float = 1.0
    """Replayed samples mixed into each update per fresh sample."""
    lm: LLMPolicyConfig = field(default_factory=LLMPolicyConfig)
    """The LLM policy (a dict of its fields is accepted)."""

    def __post_init__(self) -> None:
        from echorl_agent.llm_rl.advantage import center_advantages, episode_sample_weights

        for name in ("group_size", "groups", "epochs", "micro_batch", "history"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "history" else 1):
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (advantages compare the episodes of a group), "
                             f"got group_size={self.group_size}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got gamma={self.gamma!r}")
        if self.step_advantage_weight < 0:
            raise ValueError(f"step_advantage_weight must be >= 0, got step_advantage_weight={self.step_advantage_weight!r}")
        if self.normalize not in ("std", "mean"):
            raise ValueError(f"normalize must be 'std' or 'mean', got normalize={self.normalize!r}")
        episode_sample_weights([], self.sample_weighting)  # ValueError naming sample_weighting
        center_advantages([], [], self.center_advantages)  # ValueError naming center_advantages
        if not isinstance(self.positive_advantages, bool):
            raise ValueError(f"positive_advantages must be True or False, got positive_advantages={self.positive_advantages!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got learning_rate={self.learning_rate!r}")
        if isinstance(self.lm, dict):
            self.lm = LLMPolicyConfig.from_kwargs(**self.lm)
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got kl_coef={self.kl_coef!r}")
        if not self.ref_kl_coef >= 0:
            raise ValueError(f"ref_kl_coef must be >= 0, got ref_kl_coef={self.ref_kl_coef!r}")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"target_kl must be > 0 or None, got target_kl={self.target_kl!r}")
        if not self.replay_ratio >= 0:
            raise ValueError(f"replay_ratio must be >= 0, got replay_ratio={self.replay_ratio!r}")
        if self.replay is not None and not isinstance(self.replay, dict):
            raise ValueError(f"replay must be None or a dict of LLMReplayBuffer arguments, got replay={self.replay!r}")
        entry = echorl_envs.entry(self.env_id)
        if entry.action_type != "choice":
            raise ValueError(f"method gigpo ranks admissible actions; env_id={self.env_id!r} takes free text "
                             "(use method 'grpo')")


def gigpo_config(run: Any, plan: bool | None = None, replay: bool | None = None) -> tuple[GiGPOConfig, dict[str, Any]]:
    """The :class:`GiGPOConfig` a GiGPO run (``gigpo``, ``bc+gigpo``, ``echorl``) of ``run`` (an
    :class:`~echorl_agent.llm_rl.train.LLMTrainConfig`) trains with, and the policy keyword arguments. ``plan`` /
    ``replay`` (default: the run's method's, from the registry): 2 plan tokens and lambda_KL 0.01 unless
    ``policy_kwargs`` sets them / the run's replay."""
    if plan is None or replay is None:
        from echorl_agent.llm_rl.algorithms.registry import get_method

        method = get_method(run.method)
        plan = method.plan if plan is None else plan
        replay = method.replay if replay is None else replay
    pk = dict(run.policy_kwargs)
    kl_coef = 0.0
    if plan:
        pk.setdefault("plan_tokens", PLAN_DEFAULTS["plan_tokens"])
        kl_coef = float(pk.pop("kl_coef", PLAN_DEFAULTS["kl_coef"]))
    gcfg = GiGPOConfig(env_id=run.env_id, env_kwargs=run.env_kwargs, group_size=run.group_size,
                       groups=max(1, run.n_envs // run.group_size), step_advantage_weight=run.step_advantage_weight,
                       gamma=0.95 if run.gamma is None else run.gamma, history=run.history,
                       max_episode_steps=run.max_episode_steps, learning_rate=run.learning_rate,
                       seed=run.seed, kl_coef=kl_coef, replay=run.replay_kwargs() if replay else None,
                       replay_ratio=run.replay_ratio, lm=pk, **{"epochs": 1, "ent_coef": 0.0, **run.gigpo_kwargs})
    return gcfg, pk
