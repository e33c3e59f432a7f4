"""Quantized decode: the Python side and its C kernel side by side.

:mod:`~echorl_agent.llm.quant.linear` (``QuantizedLinear``, int8/int4 packing),
:mod:`~echorl_agent.llm.quant.qkernel` (builds and loads ``qlinear.c``) and
:mod:`~echorl_agent.llm.quant.fused_decode` (a whole decode step in one C call).

``echorl_agent.llm.quant`` was a module (now :mod:`~echorl_agent.llm.quant.linear`); every name it had still
resolves here, loaded on first access: ``from echorl_agent.llm.quant import QuantizedLinear``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WEIGHT_DTYPES": "linear",
    "QuantizedLinear": "linear",
    "quantize_model_linears": "linear",
    "linear_names": "linear",
    "check_weight_dtype": "linear",
    "lm_head_dtype": "linear",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"echorl_agent.llm.quant.{_EXPORTS[name]}"), name)
    # any other name the old ``echorl_agent.llm.quant`` module had (e.g. ``KERNEL_ROWS``, ``GROUP``)
    module = importlib.import_module("echorl_agent.llm.quant.linear")
    if name.startswith("__") or not hasattr(module, name):
        raise AttributeError(f"module 'echorl_agent.llm.quant' has no attribute {name!r}")
    return getattr(module, name)
