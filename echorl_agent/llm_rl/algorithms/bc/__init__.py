"""Behaviour cloning on the env's expert: method ``bc`` and the warm-start stage of ``bc+ppo``, ``echoppo``,
``bc+gigpo`` and ``echorl`` (``bc_warm_start``).

Modules: ``clone`` (behaviour_clone, collect_expert_states), ``dagger`` (collect_policy_states: the policy plays,
the expert labels), ``warm_start`` (BCConfig, bc_warm_start: BC, then DAgger rounds).
The public names are exported from :mod:`echorl_agent.llm_rl` (one home each).
"""
