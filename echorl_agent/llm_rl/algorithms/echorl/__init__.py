"""EchoRL on the LM (method ``echorl``): GiGPO or PPO under the latent plan tokens (plan KL) and the hot/cold
prioritized replay of LLM transitions."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.echorl.config import ECHORL_LEARNERS, PLAN_DEFAULTS, EchoRLConfig

__all__ = ["ECHORL_LEARNERS", "EchoRLConfig", "PLAN_DEFAULTS"]
