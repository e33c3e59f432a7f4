"""OpenAI-compatible serving: :mod:`~echorl_agent.llm.serving.server` (the FastAPI app, ``create_app``),
:mod:`~echorl_agent.llm.serving.protocol` (request/response models), :mod:`~echorl_agent.llm.serving.render`
(detokenizing, logprobs, usage), :mod:`~echorl_agent.llm.serving.lora` (adapters served by name),
:mod:`~echorl_agent.llm.serving.args` (the ``serve`` CLI arguments) and
:mod:`~echorl_agent.llm.serving.openai_backend` (the client side: any OpenAI-compatible server as a backend).

Run the server with ``python -m echorl_agent.llm.serving.server`` (or ``echorl serve``).
"""
