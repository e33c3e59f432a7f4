"""GRPO (Shao et al. 2024) for free-text envs: ``group_size`` sampled completions per prompt, group-normalised
rewards, the clipped token-level surrogate. Method ``grpo`` (oracle-answer warm start, then GRPO)."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.grpo.config import ANSWER_SYSTEM, GRPOConfig, grpo_config
from echorl_agent.llm_rl.algorithms.grpo.trainer import Group, GRPOTrainer

__all__ = ["ANSWER_SYSTEM", "GRPOConfig", "GRPOTrainer", "Group", "grpo_config"]
