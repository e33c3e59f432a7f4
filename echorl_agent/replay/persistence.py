"""``save``/``load`` and pickling of :class:`~echorl_agent.replay.buffer.HotColdReplayBuffer`.

``save(path)`` writes every piece of state that influences future samples -- both tiers' transitions, plans, TD
errors, ages, the sum-tree leaves (internal nodes are a pure function of them), the constant logit parts, the
anchor, the EMA tracker and the sampler's RNG state -- in the atomic, checksummed format of
:mod:`echorl_agent.replay.serialization`. ``load(path)`` into a buffer built with the same spaces and capacities
restores it bit-exactly: the loaded buffer draws the same batches as the saved one would have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import threading
from typing import Any

import numpy as np

from echorl_agent.replay.cold import ColdStore
from echorl_agent.replay.serialization import ReplayFileError, ReplayFileReader, remove_orphans, write_arrays
from echorl_agent.replay.validation import COLD_FIELDS as _COLD_FIELDS
from echorl_agent.replay.validation import HOT_FIELDS as _HOT_FIELDS
from echorl_agent.replay.validation import stage_load

__all__ = ["PersistenceMixin"]

_PICKLE_FORMAT = "echorl-replay-pickle/1"


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
            write_arrays(path, *self._state())

    def _state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, meta) of :meth:`save`; :class:`~echorl_agent.replay.llm.LLMReplayBuffer` embeds them in its file."""
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
            if self._dead.any():
                arrays["dead"] = self._dead
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
            return arrays, meta

    def load(self, path: str) -> None:
        """Replace this buffer's state with the one saved at ``path``.

        The file is opened once and fully validated through that descriptor (format, header and per-array SHA-256,
        layout against this buffer, header counters against the payload: :mod:`echorl_agent.replay.validation`)
        before anything changes, so a failed load leaves the buffer as it was and a save running concurrently in
        another process (it renames a new file into place) cannot mix versions. Temporary files of killed saves
        next to ``path`` are removed first.

        Raises:
            ReplayFileError: missing, truncated or corrupt file, or a file saved from a buffer with other spaces
                or capacities (a ``ValueError`` subclass).
        """
        with self._lock:
            remove_orphans(path)
            with ReplayFileReader(path) as reader:
                staged = stage_load(self, reader)
                self._apply_loaded(staged)

    def _stage(self, reader: Any) -> dict[str, Any]:
        """Validate a reader (or a prefixed view of one, see the LLM buffer) for :meth:`_apply_loaded`."""
        return stage_load(self, reader)

    def _apply_loaded(self, s: dict[str, Any]) -> None:
        """Apply the state validated by :func:`stage_load` (no check can fail from here on)."""
        arrays = s["arrays"]
        self.close()
        self.plan_dim = None
        self.hot_plans, self.tracker, self.cold, self._projection, self._tau_ref = None, None, None, None, None
        if s["plan_dim"] is not None:
            self._allocate(s["plan_dim"])
            self.hot_plans[...] = arrays["hot_plans"]
            self.tracker.load_state_dict({"tau_bar": arrays["tau_bar"], "dim": self.plan_dim,
                                          "decay": self.config.ema_decay, **s["tracker"]})
        for name in _HOT_FIELDS:
            getattr(self, name)[...] = arrays[name]
        if "tau_ref" in arrays:
            self._tau_ref = np.array(arrays["tau_ref"])
        if "projection" in arrays:
            self._projection = np.array(arrays["projection"])
        if "cold" in s:
            for name in _COLD_FIELDS:
                data = arrays[f"cold_{name}"]
                self.cold.arrays[name][: len(data)] = data
            self.cold.pos, self.cold.full = s["cold"]
            self.cold.flush()
        nslots = self.hot_slots + self.cold_slots
        self.tree.leaves[:] = 0.0
        self.tree.leaves[:nslots] = arrays["tree_leaves"]
        self.tree.rebuild()
        self._c[...] = arrays["c"]
        self._dead[...] = arrays["dead"] if "dead" in arrays else False
        self.pos, self.full = s["pos"], s["full"]
        self.num_added, self.num_sample_calls = s["num_added"], s["num_sample_calls"]
        self.plan_source = s["plan_source"]
        self._shift, self._plan_norm_max, self._td_max = s["shift"], s["plan_norm_max"], s["td_max"]
        self._rng = s["rng"]
        self.stats = s["stats"]
        self._dirty_hot.clear()
        self._dirty_cold.clear()
        self.num_evicted = int(self._dead[self._valid_slots()].sum())

    # ------------------------------------------------------------------ pickling (SB3 save_replay_buffer)
    def __getstate__(self) -> dict[str, Any]:
        """The state as one checksummed blob, so a corrupt ``save_replay_buffer`` pickle fails to load.

        SB3 pickles the buffer object as it is; the arrays would be raw bytes inside the pickle, where a flipped
        byte changes a stored value silently. Here the real state is pickled on its own and its SHA-256 kept next
        to it; :meth:`__setstate__` checks it before unpickling. (The checksum detects corruption; like any pickle,
        the file must still come from a trusted source.)
        """
        with self._lock:
            self._flush()
            state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_demote_cache")}
            state["plan_fn"] = None  # a bound policy method is not part of the buffer's data
            blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        return {"format": _PICKLE_FORMAT, "sha256": hashlib.sha256(blob).hexdigest(), "state": blob}

    def __setstate__(self, wrapped: dict[str, Any]) -> None:
        if not isinstance(wrapped, dict) or wrapped.get("format") != _PICKLE_FORMAT:
            raise ReplayFileError(
                "this pickled HotColdReplayBuffer is corrupt or not checksummed (no "
                f"{_PICKLE_FORMAT!r} marker); re-save it with save_replay_buffer from this echorl version"
            )
        blob, digest = wrapped.get("state"), wrapped.get("sha256")
        if not isinstance(blob, bytes) or not isinstance(digest, str) or hashlib.sha256(blob).hexdigest() != digest:
            raise ReplayFileError("this pickled HotColdReplayBuffer is corrupt: checksum mismatch")
        state = pickle.loads(blob)
        nslots = state["hot_slots"] + state["cold_slots"]
        state.setdefault("_dead", np.zeros(nslots, dtype=bool))  # pickled before evict() existed
        state.setdefault("num_evicted", 0)
        self.__dict__.update(state)
        self._lock = threading.RLock()
        assert self.cold is None or isinstance(self.cold, ColdStore)
