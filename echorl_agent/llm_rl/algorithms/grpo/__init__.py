"""GRPO (Shao et al. 2024) for free-text envs: ``group_size`` sampled completions per prompt, group-normalised
rewards, the clipped token-level surrogate. Method ``grpo`` (oracle-answer warm start, then GRPO).

Modules: ``config`` (GRPOConfig, grpo_config), ``trainer`` (GRPOTrainer), ``run`` (GRPORun), ``checkpoint``.
The public names are exported from :mod:`echorl_agent.llm_rl` (one home each).
"""
