"""Array sum tree over float64 leaf weights, vectorised with numpy (Schaul et al. 2016, Appendix B.2.1).

Layout: ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i+1``, leaves live at ``tree[cap:2cap]``
(``cap`` a power of two). Every internal node is always recomputed as ``tree[2i] + tree[2i+1]`` from its children
(never updated by deltas), so no rounding drift accumulates and the tree is a pure function of its leaves: a
rebuild from saved leaves is bit-identical to the incrementally maintained tree.

``find`` and ``set`` run in C (:mod:`echorl_agent.replay.ckernel`) when the kernel can be built; the numpy code
beside it is the reference and gives bit-identical results (``tests/test_replay.py`` compares them).
"""

from __future__ import annotations

import numpy as np

from echorl_agent.replay import ckernel

__all__ = ["SumTree"]


class SumTree:
    """Sum tree with batched leaf updates, prefix sums and batched inverse-CDF descent.

    Args:
        size: number of leaves needed (rounded up to a power of two internally).
        use_kernel: run ``find``/``set`` in C when the kernel loads (default); False forces the numpy reference.
    """

    use_kernel = True  # class default: trees pickled before the flag existed use the kernel too

    def __init__(self, size: int, use_kernel: bool = True) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got size={size}")
        self.use_kernel = bool(use_kernel)
        self.size = int(size)
        self.capacity = 1 << (self.size - 1).bit_length()
        self.depth = self.capacity.bit_length() - 1
        self.tree = np.zeros(2 * self.capacity, dtype=np.float64)  # [2 * cap]; tree[0] unused

    @property
    def leaves(self) -> np.ndarray:
        """View of the ``[cap]`` leaf weights (write through :meth:`set` or :meth:`rebuild`)."""
        return self.tree[self.capacity :]

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def _lib(self):
        return ckernel.load() if self.use_kernel else None

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` (sorted or not, duplicates: last write wins) and refresh their ancestors."""
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        if idx.size == 0:
            return
        lib = self._lib()
        if lib is not None and idx.size * 8 <= self.capacity:
            vals = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape))
            lib.sumtree_set(self.tree.ctypes.data, self.capacity, idx.ctypes.data, vals.ctypes.data, idx.size)
            return
        self.tree[idx + self.capacity] = values
        if idx.size * 8 > self.capacity:
            self.rebuild()
            return
        nodes = np.unique((idx + self.capacity) >> 1)
        while True:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            parents = nodes >> 1
            keep = np.empty(parents.shape, dtype=bool)
            keep[0] = True
            np.not_equal(parents[1:], parents[:-1], out=keep[1:])
            nodes = parents[keep]

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Set the contiguous leaves ``[start, start + len(values))`` and refresh their ancestors level by level."""
        n = len(values)
        if n == 0:
            return
        lo, hi = start + self.capacity, start + self.capacity + n
        self.tree[lo:hi] = values
        if n * 8 > self.capacity:
            self.rebuild()
            return
        lo, hi = lo >> 1, (hi - 1) >> 1
        while lo >= 1:
            self.tree[lo : hi + 1] = self.tree[2 * lo : 2 * hi + 2 : 2] + self.tree[2 * lo + 1 : 2 * hi + 2 : 2]
            if lo == 1:
                break
            lo, hi = lo >> 1, hi >> 1

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (O(cap))."""
        lo = self.capacity >> 1
        while lo >= 1:
            self.tree[lo : 2 * lo] = self.tree[2 * lo : 4 * lo : 2] + self.tree[2 * lo + 1 : 4 * lo : 2]
            lo >>= 1

    def prefix(self, k: int) -> float:
        """Sum of leaves ``[0, k)`` (O(log cap))."""
        if k <= 0:
            return 0.0
        if k >= self.capacity:
            return self.total
        node, acc = k + self.capacity, 0.0
        # Walk up from leaf k: whenever we are a right child, the left sibling lies entirely before k.
        while node > 1:
            if node & 1:
                acc += self.tree[node - 1]
            node >>= 1
        return acc

    def find(self, u: np.ndarray) -> np.ndarray:
        """Leaf indices ``i`` with ``prefix(i) <= u < prefix(i + 1)`` for each mass ``u`` in ``[0, total)``.

        Rounding can land a mass just past the last non-zero leaf; callers check that the found leaf is > 0.
        """
        lib = self._lib()
        if lib is not None:
            u = np.ascontiguousarray(u, dtype=np.float64)
            out = np.empty(u.shape, dtype=np.int64)
            lib.sumtree_find(self.tree.ctypes.data, self.depth, u.ctypes.data, u.size, out.ctypes.data)
            return out
        u = np.array(u, dtype=np.float64, copy=True)
        idx = np.ones(u.shape, dtype=np.int64)
        tree = self.tree
        for _ in range(self.depth):
            left = idx << 1
            lv = tree[left]
            right = u >= lv
            u -= lv * right
            idx = left + right
        return idx - self.capacity
