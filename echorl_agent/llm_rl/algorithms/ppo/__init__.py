"""PPO / EchoPPO for the LM policy (:class:`LLMPPO`, an SB3 model) and its EchoRL replay mixing. Methods ``ppo``,
``bc+ppo``, ``echoppo`` (and ``echorl`` with ``echorl_learner="ppo"``)."""

from __future__ import annotations

from echorl_agent.llm_rl.algorithms.ppo.llm_ppo import LLMPPO

__all__ = ["LLMPPO"]
