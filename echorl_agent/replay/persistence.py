"""``save``/``load`` and pickling of :class:`~echorl_agent.replay.buffer.HotColdReplayBuffer`.

``save(path)`` writes every piece of state that influences future samples -- both tiers' transitions, plans, TD
errors, ages, the sum-tree leaves (internal nodes are a pure function of them), the constant logit parts, the
anchor, the EMA tracker and the sampler's RNG state -- in the atomic, checksummed format of
:mod:`echorl_agent.replay.serialization`. ``load(path)`` into a buffer built with the same spaces and capacities
restores it bit-exactly: the loaded buffer draws the same batches as the saved one would have.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from echorl_agent.replay.cold import ColdStore
from echorl_agent.replay.serialization import (
    ReplayFileError,
    read_array,
    read_header,
    verify_payload,
    write_arrays,
)

__all__ = ["PersistenceMixin"]

_COLD_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts", "plans", "td", "seq")
_HOT_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts", "hot_td", "hot_seq")


class PersistenceMixin:
    """Atomic bit-exact ``save``/``load`` plus pickle support for the hot/cold buffer."""

    def _layout(self) -> dict[str, Any]:
        return {
            "obs_shape": list(self.obs_shape), "obs_dtype": self.observations.dtype.str,
            "action_dim": int(self.action_dim), "action_dtype": self.actions.dtype.str,
            "n_envs": int(self.n_envs), "hot_rows": int(self.buffer_size), "cold_rows": int(self.cold_rows),
        }

    def save(self, path: str) -> None:
        """Atomically write the whole buffer state to ``path`` (temp file + fsync + rename)."""
        with self._lock:
            self._flush()
            arrays: dict[str, np.ndarray] = {name: getattr(self, name) for name in _HOT_FIELDS}
            nslots = self.hot_slots + self.cold_slots
            arrays["tree_leaves"] = self.tree.leaves[:nslots]
            arrays["c"] = self._c
            if self.plan_dim is not None:
                arrays["hot_plans"] = self.hot_plans
                tracker = self.tracker.state_dict()
                arrays["tau_bar"] = tracker["tau_bar"]
            if self._tau_ref is not None:
                arrays["tau_ref"] = self._tau_ref
            if self._projection is not None:
                arrays["projection"] = self._projection
            cold_meta = None
            if self.cold is not None:
                n = self.cold.num_rows
                for name in _COLD_FIELDS:
                    arrays[f"cold_{name}"] = self.cold.arrays[name][:n]
                cold_meta = {"pos": self.cold.pos, "full": self.cold.full}
            meta = {
                "layout": self._layout(),
                "config": dataclasses.asdict(self.config),
                "pos": int(self.pos), "full": bool(self.full), "num_added": int(self.num_added),
                "num_sample_calls": int(self.num_sample_calls), "plan_source": self.plan_source,
                "plan_dim": self.plan_dim, "shift": float(self._shift).hex(),
                "plan_norm_max": float(self._plan_norm_max).hex(), "td_max": float(self._td_max).hex(),
                "tracker": None if self.tracker is None else {
                    "initialized": self.tracker.initialized, "num_updates": self.tracker.num_updates},
                "cold": cold_meta, "rng": self._rng.bit_generator.state, "stats": self.stats,
            }
            write_arrays(path, arrays, meta)

    def load(self, path: str) -> None:
        """Replace this buffer's state with the one saved at ``path``.

        The file is fully validated (format, size, SHA-256, layout against this buffer) before anything changes.

        Raises:
            ReplayFileError: missing, truncated or corrupt file, or a file saved from a buffer with other spaces
                or capacities (a ``ValueError`` subclass).
        """
        with self._lock:
            header = read_header(path)
            meta = header["meta"]
            mine = self._layout()
            if meta["layout"] != mine:
                diff = {k: (meta["layout"].get(k), v) for k, v in mine.items() if meta["layout"].get(k) != v}
                raise ReplayFileError(
                    f"{path} was saved from a buffer with a different layout (saved, this): {diff}; build the buffer "
                    "with the same spaces, buffer_size, cold_size and n_envs before load()"
                )
            verify_payload(path, header)
            # ---- from here on the file is known intact and compatible: apply it
            self.close()
            self.plan_dim = None
            self.hot_plans, self.tracker, self.cold, self._projection, self._tau_ref = None, None, None, None, None
            if meta["plan_dim"] is not None:
                self._allocate(int(meta["plan_dim"]))
                self.hot_plans[...] = read_array(path, header, "hot_plans")
                self.tracker.load_state_dict({"tau_bar": read_array(path, header, "tau_bar"), "dim": self.plan_dim,
                                              "decay": self.config.ema_decay, **meta["tracker"]})
            for name in _HOT_FIELDS:
                getattr(self, name)[...] = read_array(path, header, name)
            names = {e["name"] for e in header["arrays"]}
            if "tau_ref" in names:
                self._tau_ref = np.array(read_array(path, header, "tau_ref"))
            if "projection" in names:
                self._projection = np.array(read_array(path, header, "projection"))
            if self.cold is not None and meta["cold"] is not None:
                n = 0
                for name in _COLD_FIELDS:
                    data = read_array(path, header, f"cold_{name}")
                    n = len(data)
                    self.cold.arrays[name][:n] = data
                self.cold.pos, self.cold.full = int(meta["cold"]["pos"]), bool(meta["cold"]["full"])
                self.cold.flush()
            nslots = self.hot_slots + self.cold_slots
            self.tree.leaves[:] = 0.0
            self.tree.leaves[:nslots] = read_array(path, header, "tree_leaves")
            self.tree.rebuild()
            self._c[...] = read_array(path, header, "c")
            self.pos, self.full = int(meta["pos"]), bool(meta["full"])
            self.num_added, self.num_sample_calls = int(meta["num_added"]), int(meta["num_sample_calls"])
            self.plan_source = meta["plan_source"]
            self._shift = float.fromhex(meta["shift"])
            self._plan_norm_max = float.fromhex(meta["plan_norm_max"])
            self._td_max = float.fromhex(meta["td_max"])
            self._rng.bit_generator.state = meta["rng"]
            self.stats = dict(meta["stats"])
            self._dirty_hot.clear()
            self._dirty_cold.clear()

    # ------------------------------------------------------------------ pickling (SB3 save_replay_buffer)
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            self._flush()
            state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_demote_cache")}
        state["plan_fn"] = None  # a bound policy method is not part of the buffer's data
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        import threading

        self.__dict__.update(state)
        self._lock = threading.RLock()
        assert self.cold is None or isinstance(self.cold, ColdStore)
