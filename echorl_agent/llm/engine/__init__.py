"""The rollout engine in nano-vllm's shape: ``LLMEngine`` joins Scheduler → PrefixCache → ModelRunner.

Modules: :mod:`~echorl_agent.llm.engine.llm_engine` (the engine and its ``step()``),
:mod:`~echorl_agent.llm.engine.engine_requests` (sequence state and request handling),
:mod:`~echorl_agent.llm.engine.scheduler`, :mod:`~echorl_agent.llm.engine.prefix_cache`,
:mod:`~echorl_agent.llm.engine.runner`, :mod:`~echorl_agent.llm.engine.scoring` (and its
:mod:`~echorl_agent.llm.engine.score_memo`),
:mod:`~echorl_agent.llm.engine.config`, :mod:`~echorl_agent.llm.engine.metrics` and
:mod:`~echorl_agent.llm.engine.usage`.

The public names live in :mod:`echorl_agent.llm` (``from echorl_agent.llm import LLMEngine``); this package exports
nothing of its own.
"""
