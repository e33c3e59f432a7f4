"""Hyperparameters of GRPO on free-text envs (:class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from echorl_agent.llm.engine.config import SAMPLERS
from echorl_agent.llm_rl.config import LLMPolicyConfig, check_no_plan_on_free_text

__all__ = ["ANSWER_SYSTEM", "GRPOConfig", "grpo_config"]

ANSWER_SYSTEM = "Solve the problem. Reply with the final answer only."
"""The default system message: answer only."""


@dataclass
class GRPOConfig:
    """Hyperparameters of :class:`GRPOTrainer` (the LM part is an :class:`LLMPolicyConfig`)."""

    env_id: str = "EchoRL/Arithmetic-v0"
    """A free-text env (or any env: the completion text is the action)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` arguments of the env."""
    group_size: int = 8
    """n completions per prompt."""
    prompts_per_step: int = 4
    """Tasks (env resets) per GRPO step; a step samples ``group_size * prompts_per_step`` completions."""
    max_tokens: int = 16
    """Completion budget in tokens."""
    lr: float = 2e-4
    """Adam's learning rate."""
    clip_range: float = 0.2
    """Clip on the token-level ratio pi / pi_old."""
    epochs: int = 1
    """Gradient passes over each batch of groups."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    system_prompt: str = ANSWER_SYSTEM
    """System message of the chat prompt."""
    seed: int = 0
    """Seeds the task seeds and the engine's sampling seeds."""
    sampler: str = "multinomial"
    """How the engine draws each token (``SamplingParams.sampler``): "multinomial" or "inverse_cdf" (the same
    distribution, ~10x cheaper per token on a CPU; different completions for the same seed)."""
    lm: LLMPolicyConfig = field(default_factory=LLMPolicyConfig)
    """The trained LM (a dict of :class:`LLMPolicyConfig` fields is accepted)."""

    def __post_init__(self) -> None:
        for name in ("group_size", "prompts_per_step", "max_tokens", "epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (advantages are relative to the group), got {self.group_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got lr={self.lr!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got sampler={self.sampler!r}")
        if isinstance(self.lm, dict):
            self.lm = LLMPolicyConfig.from_kwargs(**self.lm)
        check_no_plan_on_free_text(self.lm.plan_tokens, self.env_id)


def grpo_config(run: Any) -> GRPOConfig:
    """The :class:`GRPOConfig` method ``grpo`` of ``run`` (an :class:`~echorl_agent.llm_rl.train.LLMTrainConfig`)
    trains with: ``grpo_kwargs`` with the env, its options and the seed of ``run``, and ``policy_kwargs`` as the LM."""
    gk = dict(run.grpo_kwargs)
    gk.setdefault("env_id", run.env_id)
    gk.setdefault("seed", run.seed)
    if run.env_kwargs:
        gk.setdefault("env_kwargs", run.env_kwargs)
    gk["lm"] = LLMPolicyConfig.from_kwargs(**run.policy_kwargs)
    return GRPOConfig(**gk)
