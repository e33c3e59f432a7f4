"""Served models of ``echorl serve``: the base engine plus LoRA adapters loaded at run time (vLLM's routes).

``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` loads a peft adapter directory (``adapter_config.json`` +
``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes it) for the served base model; requests with
``"model": lora_name`` then run on base + adapter. Each adapter gets its own :class:`LLMEngine` over a copy of the
base model with the LoRA merged into the weights (``PeftModel.from_pretrained(copy, path).merge_and_unload()``),
so a request pays no adapter overhead and its prefix cache holds only KV computed with those weights. Loading a name
again replaces the engine atomically: requests sent after the load returns never see the old weights, and
requests already running on the old engine finish before it is stopped.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path

from echorl_agent.llm.engine.llm_engine import LLMEngine
from echorl_agent.llm.models.loading import LoadedModel
from echorl_agent.llm.serving.protocol import OpenAIError

__all__ = ["ServedModels"]

log = logging.getLogger(__name__)


class ServedModels:
    """Model name -> engine (the base model and its loaded LoRA adapters).

    Args:
        base: the engine of the base model (already started).
        base_name: the name clients use for it.
        max_loras: adapters loaded at once.
        drain_timeout: seconds a replaced adapter's engine gets to finish its running requests.
    """

    def __init__(self, base: LLMEngine, base_name: str, max_loras: int = 2, drain_timeout: float = 120.0) -> None:
        if max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got max_loras={max_loras}")
        self.base, self.base_name, self.max_loras = base, base_name, max_loras
        self.drain_timeout = drain_timeout
        self.adapters: dict[str, LLMEngine] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        with self._lock:
            return [self.base_name, *self.adapters]

    def engine_for(self, model: str | None) -> LLMEngine:
        """The engine serving ``model`` (None = the base model); OpenAIError 404 for an unknown name."""
        if model is None or model == self.base_name:
            return self.base
        with self._lock:
            eng = self.adapters.get(model)
        if eng is None:
            raise OpenAIError(f"The model `{model}` does not exist; available: {self.names()}", status=404,
                              param="model", code="model_not_found")
        return eng

    def load(self, name: str, path: str) -> bool:
        """Load (or replace) adapter ``name`` from ``path``; returns True when it replaced one. Blocking."""
        if name == self.base_name:
            raise OpenAIError(f"lora_name {name!r} is the base model's name; choose another", param="lora_name")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise OpenAIError(f"lora_path {path!r} is not a peft adapter directory (no adapter_config.json); save "
                              "one with PeftModel.save_pretrained", status=404, param="lora_path")
        with self._lock:
            if name not in self.adapters and len(self.adapters) >= self.max_loras:
                raise OpenAIError(f"{len(self.adapters)} LoRA adapters are loaded, the limit is max_loras="
                                  f"{self.max_loras}; unload one (POST /v1/unload_lora_adapter) or raise --max-loras",
                                  param="lora_name")
        engine = LLMEngine(self._merged(folder, name), self.base.config).start()
        with self._lock:
            old = self.adapters.get(name)
            self.adapters[name] = engine
        if old is not None:
            self._retire(old)
        return old is not None

    def unload(self, name: str) -> None:
        with self._lock:
            old = self.adapters.pop(name, None)
        if old is None:
            raise OpenAIError(f"The lora adapter `{name}` cannot be found", status=404, param="lora_name",
                              code="model_not_found")
        self._retire(old)

    def close(self) -> None:
        """Stop every adapter engine (the base engine belongs to the caller)."""
        with self._lock:
            engines, self.adapters = list(self.adapters.values()), {}
        for e in engines:
            e.stop()

    def _merged(self, folder: Path, name: str) -> LoadedModel:
        try:
            from peft import PeftModel
        except ImportError as e:
            raise OpenAIError(f"loading LoRA adapters needs peft (pip install 'echorl[llm]'): {e}",
                              status=501, type="server_error") from e
        base = self.base.llm
        try:
            model = PeftModel.from_pretrained(copy.deepcopy(base.model), str(folder)).merge_and_unload()
        except (ValueError, KeyError, RuntimeError, OSError) as e:
            raise OpenAIError(f"cannot load the adapter at {str(folder)!r} on the base model {base.name!r}: {e}",
                              param="lora_path") from e
        model.eval()
        model.requires_grad_(False)
        return LoadedModel(model=model, tokenizer=base.tokenizer, name=name, extra={"lora_path": str(folder)})

    def _retire(self, engine: LLMEngine) -> None:
        """Let ``engine`` finish its running requests (no new ones reach it), then stop it."""

        def drain() -> None:
            deadline = time.monotonic() + self.drain_timeout
            while engine.has_work() and time.monotonic() < deadline:
                time.sleep(0.05)
            engine.abort_all()
            while engine.has_work() and time.monotonic() < deadline + 5:
                time.sleep(0.05)
            engine.stop()

        threading.Thread(target=drain, name="echorl-lora-retire", daemon=True).start()
