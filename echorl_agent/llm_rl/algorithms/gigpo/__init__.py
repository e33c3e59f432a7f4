"""GiGPO (Feng et al. 2025, arXiv 2505.10978): critic-free group RL on a choice env, K episodes per seed,
episode- and anchor-state step advantages. Methods ``gigpo`` and ``bc+gigpo`` (and the learner of ``echorl``).

Modules: ``config`` (GiGPOConfig, gigpo_config), ``trainer`` (GiGPOTrainer), ``run`` (GiGPORun), ``checkpoint``.
The public names are exported from :mod:`echorl_agent.llm_rl` (one home each).
"""
