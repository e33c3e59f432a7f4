"""GRPO (Shao et al. 2024) for free-text envs: ``group_size`` sampled completions per prompt, group-normalised
rewards, the clipped token-level surrogate. Method ``grpo`` (oracle-answer warm start, then GRPO)."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.grpo.trainer import GRPOConfig, GRPOTrainer, Group

__all__ = ["GRPOConfig", "GRPOTrainer", "Group"]
