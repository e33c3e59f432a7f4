"""PPO / EchoPPO for the LM policy (:class:`LLMPPO`, an SB3 model) and its EchoRL replay mixing. Methods ``ppo``,
``bc+ppo``, ``echoppo`` (and ``echorl`` with ``echorl_learner="ppo"``).

Modules: ``config`` (PPOConfig), ``llm_ppo`` (LLMPPO), ``replay`` (PPOReplay), ``trainer`` (PPORun), ``checkpoint``.
The public names are exported from :mod:`echorl_agent.llm_rl` (one home each).
"""
