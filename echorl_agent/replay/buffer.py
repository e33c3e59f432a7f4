"""Hot/cold prioritized replay as an SB3 ``ReplayBuffer`` (EchoRL Eq. 6-7, Algorithm 3).

Sampling distribution (EchoRL Eq. 7) over every stored transition t, hot and cold alike::

    P(t) = softmax_t(beta * score(t)),   score(t) = ||tau_t - tau_bar||^2 + alpha |r_t| + kappa log(|delta_t| + eps)

with tau_bar the EMA of plans (:class:`EMAPlanTracker`).

Exact sampling while tau_bar moves (the design)
-----------------------------------------------
Expanding the square, ``beta * score(t) = c_t - 2 beta tau_t . tau_bar + beta ||tau_bar||^2`` with
``c_t = beta (||tau_t||^2 + alpha |r_t| + kappa log(|delta_t| + eps))``. The last term is the same for every t and cancels in
the softmax, so the logit is ``l_t(tau_bar) = c_t - 2 beta tau_t . tau_bar``: affine in tau_bar.

A sum tree holds ``q_t = exp(l_t(tau_ref) - M)`` for an *anchor* tau_ref (M: a shift for float range). To sample
from the current ``P`` it draws candidates from ``q`` (O(log N) each) and accepts candidate t with probability
``exp(D_t - D_max)``, where ``D_t = l_t(tau_bar) - l_t(tau_ref) = -2 beta tau_t . (tau_bar - tau_ref)`` and
``D_max = 2 beta R ||tau_bar - tau_ref||`` with ``R >= max_t ||tau_t - tau_ref||`` (Cauchy-Schwarz gives
``|D_t| <= D_max`` once the t-independent term ``-2 beta tau_ref . (tau_bar - tau_ref)``, which cancels in P, is
dropped).
Accepted candidates are distributed *exactly* as ``P`` (rejection sampling: ``P / q`` is proportional to
``exp(D_t)``); there is no approximation error, whatever the staleness of the anchor. Staleness only costs time:
each candidate is O(log N + d) and the acceptance rate is ``E_q[exp(D_t - D_max)] >= exp(-2 D_max)``. The tree is
re-anchored at the current tau_bar (one O(N d) pass, chunked over the cold memmap) after a draw whose measured
acceptance fell below ``min_acceptance``, once the candidates rejected since the last anchor exceed
``rejection_budget * N`` (ski-rental amortisation: rejected work is capped by a constant times the re-anchor work, with
a deterministic count so runs stay reproducible), or before a draw whose worst-case guarantee ``exp(-2 D_max)`` is
below 1e-4 -- amortised, because tau_bar is an EMA and moves by at most ``ema_decay * ||tau_new - tau_bar||`` per add.

Importance weights ``(N P(t))^(-beta_is)`` are normalised by the batch maximum, which only needs ratios
``P(t)/P(t') = exp(l_t - l_t')``: the normaliser Z cancels and the weights are exact too. With the optional
``hot_fraction`` mixing, ``P(t) = rho_tier * p_tier(t)`` needs each tier's normaliser ``Z_tier(tau_bar)``; it is
estimated as ``Z_tier(tau_ref) * mean_candidates exp(D)`` (unbiased), whose relative error lies within
``exp(+-D_max)`` and is 0 right after a re-anchor.

Tiers
-----
SB3's arrays (``buffer_size`` transitions, RAM) are the hot tier; a row older than ``age_threshold`` adds is moved
to the cold tier (:class:`ColdStore`, numpy memmaps, ``cold_size`` transitions), whose oldest row is evicted first.
The tree's slots are ``[0, hot_slots)`` for hot and ``[hot_slots, hot_slots + cold_slots)`` for cold transitions.
Leaf updates from ``add`` are deferred and applied in one vectorised pass at the next ``sample`` (``add`` stays
O(1)). All public methods take one re-entrant lock, so ``add`` and ``sample`` may run in different threads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer

from echorl_agent.config import ReplayConfig
from echorl_agent.replay.cold import ColdStore
from echorl_agent.replay.persistence import PersistenceMixin
from echorl_agent.replay.sampler import ExactSamplerMixin
from echorl_agent.replay.sumtree import SumTree
from echorl_agent.replay.tracker import EMAPlanTracker

__all__ = ["HotColdReplayBuffer"]



class HotColdReplayBuffer(PersistenceMixin, ExactSamplerMixin, ReplayBuffer):
    """SB3 replay buffer with a RAM hot tier, a memmap cold tier and exact plan-surprise prioritized sampling.

    Use it unchanged with SB3: ``DQN(..., replay_buffer_class=HotColdReplayBuffer,
    replay_buffer_kwargs={"config": ReplayConfig(cold_size=10**6)})`` (fields of :class:`ReplayConfig` may also be
    passed directly in ``replay_buffer_kwargs``). ``sample`` returns :class:`HotColdReplayBufferSamples` (SB3's
    samples plus ``weights`` and ``indices``); :class:`echorl_agent.EchoDQN` uses the weights and feeds TD errors back
    through :meth:`update_priorities`. See the module docstring for the sampling design and its error bound.

    Args:
        buffer_size: hot-tier capacity in transitions (SB3's meaning; divided by ``n_envs`` into rows).
        observation_space: SB3 observation space (Dict spaces are not supported).
        action_space: SB3 action space.
        device: torch device of the sampled tensors.
        n_envs: number of parallel envs (transitions per ``add``).
        optimize_memory_usage: must be False (the cold tier stores next observations explicitly).
        handle_timeout_termination: as in SB3.
        config: a :class:`ReplayConfig` (or dict); ``**overrides`` replace its fields.
    """

    _demote_cache: tuple | None = None  # (cold store, hot_plans, pairs) of _demote_pairs; never pickled

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        config: ReplayConfig | dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        cfg = ReplayConfig.from_kwargs(config, **overrides)
        if optimize_memory_usage:
            raise ValueError(
                "HotColdReplayBuffer does not support optimize_memory_usage=True (its cold tier stores next "
                "observations explicitly); pass optimize_memory_usage=False"
            )
        if isinstance(observation_space, spaces.Dict):
            raise ValueError(
                "HotColdReplayBuffer needs a Box/Discrete/MultiDiscrete/MultiBinary observation space, got a Dict "
                "space; flatten it with gymnasium.wrappers.FlattenObservation"
            )
        hot_rows = max(buffer_size // n_envs, 1)
        if cfg.age_threshold is not None:
            if cfg.age_threshold + 1 > hot_rows:
                raise ValueError(
                    f"age_threshold must be < buffer_size // n_envs = {hot_rows} (the hot tier holds ages "
                    f"0..age_threshold), got age_threshold={cfg.age_threshold}; raise buffer_size or lower it"
                )
            hot_rows = cfg.age_threshold + 1
        if cfg.cold_size and cfg.cold_size < n_envs:
            raise ValueError(f"cold_size must be 0 or >= n_envs={n_envs}, got cold_size={cfg.cold_size}")
        super().__init__(
            hot_rows * n_envs, observation_space, action_space, device, n_envs=n_envs,
            optimize_memory_usage=False, handle_timeout_termination=handle_timeout_termination,
        )
        self.config = cfg
        self.hot_slots = self.buffer_size * self.n_envs
        self.cold_rows = cfg.cold_size // self.n_envs
        self.cold_slots = self.cold_rows * self.n_envs
        self.tree = SumTree(self.hot_slots + self.cold_slots)
        self._c = np.zeros(self.hot_slots + self.cold_slots, dtype=np.float64)  # tau_bar-free part of the logit
        self._dead = np.zeros(self.hot_slots + self.cold_slots, dtype=bool)  # evicted slots: leaf 0 until rewritten
        self.num_evicted = 0  # stored transitions currently evicted (see evict())
        self._rng = np.random.default_rng(cfg.seed)
        self._lock = threading.RLock()
        self.plan_fn: Callable[[np.ndarray], np.ndarray] | None = None
        self.plan_source: str | None = None if cfg.plan_source == "auto" else cfg.plan_source
        self.plan_dim: int | None = None
        self.hot_plans: np.ndarray | None = None  # [hot_rows, n_envs, d] float32
        self.hot_td = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)
        self.hot_seq = np.full(self.buffer_size, -1, dtype=np.int64)  # add() counter of each hot row
        self.cold: ColdStore | None = None
        self.tracker: EMAPlanTracker | None = None
        self._projection: np.ndarray | None = None
        self._tau_ref: np.ndarray | None = None
        self._shift = 0.0
        self._plan_norm_max = 0.0
        self._td_max = 1.0
        self._dirty_hot: set[int] = set()
        self._dirty_cold: set[int] = set()
        self.num_added = 0  # add() calls so far (ages are measured in these)
        self.num_sample_calls = 0
        self.stats = {"refreshes": 0, "candidates": 0, "accepted": 0}
        self._acceptance = 1.0  # measured acceptance of the last draw
        self._rejected_since_anchor = 0

    # ================================================================== plans
    def _resolve_plan_source(self, infos: list[dict[str, Any]]) -> str:
        if self.plan_source is not None:
            return self.plan_source
        if infos and self.config.plan_key in infos[0]:
            return "info"
        if self.plan_fn is not None:
            return "policy"
        return self.config.plan_fallback

    def _plans_for(self, obs: np.ndarray, infos: list[dict[str, Any]]) -> np.ndarray:
        source = self.plan_source
        if source is None:
            source = self.plan_source = self._resolve_plan_source(infos)
        n = self.n_envs
        if source == "info":
            try:
                plans = np.stack([np.asarray(info[self.config.plan_key], dtype=np.float32).reshape(-1) for info in infos])
            except KeyError as e:
                raise ValueError(
                    f"plan_source='info' but an info dict has no {self.config.plan_key!r} key; set plan_key or use "
                    "plan_source='observation'/'td_error'"
                ) from e
        elif source == "policy":
            if self.plan_fn is None:
                raise ValueError("plan_source='policy' needs buffer.plan_fn (obs [n_envs, ...] -> plans [n_envs, d])")
            plans = np.asarray(self.plan_fn(np.asarray(obs)), dtype=np.float32).reshape(n, -1)
        elif source == "observation":
            flat = np.asarray(obs, dtype=np.float32).reshape(n, -1)
            if self._projection is None and flat.shape[1] > self.config.plan_dim:
                # Fixed Gaussian random projection (Johnson-Lindenstrauss): distances are kept up to 1 +- eps.
                rng = np.random.default_rng(0 if self.config.seed is None else self.config.seed)
                d = self.config.plan_dim
                self._projection = (rng.standard_normal((flat.shape[1], d)) / math.sqrt(d)).astype(np.float32)
            plans = flat @ self._projection if self._projection is not None else flat
        elif source == "none":  # a constant plan: the plan term is the same for every t and cancels
            plans = np.zeros((n, 1), dtype=np.float32)
        else:  # td_error: tau = |delta|, new transitions start at the largest |delta| seen (Schaul et al. 2016)
            plans = np.full((n, 1), self._td_max, dtype=np.float32)
        if self.plan_dim is None:
            self._allocate(plans.shape[1])
        if plans.shape != (n, self.plan_dim):
            raise ValueError(f"plans must have shape (n_envs, d)=({n}, {self.plan_dim}), got {plans.shape}")
        return plans

    def _allocate(self, dim: int) -> None:
        self.plan_dim = int(dim)
        self.hot_plans = np.zeros((self.buffer_size, self.n_envs, dim), dtype=np.float32)
        self.tracker = EMAPlanTracker(dim, self.config.ema_decay)
        if self.cold_rows:
            fields = {
                "observations": (self.obs_shape, self.observations.dtype.str),
                "next_observations": (self.obs_shape, self.next_observations.dtype.str),
                "actions": ((self.action_dim,), self.actions.dtype.str),
                "rewards": ((), "<f4"), "dones": ((), "<f4"), "timeouts": ((), "<f4"),
                "plans": ((dim,), "<f4"), "td": ((), "<f4"), "seq": ((), "<i8"),
            }
            self.cold = ColdStore(self.config.cold_dir, self.cold_rows, self.n_envs, fields)

    # ================================================================== add
    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one transition per env (SB3's signature); the oldest hot row moves to the cold tier first.

        The hot-tier writes are SB3 ``ReplayBuffer.add`` (2.x) inlined, minus its defensive ``np.array`` copies
        (a slice assignment already copies), so the stored values are the same; leaf updates are deferred to the
        next ``sample`` (module docstring).
        """
        with self._lock:
            plans = self._plans_for(obs, infos)
            pos = self.pos
            if self.full and self.cold is not None:
                self._demote(pos)
            elif self.full:  # the row is overwritten: its evicted transitions leave the buffer
                self._forget_dead(pos * self.n_envs)
            n_envs = self.n_envs
            if isinstance(self.observation_space, spaces.Discrete):  # as SB3: (n_envs,) -> (n_envs, 1)
                obs = obs.reshape((n_envs, *self.obs_shape))
                next_obs = next_obs.reshape((n_envs, *self.obs_shape))
            self.observations[pos] = obs
            self.next_observations[pos] = next_obs
            self.actions[pos] = action.reshape((n_envs, self.action_dim))
            self.rewards[pos] = reward
            self.dones[pos] = done
            if self.handle_timeout_termination:
                self.timeouts[pos] = [info.get("TimeLimit.truncated", False) for info in infos]
            self.hot_plans[pos] = plans
            self.hot_td[pos] = self._td_max
            self.hot_seq[pos] = self.num_added
            self.num_added += 1
            self.pos = pos + 1
            if self.pos == self.buffer_size:
                self.full = True
                self.pos = 0
            if self.plan_source not in ("td_error", "none"):
                self.tracker.push(plans)
            self._dirty_hot.add(pos)

    def _demote_pairs(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """(cold array, hot array) per cold field, cached until the cold store or the hot plan array changes."""
        cold, plans = self.cold, self.hot_plans
        cache = self._demote_cache
        if cache is None or cache[0] is not cold or cache[1] is not plans:
            hot = {"observations": self.observations, "next_observations": self.next_observations,
                   "actions": self.actions, "rewards": self.rewards, "dones": self.dones,
                   "timeouts": self.timeouts, "plans": plans, "td": self.hot_td, "seq": self.hot_seq}
            cache = self._demote_cache = (cold, plans, tuple((cold.arrays[k], hot[k]) for k in hot))
        return cache[2]

    def _demote(self, row: int) -> None:
        """Copy hot row ``row`` to the cold ring's write position (evicting the oldest cold row when full)."""
        cold = self.cold
        crow = cold.pos
        for dst, src in self._demote_pairs():
            dst[crow] = src[row]
        n, cslot = self.n_envs, self.hot_slots + crow * self.n_envs
        if cold.full:  # the oldest cold row leaves the buffer
            self._forget_dead(cslot)
        self._dead[cslot : cslot + n] = self._dead[row * n : row * n + n]  # an evicted transition stays evicted
        self._dead[row * n : row * n + n] = False
        cold.pos = crow + 1
        if cold.pos == cold.rows:
            cold.pos, cold.full = 0, True
        self._dirty_cold.add(crow)

    # ================================================================== slots
    def _split(self, slots: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """Slots -> (is_hot mask or None when all are hot, flat hot indices, flat cold indices)."""
        if self.cold is None:
            return None, slots, slots[:0]
        hot = slots < self.hot_slots
        return hot, slots[hot], slots[~hot] - self.hot_slots

    def _field(self, name: str, hot_arr: np.ndarray, slots: np.ndarray, split: tuple | None = None) -> np.ndarray:
        """Field ``name`` of the transitions at ``slots`` (hot part from ``hot_arr``, cold part from the memmap).

        Arrays are ``[rows, n_envs, ...]`` and C-contiguous, so they are read through flat ``[rows * n_envs, ...]``
        views with one ``np.take`` per tier.
        """
        hot, hs, cs = self._split(slots) if split is None else split
        tail = hot_arr.shape[2:]
        hot_flat = hot_arr.reshape(-1, *tail)
        if not len(cs):
            return np.take(hot_flat, hs, axis=0)
        cold_arr = self.cold.arrays[name]
        out = np.empty((len(slots), *tail), dtype=hot_arr.dtype)
        out[hot] = np.take(hot_flat, hs, axis=0)
        out[~hot] = np.take(cold_arr.reshape(-1, *tail), cs, axis=0)
        return out

    def _valid_slots(self) -> np.ndarray:
        hot_rows = self.buffer_size if self.full else self.pos
        parts = [np.arange(hot_rows * self.n_envs)]
        if self.cold is not None:
            parts.append(self.hot_slots + np.arange(self.cold.num_rows * self.n_envs))
        return np.concatenate(parts)

    def _forget_dead(self, slot: int) -> None:
        """The row starting at ``slot`` is about to be overwritten: drop its evicted marks from the count."""
        dead = self._dead[slot : slot + self.n_envs]
        self.num_evicted -= int(dead.sum())
        dead[:] = False

    def _rows_to_slots(self, rows: set[int], base: int) -> np.ndarray:
        r = np.fromiter(rows, dtype=np.int64, count=len(rows))
        r.sort()
        return (base + r[:, None] * self.n_envs + np.arange(self.n_envs)[None, :]).reshape(-1)

    # ================================================================== priorities
    def update_priorities(self, indices: np.ndarray | torch.Tensor, td_errors: np.ndarray | torch.Tensor,
                          rewards: np.ndarray | torch.Tensor | None = None) -> None:
        """Store |TD error| of sampled slots (``samples.indices``); with ``plan_source="td_error"`` it is the plan.

        A slot overwritten since it was sampled gets the value too (as in other prioritized buffers).
        ``rewards`` (optional) also replaces the stored rewards of the |r| term, e.g. re-scored advantages of
        LLM items (:class:`~echorl_agent.replay.llm.LLMReplayBuffer`).
        """
        with self._lock:
            slots = torch.as_tensor(indices).detach().cpu().numpy().astype(np.int64).reshape(-1)
            td = np.abs(torch.as_tensor(td_errors).detach().cpu().numpy().astype(np.float32).reshape(-1))
            if slots.shape != td.shape:
                raise ValueError(f"indices and td_errors must have the same length, got {slots.shape} and {td.shape}")
            if len(slots) and (slots.min() < 0 or slots.max() >= self.hot_slots + self.cold_slots):
                raise ValueError(f"indices must be buffer slots in [0, {self.hot_slots + self.cold_slots}), got {slots}")
            r = None if rewards is None else torch.as_tensor(rewards).detach().cpu().numpy().astype(np.float32).reshape(-1)
            if r is not None and r.shape != slots.shape:
                raise ValueError(f"indices and rewards must have the same length, got {slots.shape} and {r.shape}")
            self._flush()
            slots, first = np.unique(slots[::-1], return_index=True)  # last write wins
            td = td[::-1][first]
            hot, hs, cs = self._split(slots)
            if r is not None:
                r = r[::-1][first]
                self.rewards.reshape(-1)[hs] = r if hot is None else r[hot]
                if len(cs):
                    self.cold.arrays["rewards"].reshape(-1)[cs] = r[~hot]
            self._td_max = max(self._td_max, float(td.max(initial=0.0)))
            td_hot, td_cold = (td, td[:0]) if hot is None else (td[hot], td[~hot])
            self.hot_td.reshape(-1)[hs] = td_hot
            if len(cs):
                self.cold.arrays["td"].reshape(-1)[cs] = td_cold
            if self.plan_source == "td_error":
                self.hot_plans.reshape(-1)[hs] = td_hot
                if len(cs):
                    self.cold.arrays["plans"].reshape(-1)[cs] = td_cold
                self.tracker.push(td[:, None])
            plans = self._field("plans", self.hot_plans, slots).astype(np.float64)
            self._set_leaves(slots, plans, self._field("rewards", self.rewards, slots), td)

    # ================================================================== sizes and lifecycle
    def size(self) -> int:
        """Stored rows (hot + cold), SB3's unit (transitions = rows * n_envs)."""
        hot = self.buffer_size if self.full else self.pos
        return hot + (self.cold.num_rows if self.cold is not None else 0)

    @property
    def num_transitions(self) -> int:
        return self.size() * self.n_envs

    def ages(self, indices: np.ndarray) -> np.ndarray:
        """Age (in ``add`` calls; 0 = newest) of the transitions at buffer slots ``indices``."""
        slots = np.asarray(indices, dtype=np.int64)
        seq = self._field("seq", self.hot_seq[:, None].repeat(self.n_envs, 1), slots)
        return self.num_added - 1 - seq

    def reset(self) -> None:
        with self._lock:
            super().reset()
            self.close()
            self.plan_dim, self.hot_plans, self.tracker, self._tau_ref = None, None, None, None
            self.plan_source = None if self.config.plan_source == "auto" else self.config.plan_source
            self.tree = SumTree(self.hot_slots + self.cold_slots)
            self._c[:] = 0.0
            self._dead[:] = False
            self.num_evicted = 0
            self.hot_seq[:] = -1
            self._dirty_hot.clear()
            self._dirty_cold.clear()
            self.num_added = 0

    def close(self) -> None:
        """Flush and close the cold memmaps (a private temporary folder is deleted)."""
        with self._lock:
            if self.cold is not None:
                self.cold.close()
                self.cold = None
            self._demote_cache = None  # drop the cached views of the closed memmaps
