"""Cold tier of the hot/cold replay: a ring of transition rows stored in numpy memmaps on disk.

The paper's cold tier holds 10^7 transitions, more than RAM comfortably holds next to a 10^6 hot tier; here each
field (observations, next observations, actions, rewards, dones, timeouts, plans, TD errors) is one
``numpy.memmap`` file ``<field>.npy`` (a real ``.npy`` file, so ``np.load(path, mmap_mode="r")`` reads it too) in
``directory``, and ``meta.json`` records the ring position so a store can be reopened after a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ColdStore"]

_META = "meta.json"


class ColdStore:
    """Ring buffer of ``rows`` rows, each holding ``n_envs`` transitions, in memory-mapped ``.npy`` files.

    Args:
        directory: folder for the files; None creates a private temporary folder removed by :meth:`close`.
        rows: ring capacity in rows (transitions = rows * n_envs).
        n_envs: transitions per row (SB3's ``n_envs``).
        fields: ``{name: (per-transition shape, dtype string)}``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        rows: int,
        n_envs: int,
        fields: dict[str, tuple[tuple[int, ...], str]],
    ) -> None:
        if rows < 1:
            raise ValueError(f"rows must be >= 1 for a cold tier, got rows={rows}")
        self._owns_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="echorl-cold-")) if directory is None else Path(directory)
        self._arm_cleanup()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows, self.n_envs = int(rows), int(n_envs)
        self.fields = {k: (tuple(int(s) for s in shape), str(np.dtype(dt))) for k, (shape, dt) in fields.items()}
        self.pos, self.full = 0, False
        self._mmaps: dict[str, np.memmap] = {}
        self.arrays: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in self.fields.items():
            self._attach(name, np.lib.format.open_memmap(
                self.directory / f"{name}.npy", mode="w+", dtype=dtype, shape=(self.rows, self.n_envs, *shape)
            ))
        self._write_meta()

    def _attach(self, name: str, mm: np.memmap) -> None:
        # Index through a plain ndarray view of the same mapped memory: np.memmap's Python-level __getitem__ and
        # __array_finalize__ would otherwise cost a few microseconds per row access.
        self._mmaps[name] = mm
        self.arrays[name] = mm.view(np.ndarray)

    def _arm_cleanup(self) -> None:
        # A private temporary folder is removed when the store is garbage-collected (or at interpreter exit).
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.directory), True) if self._owns_dir else None

    # ------------------------------------------------------------------ persistence of the ring itself
    def _write_meta(self) -> None:
        meta = {"rows": self.rows, "n_envs": self.n_envs, "pos": self.pos, "full": self.full,
                "fields": {k: [list(s), d] for k, (s, d) in self.fields.items()}}
        tmp = self.directory / (_META + ".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.directory / _META)

    def flush(self) -> None:
        """Flush the memmaps to disk and record the ring position in ``meta.json``."""
        for mm in self._mmaps.values():
            mm.flush()
        self._write_meta()

    @classmethod
    def open(cls, directory: str | os.PathLike[str], mode: str = "r+") -> ColdStore:
        """Reopen a store written by a previous :class:`ColdStore` (after :meth:`flush` or :meth:`close`).

        Raises:
            ValueError: the folder has no ``meta.json`` or a field file does not match it.
        """
        directory = Path(directory)
        meta_path = directory / _META
        if not meta_path.is_file():
            raise ValueError(f"{directory} holds no cold store ({_META} missing); pass the cold_dir used before")
        meta = json.loads(meta_path.read_text())
        self = cls.__new__(cls)
        self._owns_dir = False
        self._finalizer = None
        self.directory = directory
        self.rows, self.n_envs = int(meta["rows"]), int(meta["n_envs"])
        self.pos, self.full = int(meta["pos"]), bool(meta["full"])
        self.fields = {k: (tuple(s), d) for k, (s, d) in meta["fields"].items()}
        self._mmaps, self.arrays = {}, {}
        for name, (shape, dtype) in self.fields.items():
            arr = np.load(directory / f"{name}.npy", mmap_mode=mode)
            if arr.shape != (self.rows, self.n_envs, *shape) or arr.dtype != np.dtype(dtype):
                raise ValueError(
                    f"cold field {name!r} in {directory} has shape {arr.shape}/{arr.dtype}, expected "
                    f"{(self.rows, self.n_envs, *shape)}/{dtype}: the folder was written by a different buffer"
                )
            self._attach(name, arr)
        return self

    def close(self) -> None:
        """Flush, drop the memmaps and delete the folder if it is a private temporary one."""
        if not self.arrays:
            return
        if self._owns_dir:
            self._mmaps, self.arrays = {}, {}
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            self.flush()
            self._mmaps, self.arrays = {}, {}

    # ------------------------------------------------------------------ ring operations
    @property
    def num_rows(self) -> int:
        """Rows currently stored."""
        return self.rows if self.full else self.pos

    def write_row(self, values: dict[str, np.ndarray] | tuple[tuple[str, np.ndarray], ...]) -> int:
        """Write one row at the ring position (evicting the oldest row when full); returns its row index."""
        row = self.pos
        arrays = self.arrays
        for name, value in values.items() if isinstance(values, dict) else values:
            arrays[name][row] = value
        self.pos += 1
        if self.pos == self.rows:
            self.pos, self.full = 0, True
        return row

    def oldest_first(self) -> np.ndarray:
        """Row indices from oldest to newest (the eviction order)."""
        if not self.full:
            return np.arange(self.pos)
        return (np.arange(self.rows) + self.pos) % self.rows

    # ------------------------------------------------------------------ pickling (SB3's save_replay_buffer)
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("arrays", "_mmaps", "_finalizer")}
        state["arrays"] = {k: np.array(v[: self.num_rows]) for k, v in self.arrays.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        data = state.pop("arrays")
        self.__dict__.update(state)
        # A pickled store is restored into a fresh private folder (the original may not exist on this machine).
        self._owns_dir = True
        self.directory = Path(tempfile.mkdtemp(prefix="echorl-cold-"))
        self._arm_cleanup()
        self._mmaps, self.arrays = {}, {}
        for name, (shape, dtype) in self.fields.items():
            arr = np.lib.format.open_memmap(
                self.directory / f"{name}.npy", mode="w+", dtype=dtype, shape=(self.rows, self.n_envs, *shape)
            )
            arr[: len(data[name])] = data[name]
            self._attach(name, arr)
        self._write_meta()
