"""EchoRL on the LM (method ``echorl``): GiGPO or PPO under the latent plan tokens (plan KL) and the hot/cold
prioritized replay of LLM transitions.

Modules: ``config`` (EchoRLConfig, ECHORL_LEARNERS, PLAN_DEFAULTS).
The public names are exported from :mod:`echorl_agent.llm_rl` (one home each).
"""
