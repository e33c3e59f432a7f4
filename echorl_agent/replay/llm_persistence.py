"""``save``/``load`` of :class:`~echorl_agent.replay.llm.LLMReplayBuffer`: one checksummed replay file.

The file (format of :mod:`echorl_agent.replay.serialization`) holds the inner ``HotColdReplayBuffer``'s arrays under
``index/`` (exactly what its own ``save`` writes, validated by its own loader) and the items under ``items/``
(:func:`~echorl_agent.replay.llm_items.pack_items`: token ids, scalars, and every tensor bit-exactly), so a flipped
byte anywhere is detected, and a load changes nothing unless the whole file checks out, including that the
stored items are exactly the sampler's live (stored, not evicted) slots.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_agent.replay.llm_items import pack_items, unpack_items
from echorl_agent.replay.serialization import ReplayFileError, ReplayFileReader, remove_orphans, write_arrays

__all__ = ["COUNTERS", "LLMPersistenceMixin"]

COUNTERS = ("hits", "misses", "recomputed", "activations_dropped", "evicted_stale", "rescored", "evicted_budget")
"""The LLM buffer's event counters (reported by ``stats()`` and saved with the buffer)."""
_FORMAT = "echorl-llm-replay/1"


class _PrefixedReader:
    """The part of a :class:`ReplayFileReader` under ``prefix``, as the SB3 buffer's loader expects a file."""

    def __init__(self, reader: ReplayFileReader, prefix: str, meta: dict[str, Any]) -> None:
        self.path, self.meta, self._reader, self._prefix = reader.path, meta, reader, prefix
        self.entries = {k[len(prefix):]: e for k, e in reader.entries.items() if k.startswith(prefix)}

    def verify(self) -> None:
        self._reader.verify()  # every array of the file, the items' too

    def array(self, name: str) -> np.ndarray:
        return self._reader.array(self._prefix + name)


class LLMPersistenceMixin:
    """Atomic, checksummed, fully validated ``save``/``load`` of the LLM replay buffer."""

    def save(self, path: str) -> None:
        """Atomically write items (tensors included) and the sampler state to one checksummed replay file."""
        with self._lock:
            index_arrays, index_meta = self.index._state()
            seqs = list(self._items)
            item_arrays, item_meta = pack_items([self._items[s] for s in seqs])
            arrays = {f"index/{k}": v for k, v in index_arrays.items()}
            arrays.update({f"items/{k}": v for k, v in item_arrays.items()})
            arrays["items/seq"] = np.array(seqs, dtype=np.int64)
            meta = {"format": _FORMAT, "index": index_meta, "items": item_meta,
                    "llm": {"version": self.version, "counts": self._counts}}
            write_arrays(path, arrays, meta)

    def load(self, path: str) -> None:
        """Replace this buffer's state with the one saved at ``path`` (validated fully before anything changes).

        Raises:
            ReplayFileError: missing, truncated or corrupt file, a file of another buffer layout, or items that
                disagree with the sampler state (a ``ValueError`` subclass).
        """
        with self._lock:
            remove_orphans(path)
            with ReplayFileReader(path) as reader:
                meta = reader.meta
                if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                    raise ReplayFileError(f"{path} is not an LLMReplayBuffer file (format {_FORMAT!r} expected)")
                staged = self.index._stage(_PrefixedReader(reader, "index/", meta["index"]))
                try:
                    arrays = {k[len("items/"):]: reader.array(k) for k in reader.entries if k.startswith("items/")}
                    items = unpack_items(arrays, meta["items"])
                    seqs = np.asarray(arrays["seq"]).tolist()
                    version, counts = int(meta["llm"]["version"]), {k: int(meta["llm"]["counts"][k]) for k in COUNTERS}
                except (KeyError, TypeError, ValueError) as e:
                    if isinstance(e, ReplayFileError):
                        raise
                    raise ReplayFileError(f"{path} has malformed items ({type(e).__name__}: {e})") from e
                if sorted(seqs) != self._live_seqs(staged) or len(seqs) != len(items):
                    raise ReplayFileError(f"{path}: the stored items do not match the sampler's live slots")
                self.index._apply_loaded(staged)
            self._items.clear()
            self._with_acts.clear()
            self._token_bytes = self._act_bytes = 0
            for seq, it in sorted(zip(seqs, items, strict=True), key=lambda p: p[0]):
                self._store(seq, it)
            self.version, self._counts = version, counts
            self._enforce_budget()

    def _live_seqs(self, staged: dict[str, Any]) -> list[int]:
        """Add counters of the stored, not evicted slots of a staged inner-buffer state."""
        arrays, h = staged["arrays"], self.index.buffer_size
        dead = np.asarray(arrays["dead"]) if "dead" in arrays else np.zeros(h + self.index.cold_slots, bool)
        hot = np.asarray(arrays["hot_seq"])
        live = [int(s) for s, d in zip(hot.tolist(), dead[:h].tolist(), strict=True) if s >= 0 and not d]
        if "cold_seq" in arrays:
            cold = np.asarray(arrays["cold_seq"]).reshape(-1)
            live += [int(s) for s, d in zip(cold.tolist(), dead[h : h + len(cold)].tolist(), strict=True) if not d]
        return sorted(live)
