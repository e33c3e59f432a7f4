"""GiGPO (Feng et al. 2025, arXiv 2505.10978): critic-free group RL on a choice env, K episodes per seed,
episode- and anchor-state step advantages. Methods ``gigpo`` and ``bc+gigpo`` (and the learner of ``echorl``)."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig, gigpo_config
from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer

__all__ = ["GiGPOConfig", "GiGPOTrainer", "gigpo_config"]
