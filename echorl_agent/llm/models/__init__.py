"""Models of the inference engine: loading, and one layout adapter per architecture family.

:mod:`~echorl_agent.llm.models.loading` loads the embedded SmolLM2-135M or any HF causal LM.
:func:`~echorl_agent.llm.models.registry.layout_for` gives a model's
:class:`~echorl_agent.llm.models.base.ModelLayout` (module names and architecture facts), from one file per family --
:mod:`~echorl_agent.llm.models.llama` (Llama, SmolLM2), :mod:`~echorl_agent.llm.models.qwen2` (q/k/v biases),
:mod:`~echorl_agent.llm.models.mistral` (sliding window noted) -- through which the engine runner, the calibration,
the quantized linears, the fused decode and the learner's forward reach the model's modules.

The public names live in :mod:`echorl_agent.llm` (``from echorl_agent.llm import load_model, layout_for``); this
package exports nothing of its own.
"""
