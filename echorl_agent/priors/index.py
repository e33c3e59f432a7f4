"""Nearest-neighbour indexes over L2-normalised embeddings (cosine similarity = inner product).

Three backends share one small interface (:class:`VectorIndex`: ``add(key, vec)``, ``remove(key)``,
``search(query, k) -> (keys, sims)``, ``len``):

* :class:`NumpyIndex` -- a dense ``[capacity, dim]`` matrix and one matrix-vector product per query: exact, no
  build cost, the fastest choice for the small caches a text game produces (hundreds to a few thousand states);
* :class:`FaissIndex` -- ``faiss.IndexIDMap2(faiss.IndexFlatIP)``: exact inner-product search with BLAS kernels;
* :class:`HNSWIndex` -- ``hnswlib`` HNSW graph (Malkov & Yashunin, 2018) with ``space="ip"``: approximate, sub-linear
  query time for large caches; deleted slots are reused (``allow_replace_deleted``).

:func:`make_index` builds one by name; ``"auto"`` is :class:`AutoIndex`, which starts on numpy and migrates to
hnswlib once the cache holds ``switch_size`` vectors. The default switch size comes from
``benchmarks/prior_cache.py`` (query latency of the three backends side by side; see
``docs/results/priors-experience.md``).
"""

from __future__ import annotations

import difflib

import numpy as np

__all__ = ["VectorIndex", "NumpyIndex", "FaissIndex", "HNSWIndex", "AutoIndex", "make_index", "INDEXES",
           "AUTO_SWITCH_SIZE"]

#: Cache size from which :class:`AutoIndex` moves from numpy to hnswlib (measured, benchmarks/prior_cache.py).
AUTO_SWITCH_SIZE = 2048


def _as_matrix(vec: np.ndarray, dim: int) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(vec, dtype=np.float32).reshape(-1, dim))
    return arr


