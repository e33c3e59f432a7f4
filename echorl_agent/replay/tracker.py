"""EMA of plans, the reference point of the plan surprise ``||tau_t - tau_bar||^2`` (EchoRL Eq. 6)."""

from __future__ import annotations

import threading

import numpy as np
import torch

from echorl_agent.kernels.plan import ema_plan_update

__all__ = ["EMAPlanTracker"]


class EMAPlanTracker:
    """Exponential moving average ``tau_bar`` of plan vectors.

    One update with a batch of plans ``tau_1..tau_B`` is ``tau_bar <- (1 - decay) tau_bar + decay * mean_b tau_b``
    (the EMA plan update kernel, :func:`echorl_agent.kernels.ema_plan_update`). The first update initialises
    ``tau_bar`` to the batch mean. :meth:`push` queues batches cheaply (the replay buffer calls it on every ``add``)
    and they are folded in, in order, when ``tau_bar`` is next read, with the closed form
    ``tau_bar_K = (1-decay)^K tau_bar_0 + sum_k decay (1-decay)^(K-k) m_k`` -- the same value as K sequential
    updates up to float64 rounding.

    Args:
        dim: plan dimension d.
        decay: EMA rate in (0, 1].
    """

    def __init__(self, dim: int, decay: float = 0.01) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got dim={dim}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got decay={decay}; e.g. decay=0.01")
        self.dim, self.decay = int(dim), float(decay)
        self._tau = np.zeros(self.dim, dtype=np.float64)
        self.initialized = False
        self.num_updates = 0
        self._pending = np.zeros((64, self.dim), dtype=np.float64)
        self._num_pending = 0
        self._lock = threading.RLock()

    def update(self, plans: np.ndarray | torch.Tensor) -> np.ndarray:
        """Apply one EMA step with the batch ``plans`` ``[B, d]`` (or ``[d]``) now; returns the new ``tau_bar``."""
        with self._lock:
            self._fold()
            p = torch.as_tensor(np.asarray(plans, dtype=np.float64)).reshape(-1, self.dim)
            if not self.initialized:
                self._tau = p.mean(0).numpy().astype(np.float64)
                self.initialized = True
            else:
                self._tau = ema_plan_update(torch.from_numpy(self._tau), p, self.decay).double().numpy()
            self.num_updates += 1
            return self._tau.copy()

    def push(self, plans: np.ndarray) -> None:
        """Queue one batch ``[B, d]`` of plans; folded into ``tau_bar`` at the next read."""
        with self._lock:
            k, pending = self._num_pending, self._pending
            if k == len(pending):
                pending = self._pending = np.concatenate([pending, np.zeros_like(pending)])
            p = np.asarray(plans)
            if p.size == self.dim:  # one plan (the common single-env add): its own batch mean
                pending[k] = p.reshape(-1)
            else:
                p = p.reshape(-1, self.dim)
                np.divide(p.sum(0, dtype=np.float64), len(p), out=pending[k])
            self._num_pending = k + 1

    def _fold(self) -> None:
        k = self._num_pending
        if k == 0:
            return
        means = self._pending[:k]
        start = 0
        if not self.initialized:
            self._tau = means[0].copy()
            self.initialized = True
            start = 1
        m = k - start
        if m:
            keep = 1.0 - self.decay
            # weight of batch j (0-based among the m new ones): decay * keep^(m-1-j)
            w = self.decay * keep ** np.arange(m - 1, -1, -1, dtype=np.float64)
            self._tau = keep**m * self._tau + w @ means[start:]
        self.num_updates += k
        self._num_pending = 0

    @property
    def tau_bar(self) -> np.ndarray:
        """Current EMA plan ``[d]`` (float64 copy)."""
        with self._lock:
            self._fold()
            return self._tau.copy()

    def state_dict(self) -> dict:
        with self._lock:
            self._fold()
            return {"tau_bar": self._tau.copy(), "initialized": self.initialized, "num_updates": self.num_updates,
                    "decay": self.decay, "dim": self.dim}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            if int(state["dim"]) != self.dim:
                raise ValueError(f"state has plan dim {state['dim']}, this tracker has dim={self.dim}")
            self._tau = np.asarray(state["tau_bar"], dtype=np.float64).copy()
            self.initialized = bool(state["initialized"])
            self.num_updates = int(state["num_updates"])
            self.decay = float(state["decay"])
            self._num_pending = 0

    def __getstate__(self) -> dict:
        self._fold()
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
