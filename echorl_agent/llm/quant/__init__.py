"""Quantized decode: the Python side and its C kernel side by side.

:mod:`~echorl_agent.llm.quant.linear` (``QuantizedLinear``, int8/int4 packing),
:mod:`~echorl_agent.llm.quant.qkernel` (builds and loads ``qlinear.c``) and
:mod:`~echorl_agent.llm.quant.fused_decode` (a whole decode step in one C call).

The public names live in :mod:`echorl_agent.llm` (``from echorl_agent.llm import QuantizedLinear``); this package
exports nothing of its own.
"""