class VectorIndex:
    """Interface of the backends: integer keys -> unit vectors, top-k inner-product search."""

    dim: int

    def add(self, key: int, vec: np.ndarray) -> None:
        """Insert ``vec`` (shape ``[dim]``) under ``key`` (a key not already present)."""
        raise TypeError(f"{type(self).__name__} must implement add()")

    def remove(self, key: int) -> None:
        """Delete ``key`` (must be present)."""
        raise TypeError(f"{type(self).__name__} must implement remove()")

    def search(self, query: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` stored keys with the largest inner product with ``query`` and those inner products,
        best first (fewer than ``k`` when the index holds fewer)."""
        raise TypeError(f"{type(self).__name__} must implement search()")

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} must implement __len__()")


class NumpyIndex(VectorIndex):
    """Exact search with one ``[n, dim] @ [dim]`` product over a growable matrix (freed rows are reused)."""

    def __init__(self, dim: int, initial_capacity: int = 256) -> None:
        self.dim = int(dim)
        self._vecs = np.zeros((max(1, initial_capacity), self.dim), dtype=np.float32)  # [cap, dim]
        self._keys = np.full(len(self._vecs), -1, dtype=np.int64)  # row -> key (-1 = free row)
        self._row: dict[int, int] = {}
        self._free: list[int] = list(range(len(self._vecs) - 1, -1, -1))
        self._hi = 0  # rows [0, _hi) may be used

    def add(self, key: int, vec: np.ndarray) -> None:
        if key in self._row:
            raise ValueError(f"key {key} is already in the index; remove it first")
        if not self._free:
            old = len(self._vecs)
            self._vecs = np.concatenate([self._vecs, np.zeros_like(self._vecs)])
            self._keys = np.concatenate([self._keys, np.full(old, -1, dtype=np.int64)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        row = self._free.pop()
        self._vecs[row] = _as_matrix(vec, self.dim)[0]
        self._keys[row] = key
        self._row[key] = row
        self._hi = max(self._hi, row + 1)

    def remove(self, key: int) -> None:
        row = self._row.pop(key)
        self._keys[row] = -1
        self._vecs[row] = 0.0
        self._free.append(row)

    def search(self, query: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        if not self._row:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        sims = self._vecs[: self._hi] @ _as_matrix(query, self.dim)[0]  # [hi]
        sims = np.where(self._keys[: self._hi] >= 0, sims, -np.inf)
        k = min(k, len(self._row))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
        top = top[np.argsort(-sims[top], kind="stable")][:k]
        return self._keys[top].copy(), sims[top].astype(np.float32)

    def __len__(self) -> int:
        return len(self._row)


class FaissIndex(VectorIndex):
    """Exact inner-product search with ``faiss.IndexIDMap2(faiss.IndexFlatIP(dim))`` (faiss-cpu)."""

    def __init__(self, dim: int) -> None:
        import faiss

        self.dim = int(dim)
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        self._keys: set[int] = set()

    def add(self, key: int, vec: np.ndarray) -> None:
        if key in self._keys:
            raise ValueError(f"key {key} is already in the index; remove it first")
        self._index.add_with_ids(_as_matrix(vec, self.dim), np.asarray([key], dtype=np.int64))
        self._keys.add(key)

    def remove(self, key: int) -> None:
        self._keys.remove(key)
        self._index.remove_ids(np.asarray([key], dtype=np.int64))

    def search(self, query: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        if not self._keys:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        k = min(k, len(self._keys))
        sims, keys = self._index.search(_as_matrix(query, self.dim), k)
        return keys[0].astype(np.int64), sims[0].astype(np.float32)

    def __len__(self) -> int:
        return len(self._keys)


class HNSWIndex(VectorIndex):
    """Approximate search on an ``hnswlib`` HNSW graph (``space="ip"``; hnswlib reports ``1 - <q, x>``).

    Args:
        dim: embedding size.
        initial_capacity: elements before the graph is resized (doubles when full).
        M: graph degree; ef_construction / ef: build and query beam widths (hnswlib's parameters).
    """

    def __init__(self, dim: int, initial_capacity: int = 1024, M: int = 16, ef_construction: int = 100,
                 ef: int = 64) -> None:
        import hnswlib

        self.dim = int(dim)
        self._index = hnswlib.Index(space="ip", dim=self.dim)
        self._capacity = max(16, int(initial_capacity))
        self._index.init_index(max_elements=self._capacity, ef_construction=ef_construction, M=M,
                               allow_replace_deleted=True)
        self._index.set_ef(ef)
        self._ef = ef
        self._keys: set[int] = set()
        self._deleted = 0

    def add(self, key: int, vec: np.ndarray) -> None:
        if key in self._keys:
            raise ValueError(f"key {key} is already in the index; remove it first")
        if self._deleted:
            self._index.add_items(_as_matrix(vec, self.dim), [key], replace_deleted=True)
            self._deleted -= 1
        else:
            if len(self._keys) >= self._capacity:
                self._capacity *= 2
                self._index.resize_index(self._capacity)
            self._index.add_items(_as_matrix(vec, self.dim), [key])
        self._keys.add(key)

    def remove(self, key: int) -> None:
        self._keys.remove(key)
        self._index.mark_deleted(key)
        self._deleted += 1

    def search(self, query: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        if not self._keys:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        k = min(k, len(self._keys))
        self._index.set_ef(max(self._ef, k))
        keys, dist = self._index.knn_query(_as_matrix(query, self.dim), k=k)
        return keys[0].astype(np.int64), (1.0 - dist[0]).astype(np.float32)

    def __len__(self) -> int:
        return len(self._keys)


class AutoIndex(VectorIndex):
    """numpy while small, hnswlib from ``switch_size`` vectors on (the stored vectors are re-inserted once).

    Args:
        dim: embedding size.
        switch_size: size at which the index migrates (default :data:`AUTO_SWITCH_SIZE`, measured).
    """

    def __init__(self, dim: int, switch_size: int = AUTO_SWITCH_SIZE) -> None:
        if switch_size < 1:
            raise ValueError(f"switch_size must be >= 1, got switch_size={switch_size}")
        self.dim = int(dim)
        self.switch_size = int(switch_size)
        self._small: NumpyIndex | None = NumpyIndex(dim)
        self._large: VectorIndex | None = None

    @property
    def backend(self) -> str:
        """``"numpy"`` or ``"hnswlib"``: the backend in use now."""
        return "numpy" if self._small is not None else "hnswlib"

    def add(self, key: int, vec: np.ndarray) -> None:
        if self._small is not None:
            self._small.add(key, vec)
            if len(self._small) >= self.switch_size:
                small, self._small = self._small, None
                large = HNSWIndex(self.dim, initial_capacity=2 * self.switch_size)
                for k, row in small._row.items():
                    large.add(k, small._vecs[row])
                self._large = large
        else:
            assert self._large is not None
            self._large.add(key, vec)

    def remove(self, key: int) -> None:
        (self._small if self._small is not None else self._large).remove(key)  # type: ignore[union-attr]

    def search(self, query: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        return (self._small if self._small is not None else self._large).search(query, k)  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self._small if self._small is not None else self._large)  # type: ignore[arg-type]


#: Backend names accepted by :func:`make_index`.
INDEXES = {"auto": AutoIndex, "numpy": NumpyIndex, "faiss": FaissIndex, "hnswlib": HNSWIndex}


def make_index(kind: str, dim: int) -> VectorIndex:
    """A :class:`VectorIndex` by name (``"auto"``, ``"numpy"``, ``"faiss"`` or ``"hnswlib"``)."""
    if kind not in INDEXES:
        hint = difflib.get_close_matches(str(kind), list(INDEXES), n=1)
        raise ValueError(f"index must be one of {sorted(INDEXES)}, got index={kind!r}"
                         + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return INDEXES[kind](dim)
