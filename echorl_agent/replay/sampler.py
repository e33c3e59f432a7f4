"""Exact prioritized sampling of the hot/cold replay: anchored sum tree + rejection (see ``buffer`` module doc).

:class:`ExactSamplerMixin` holds the tree maintenance (deferred leaf updates, re-anchoring), eviction, ``sample``
and the exact reference ``probabilities``; it is
mixed into :class:`echorl_agent.replay.buffer.HotColdReplayBuffer` and uses its storage helpers (``_field``,
``_rows_to_slots``, ``_split``) and state (``tree``, ``_c``, ``tracker``, ``config``, ...).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecNormalize

from echorl_agent.replay.samples import HotColdReplayBufferSamples

__all__ = ["ExactSamplerMixin"]

_SHIFT_HEADROOM = 50.0  # re-shift when a new logit exceeds M + 50 (exp stays far from float64 overflow)
_MIN_GUARANTEE = 1e-4  # re-anchor before drawing when even the worst-case acceptance exp(-2 D_max) is below this
_MASS_FLOOR = 1e-200  # ... or when the total mass nears float64 underflow (the largest logit fell ~460 below M)
_REFRESH_CHUNK = 1 << 16


class ExactSamplerMixin:
    """Sum-tree maintenance, eviction and exact softmax(beta * score) sampling with importance weights."""

    # ================================================================== tree maintenance
    def _constant_logit(self, plans: np.ndarray, rewards: np.ndarray, td: np.ndarray) -> np.ndarray:
        cfg = self.config
        sq = np.einsum("ij,ij->i", plans, plans, dtype=np.float64)
        score = sq + cfg.alpha * np.abs(rewards.astype(np.float64))
        if cfg.td_weight:
            score += cfg.td_weight * np.log(td.astype(np.float64) + cfg.td_eps)
        return cfg.beta * score

    def _current_tau(self) -> np.ndarray | None:
        """tau_bar after folding queued EMA steps, or None before the first plan reached the tracker."""
        if self.tracker is None:
            return None
        tau = self.tracker.tau_bar
        return tau if self.tracker.initialized else None

    def _set_leaves(self, slots: np.ndarray, plans: np.ndarray, rewards: np.ndarray, td: np.ndarray) -> None:
        """Recompute c_t and the anchored leaf of ``slots`` from their stored fields."""
        c = self._constant_logit(plans, rewards, td)
        self._c[slots] = c
        if self._tau_ref is None:
            self._reanchor()
            return
        centred = plans - self._tau_ref
        radius = float(np.sqrt(np.einsum("ij,ij->i", centred, centred).max(initial=0.0)))
        self._plan_norm_max = max(self._plan_norm_max, radius)
        logit = c - 2.0 * self.config.beta * (plans.astype(np.float64) @ self._tau_ref)
        logit[self._dead[slots]] = -np.inf
        top = float(logit.max(initial=-np.inf))
        if top > self._shift + _SHIFT_HEADROOM or self.tree.total <= _MASS_FLOOR:
            self._reanchor()
            return
        self.tree.set(slots, np.exp(logit - self._shift))

    def _flush(self) -> None:
        """Apply the deferred leaf updates of ``add`` (one vectorised pass over the dirty rows of both tiers)."""
        if not (self._dirty_hot or self._dirty_cold):
            return
        slots = np.concatenate([self._rows_to_slots(self._dirty_hot, 0),
                                self._rows_to_slots(self._dirty_cold, self.hot_slots)])
        self._dirty_hot.clear()
        self._dirty_cold.clear()
        plans = self._field("plans", self.hot_plans, slots).astype(np.float64)
        rewards = self._field("rewards", self.rewards, slots)
        td = self._field("td", self.hot_td, slots)
        self._set_leaves(slots, plans, rewards, td)

    def _reanchor(self) -> None:
        """Re-anchor the tree at the current tau_bar: one chunked O(N d) pass over hot and cold plans."""
        tau = self._current_tau()
        if tau is None:
            tau = np.zeros(self.plan_dim or 1, dtype=np.float64)
        self._tau_ref = tau
        leaves = self.tree.leaves
        leaves[:] = -np.inf
        two_beta = 2.0 * self.config.beta
        d = self.plan_dim or 1
        norm_max = 0.0
        # Contiguous slot ranges: hot rows [0, filled) in RAM, cold rows [0, num_rows) in the memmap (chunked).
        ranges = [(0, self.hot_plans, (self.buffer_size if self.full else self.pos) * self.n_envs)]
        if self.cold is not None:
            ranges.append((self.hot_slots, self.cold.arrays["plans"], self.cold.num_rows * self.n_envs))
        for base, arr, count in ranges:
            if arr is None:
                continue
            flat = arr.reshape(-1, d)
            for i in range(0, count, _REFRESH_CHUNK):
                j = min(count, i + _REFRESH_CHUNK)
                plans = flat[i:j].astype(np.float64)
                proj = plans @ tau
                leaves[base + i : base + j] = self._c[base + i : base + j] - two_beta * proj
                # ||tau_t - tau||^2 = ||tau_t||^2 - 2 tau_t . tau + ||tau||^2, reusing the projection
                sq = np.einsum("ij,ij->i", plans, plans) - 2.0 * proj
                norm_max = max(norm_max, float(np.sqrt(max(float(sq.max(initial=-tau @ tau)) + tau @ tau, 0.0))))
        self._plan_norm_max = norm_max
        leaves[: len(self._dead)][self._dead] = -np.inf
        top = float(leaves.max())
        self._shift = top if np.isfinite(top) else 0.0  # 0 when nothing is stored or every transition is evicted
        np.subtract(leaves, self._shift, out=leaves)
        np.exp(leaves, out=leaves)
        self.tree.rebuild()
        self.stats["refreshes"] += 1
        self._acceptance = 1.0
        self._rejected_since_anchor = 0

    # ================================================================== eviction
    def _is_stored(self, slots: np.ndarray) -> np.ndarray:
        """Mask of the slots that hold a transition (hot rows written so far, cold rows of the ring)."""
        hot_filled = (self.buffer_size if self.full else self.pos) * self.n_envs
        cold_filled = self.cold.num_rows * self.n_envs if self.cold is not None else 0
        return (slots < hot_filled) | ((slots >= self.hot_slots) & (slots < self.hot_slots + cold_filled))

    def evict(self, indices: np.ndarray | torch.Tensor) -> int:
        """Stop sampling the transitions at ``indices`` (their leaf becomes 0) until new transitions overwrite them.

        Their data stays in place (the rings still advance in order); ``update_priorities`` leaves them evicted.
        Used by :class:`~echorl_agent.replay.llm.LLMReplayBuffer` for stale items. Returns how many stored,
        not yet evicted transitions were evicted.
        """
        with self._lock:
            slots = np.unique(torch.as_tensor(indices).detach().cpu().numpy().astype(np.int64).reshape(-1))
            if len(slots) and (slots.min() < 0 or slots.max() >= self.hot_slots + self.cold_slots):
                raise ValueError(f"indices must be buffer slots in [0, {self.hot_slots + self.cold_slots}), got {slots}")
            self._flush()
            slots = slots[self._is_stored(slots) & ~self._dead[slots]]
            self._dead[slots] = True
            self.num_evicted += len(slots)
            self.tree.set(slots, np.zeros(len(slots)))
            return len(slots)

    # ================================================================== sampling
    @property
    def beta_is(self) -> float:
        """Current importance-sampling exponent (annealed linearly over ``beta_is_anneal_samples`` samples)."""
        cfg = self.config
        frac = min(1.0, self.num_sample_calls / cfg.beta_is_anneal_samples)
        return cfg.beta_is + frac * (cfg.beta_is_final - cfg.beta_is)

    def _plan_offset(self) -> tuple[np.ndarray, float]:
        """(tau_bar - tau_ref, D_max); re-anchors first when the acceptance guarantee exp(-2 D_max) is too low."""
        tau = self._current_tau()
        if tau is None or self._tau_ref is None:
            if self.tree.total <= _MASS_FLOOR:
                self._reanchor()
            return np.zeros(self.plan_dim or 1), 0.0
        delta = tau - self._tau_ref
        d_max = 2.0 * self.config.beta * self._plan_norm_max * float(np.linalg.norm(delta))
        if math.exp(-2.0 * d_max) < _MIN_GUARANTEE or self.tree.total <= _MASS_FLOOR:
            self._reanchor()
            return np.zeros_like(delta), 0.0
        return delta, d_max

    def _draw(
        self, n: int, lo: float, hi: float, slot_lo: int, slot_hi: int, delta: np.ndarray, d_max: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Draw ``n`` exact samples from P restricted to the mass range [lo, hi) (slots [slot_lo, slot_hi)).

        Returns slots, log q (anchored log-leaf), D (logit offset to the current tau_bar) and the mean of exp(D)
        over all candidates (the unbiased estimate of Z(tau_bar) / Z(tau_ref) for the range).
        """
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), 1.0
        out_s, out_q, out_d = [], [], []
        need, cand, n_acc, sum_exp = n, 0, 0, 0.0
        leaves = self.tree.leaves
        moving = d_max > 0.0
        while need > 0:
            m = need if not moving else int(need * 1.2 / max(self._acceptance, 0.01)) + 8
            u = lo + self._rng.random(m) * (hi - lo)
            s = self.tree.find(u)
            s = np.minimum(s, len(leaves) - 1)
            q = leaves[s]
            ok = (q > 0.0) & (s >= slot_lo) & (s < slot_hi)
            s, q = s[ok], q[ok]
            if moving:
                plans = self._field("plans", self.hot_plans, s).astype(np.float64)
                d = -2.0 * self.config.beta * ((plans - self._tau_ref) @ delta)
                accept = self._rng.random(len(s)) < np.exp(d - d_max)
                cand += len(s)
                n_acc += int(accept.sum())
                sum_exp += float(np.exp(d).sum())
                s, q, d = s[accept], q[accept], d[accept]
            else:
                d = np.zeros(len(s))
                cand += len(s)
                n_acc += len(s)
                sum_exp += float(len(s))
            take = min(need, len(s))
            out_s.append(s[:take])
            out_q.append(np.log(q[:take]))
            out_d.append(d[:take])
            need -= take
        self.stats["candidates"] += cand
        self.stats["accepted"] += n_acc
        self._acceptance = n_acc / max(cand, 1)
        self._rejected_since_anchor += cand - n_acc
        return np.concatenate(out_s), np.concatenate(out_q), np.concatenate(out_d), sum_exp / max(cand, 1)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> HotColdReplayBufferSamples:
        """Sample ``batch_size`` transitions from P(t) = softmax(beta * score(t)), with IS weights and slots."""
        with self._lock:
            if self.size() == 0:
                raise ValueError("cannot sample from an empty HotColdReplayBuffer; add() transitions first")
            if self.num_evicted >= self.num_transitions:
                raise ValueError("cannot sample: every stored transition is evicted; add() transitions first")
            self._flush()
            delta, d_max = self._plan_offset()
            total = self.tree.total
            rho = self.config.hot_fraction
            hot_mass = self.tree.prefix(self.hot_slots) if (rho is not None and self.cold is not None) else total
            cold_mass = total - hot_mass
            if rho is None or cold_mass <= 0.0 or hot_mass <= 0.0:
                slots, logq, d, _ = self._draw(batch_size, 0.0, total, 0, self.hot_slots + self.cold_slots, delta, d_max)
                logp = logq + d
            else:
                n_hot = int(self._rng.binomial(batch_size, rho))
                hs, hq, hd, hz = self._draw(n_hot, 0.0, hot_mass, 0, self.hot_slots, delta, d_max)
                cs, cq, cd, cz = self._draw(batch_size - n_hot, hot_mass, total, self.hot_slots,
                                            self.hot_slots + self.cold_slots, delta, d_max)
                # log P = log rho_tier + l_t - log Z_tier, with Z_tier(tau_bar) ~= mass_tier * mean exp(D)
                slots = np.concatenate([hs, cs])
                logp = np.concatenate([
                    math.log(max(rho, 1e-300)) + hq + hd - math.log(hot_mass * hz),
                    math.log(max(1.0 - rho, 1e-300)) + cq + cd - math.log(cold_mass * cz),
                ])
            weights = np.exp(-self.beta_is * (logp - logp.min()))
            self.num_sample_calls += 1
            budget = self.config.rejection_budget * self.num_transitions
            if self._acceptance < self.config.min_acceptance or self._rejected_since_anchor > budget:
                self._reanchor()  # the next draw starts from a fresh anchor (this batch is exact either way)
            return self._get_samples(slots, env=env, weights=weights)

    def probabilities(self, indices: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact ``(slots, P(slot))`` of the current sampling distribution, from the stored fields (O(N d)).

        The reference that :meth:`sample` draws from exactly: ``P = softmax(beta * score)`` over the live stored
        transitions (EchoRL Eq. 7), or with ``hot_fraction`` ``rho`` times the softmax within the hot tier and
        ``1 - rho`` times the one within the cold tier. ``indices`` (default: every stored slot) selects the rows.
        """
        with self._lock:
            self._flush()
            slots = self._valid_slots()
            plans = self._field("plans", self.hot_plans, slots).astype(np.float64)
            tau = self._current_tau()
            logit = self._c[slots] - (0.0 if tau is None else 2.0 * self.config.beta * (plans @ tau))
            logit[self._dead[slots]] = -np.inf
            probs = np.zeros(len(slots))
            hot = slots < self.hot_slots
            rho = self.config.hot_fraction
            parts = [(np.ones(len(slots), bool), 1.0)]
            if rho is not None and np.isfinite(logit[hot]).any() and np.isfinite(logit[~hot]).any():
                parts = [(hot, rho), (~hot, 1.0 - rho)]
            for mask, share in parts:
                e = np.exp(logit[mask] - logit[mask].max())
                probs[mask] = share * e / e.sum()
            if indices is None:
                return slots, probs
            want = np.asarray(indices, dtype=np.int64).reshape(-1)
            pos = np.searchsorted(slots, want)
            if (pos >= len(slots)).any() or (slots[np.minimum(pos, len(slots) - 1)] != want).any():
                raise ValueError(f"indices must be stored slots, got {want}")
            return want, probs[pos]

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None, weights: np.ndarray | None = None
    ) -> HotColdReplayBufferSamples:
        slots = np.asarray(batch_inds, dtype=np.int64)
        sp = self._split(slots)
        obs = self._field("observations", self.observations, slots, sp)
        next_obs = self._field("next_observations", self.next_observations, slots, sp)
        dones = self._field("dones", self.dones, slots, sp) * (1.0 - self._field("timeouts", self.timeouts, slots, sp))
        data = (
            self._normalize_obs(obs, env),
            self._field("actions", self.actions, slots, sp),
            self._normalize_obs(next_obs, env),
            dones.reshape(-1, 1),
            self._normalize_reward(self._field("rewards", self.rewards, slots, sp).reshape(-1, 1), env),
        )
        w = np.ones(len(slots), dtype=np.float32) if weights is None else weights.astype(np.float32)
        # every array here was freshly gathered, so sharing its memory (SB3's to_torch copies) is safe
        to_torch = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        return HotColdReplayBufferSamples(
            *tuple(map(to_torch, data)), None, to_torch(w.reshape(-1, 1)), to_torch(slots),
        )
