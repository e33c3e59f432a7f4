"""Hot/cold prioritized replay of LLM transitions (EchoRL Eq. 6-7 on the LM, Algorithm 1's replay).

:class:`LLMReplayBuffer` keeps :class:`~echorl_agent.replay.llm_items.LLMTransition` items and samples them with
the SB3 buffer's own machinery: an inner :class:`~echorl_agent.replay.buffer.HotColdReplayBuffer` (one slot per
item, ``n_envs=1``) holds each item's priority fields, its age tiers and the exact sum-tree sampler, so both
buffers share one sampler, one priority update and one checksummed file format. Per item the inner buffer stores

* ``r_t`` = the item's advantage (the ``alpha |r_t|`` term: high-|advantage| items are hot),
* ``|delta_t|`` = ``|ret - value|`` (the critic's TD/GAE error), or ``|advantage|`` for critic-free items
  (GRPO/GiGPO), replaced by :meth:`LLMReplayBuffer.update_priorities` after a learner pass,
* ``tau_t`` = the item's ``plan`` when every item carries one (the surprise term ``||tau_t - tau_bar||^2``),

so ``P(t) = softmax(beta * (||tau_t - tau_bar||^2 + alpha |A_t| + td_weight log(|delta_t| + td_eps)))`` (Eq. 7).
The newest ``capacity`` items form the hot tier (RAM), older ones the cold tier (``cold_size``, memmapped priority
fields); ``hot_fraction`` fixes the hot share of each batch.

What is expensive to rebuild is kept while memory allows: an item's captured activations entering the first
trained layer (``context_states``, ``cand_states``) make a replayed update a learner pass instead of a rollout.
Beyond ``replay_memory_mb`` the oldest items' activations are dropped (token ids kept) and the caller's
``recompute`` rebuilds them -- exactly, since the layers below the trained ones are frozen -- when such an item
is sampled. Items older than ``max_staleness`` weight versions are evicted, or re-scored by ``rescore``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from echorl_agent.config import ReplayConfig
from echorl_agent.replay.buffer import HotColdReplayBuffer
from echorl_agent.replay.llm_items import LLMTransition
from echorl_agent.replay.llm_persistence import COUNTERS, LLMPersistenceMixin

__all__ = ["LLMReplayBuffer", "LLMReplaySample", "LLMTransition", "Recompute", "Rescore", "critic_free_priority",
           "off_policy_ratio", "mix_batch"]

Recompute = Callable[[LLMTransition], tuple[torch.Tensor, list[torch.Tensor]]]
"""``item -> (context_states [len(context), hidden], [cand_states [len(cand_i) - 1, hidden] ...])`` from the frozen
layers."""
Rescore = Callable[[list[LLMTransition]], list[LLMTransition]]
"""Stale items -> the same items re-scored under the current weights (new ``rollout_logp``/``value``/``advantage``/
``ret`` and ``version``)."""

LLM_REPLAY_DEFAULTS: dict[str, Any] = {"plan_source": "auto", "plan_fallback": "none", "alpha": 0.5, "td_weight": 0.6}
"""ReplayConfig fields the LLM buffer sets unless given: the plan term only when items carry plans, and an
advantage term plus a PER-like TD term (``P ~ exp(0.5 beta |A|) (|delta| + eps)^(0.6 beta)``)."""

_OBS = spaces.Box(-1.0, 1.0, (1,), np.float32)  # the inner buffer's observations are unused (all zero)
_ACT = spaces.Discrete(2)
_ZERO_OBS = np.zeros((1, 1), np.float32)
_ZERO_ACT = np.zeros((1, 1), np.int64)
_NOT_DONE = np.zeros(1, np.float32)


class LLMReplaySample(NamedTuple):
    """A replayed batch: ``items`` (activations present, or recomputed when ``recompute`` is set), ``weights``
    ``[B]`` float32 importance weights ``(N P)^(-beta_is)`` normalised to batch max 1, ``indices`` ``[B]`` int64
    slots for :meth:`LLMReplayBuffer.update_priorities`."""

    items: list[LLMTransition]
    weights: torch.Tensor
    indices: np.ndarray


def off_policy_ratio(learner_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                     truncation: float | None = 1.0) -> torch.Tensor:
    """Per-sample ``min(pi_theta(a|s) / pi_behaviour(a|s), truncation)`` from log-probs of the taken actions.

    For a replayed item ``behaviour_logp`` is ``item.rollout_logp[item.action]`` (the weights that sampled it);
    for an on-policy item the two are the same distribution and the ratio is 1. ``truncation=None`` leaves it
    untruncated (Retrace/V-trace-style truncation at 1 is the default).
    """
    ratio = torch.exp(learner_logp - behaviour_logp)
    return ratio if truncation is None else ratio.clamp(max=truncation)


def critic_free_priority(learner_logp: torch.Tensor, behaviour_logp: torch.Tensor, advantage: torch.Tensor,
                         truncation: float | None = 1.0) -> torch.Tensor:
    """The ``|delta|`` of a replayed critic-free (GRPO/GiGPO) item after a learner pass: how much it still teaches.

    ``|A| * min(pi_theta(a|s) / mu(a|s), C) * (1 - pi_theta(a|s))`` -- the magnitude of the gradient of the item's
    importance-weighted surrogate ``w * A * pi_theta(a|s) / pi_old(a|s)`` with respect to the taken action's logit,
    at ``pi_old = pi_theta``. It falls to 0 once the policy has taken the lesson in: a good action (A > 0) whose
    probability reached 1, or a bad one (A < 0) whose probability fell to 0 (the truncated ratio goes to 0). There is
    no critic to give a TD error, and ``|A|`` alone never changes, so without this a learned item stays hot forever.
    All arguments are per item ``[n]``: log-probs of the taken action under the learner and the behaviour policy.
    """
    p = learner_logp.exp()
    return advantage.abs() * off_policy_ratio(learner_logp, behaviour_logp, truncation) * (1 - p)


def mix_batch(fresh: list[LLMTransition], replayed: LLMReplaySample) -> tuple[list[LLMTransition], torch.Tensor,
                                                                               torch.Tensor]:
    """One learner batch of fresh (on-policy) and replayed items: ``(items, weights [B], is_replay [B] bool)``.

    Fresh items were sampled by the current weights, not drawn from the buffer, so their weight is exactly 1;
    replayed items keep their prioritized-replay weights (multiply by :func:`off_policy_ratio` in the loss).
    """
    weights = torch.cat([torch.ones(len(fresh), dtype=torch.float32), replayed.weights.float()])
    is_replay = torch.cat([torch.zeros(len(fresh), dtype=torch.bool), torch.ones(len(replayed.items), dtype=torch.bool)])
    return list(fresh) + list(replayed.items), weights, is_replay


class LLMReplayBuffer(LLMPersistenceMixin):
    """Prioritized hot/cold replay of LLM transitions with an activation memory budget (module docstring).

    Args:
        capacity: items in the hot tier (the newest ones).
        cold_size: items in the cold tier (older ones, priority fields memmapped; token ids stay in RAM); None
            takes ``config.cold_size`` (default 0).
        replay_memory_mb: budget (10^6 bytes) for the kept items: token ids + small tensors + activations. Over it,
            the oldest items' activations are dropped first, then the oldest items. None: no budget.
        max_staleness: evict (or ``rescore``) items whose ``version`` is older than ``current - max_staleness``
            at :meth:`set_version`. None: never.
        recompute: rebuilds a sampled item's dropped activations (see :data:`Recompute`); None serves such items
            without activations (the learner then recomputes the frozen layers itself).
        rescore: re-scores stale items instead of evicting them (see :data:`Rescore`).
        config: a :class:`ReplayConfig` (or dict) for the sampler; ``**overrides`` replace its fields, and
            :data:`LLM_REPLAY_DEFAULTS` fill the fields neither sets.
    """

    def __init__(self, capacity: int, *, cold_size: int | None = None, replay_memory_mb: float | None = None,
                 max_staleness: int | None = None, recompute: Recompute | None = None,
                 rescore: Rescore | None = None, config: ReplayConfig | dict[str, Any] | None = None,
                 **overrides: Any) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got capacity={capacity!r}; e.g. capacity=4096")
        if replay_memory_mb is not None and not (isinstance(replay_memory_mb, (int, float)) and replay_memory_mb > 0):
            raise ValueError(f"replay_memory_mb must be None or > 0, got replay_memory_mb={replay_memory_mb!r}")
        if max_staleness is not None and (isinstance(max_staleness, bool) or not isinstance(max_staleness, int)
                                          or max_staleness < 0):
            raise ValueError(f"max_staleness must be None or an int >= 0, got max_staleness={max_staleness!r}")
        if config is None or isinstance(config, dict):  # the LLM defaults fill what a dict (or nothing) leaves out
            config = {**LLM_REPLAY_DEFAULTS, **(config or {})}
        if cold_size is not None:
            overrides["cold_size"] = cold_size
        cfg = ReplayConfig.from_kwargs(config, **overrides)
        self.index = HotColdReplayBuffer(capacity, _OBS, _ACT, device="cpu", n_envs=1,
                                         handle_timeout_termination=False, config=cfg)
        self.replay_memory_mb = replay_memory_mb
        self.max_staleness = max_staleness
        self.recompute = recompute
        self.rescore = rescore
        self.version = 0
        """The current weight version (:meth:`set_version`); items of this version are on-policy."""
        self._items: OrderedDict[int, LLMTransition] = OrderedDict()  # add counter (seq) -> item, oldest first
        self._with_acts: OrderedDict[int, None] = OrderedDict()  # seqs whose item keeps activations, oldest first
        self._token_bytes = 0
        self._act_bytes = 0
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.RLock()

    # ================================================================== slots
    def __len__(self) -> int:
        return len(self._items)

    def _slot(self, seq: int) -> int | None:
        """Inner-buffer slot of the item added as number ``seq`` (hot ring, then cold ring), None once it left."""
        h, c, n = self.index.buffer_size, self.index.cold_rows, self.index.num_added
        if seq >= n - h:
            return seq % h
        if c and seq >= n - h - c:
            return h + seq % c
        return None

    def _seqs(self, slots: np.ndarray) -> np.ndarray:
        return self.index.num_added - 1 - self.index.ages(slots)

    @property
    def budget_bytes(self) -> float:
        return math.inf if self.replay_memory_mb is None else self.replay_memory_mb * 1e6

    # ================================================================== add
    def add(self, items: Iterable[LLMTransition]) -> None:
        """Store items (validated first, all or none); the oldest leave when the rings are full or the budget is hit.

        Raises:
            ValueError: an invalid item (the message names the field), an item whose token-only size exceeds
                ``replay_memory_mb``, or a ``plan`` given for some items but not others.
        """
        items = list(items)
        with self._lock:
            for it in items:
                it.validate()
                if it.token_nbytes > self.budget_bytes:
                    raise ValueError(
                        f"replay_memory_mb={self.replay_memory_mb} is below one item's token-only size "
                        f"({it.token_nbytes / 1e6:.6f} MB: {len(it.context)} context + "
                        f"{sum(len(c) for c in it.cands)} candidate token ids and its log-probs); raise "
                        f"replay_memory_mb to at least {it.token_nbytes / 1e6:.6f}, or use replay_memory_mb=None")
            source = self.index.plan_source
            has_plan = {it.plan is not None for it in items}
            if len(has_plan) > 1 or (source is not None and has_plan and has_plan != {source == "info"}):
                raise ValueError("plan must be given for every item or for none (the priority's plan term needs "
                                 f"tau_t for all items); this buffer's plan_source={source!r}")
            seqs = []
            for it in items:
                seq = self.index.num_added
                infos = [{} if it.plan is None else {self.index.config.plan_key: it.plan.detach().float().cpu().numpy()}]
                self.index.add(_ZERO_OBS, _ZERO_OBS, _ZERO_ACT, np.array([it.advantage], np.float32), _NOT_DONE, infos)
                self._store(seq, it)
                seqs.append(seq)
                self._forget_left()
            live = [s for s in seqs if s in self._items]
            if live:
                self.index.update_priorities(np.array([self._slot(s) for s in live]),
                                             np.array([self._td(self._items[s]) for s in live]))
            self._enforce_budget()

    @staticmethod
    def _td(it: LLMTransition) -> float:
        return abs(it.ret - it.value) if it.value is not None else abs(it.advantage)

    def _store(self, seq: int, it: LLMTransition) -> None:
        self._items[seq] = it
        self._token_bytes += it.token_nbytes
        if it.context_states is not None:
            self._act_bytes += it.activation_nbytes
            self._with_acts[seq] = None

    def _pop(self, seq: int) -> LLMTransition:
        it = self._items.pop(seq)
        self._token_bytes -= it.token_nbytes
        if seq in self._with_acts:
            del self._with_acts[seq]
            self._act_bytes -= it.activation_nbytes
        return it

    def _replace(self, seq: int, it: LLMTransition) -> None:
        """Swap the payload of ``seq`` in place (the oldest-first order of ``_items`` is kept)."""
        old = self._items[seq]
        self._token_bytes += it.token_nbytes - old.token_nbytes
        self._act_bytes += it.activation_nbytes - old.activation_nbytes
        self._items[seq] = it
        if it.context_states is None:
            self._with_acts.pop(seq, None)
        elif seq not in self._with_acts:  # keep the oldest-first order of the activation list
            self._with_acts[seq] = None
            for later in [s for s in self._with_acts if s > seq]:
                self._with_acts.move_to_end(later)

    def _forget_left(self) -> None:
        """Drop the payload of items the inner rings have overwritten (they are no longer sampleable)."""
        cutoff = self.index.num_added - self.index.buffer_size - self.index.cold_rows
        while self._items and next(iter(self._items)) < cutoff:
            self._pop(next(iter(self._items)))

    def _remove(self, seqs: list[int]) -> None:
        slots = [self._slot(s) for s in seqs]
        for s in seqs:
            self._pop(s)
        self.index.evict(np.array([s for s in slots if s is not None], dtype=np.int64))

    def _enforce_budget(self) -> None:
        """Drop the oldest items' activations until the budget holds, then (token ids alone too big) the oldest items."""
        budget = self.budget_bytes
        while self._token_bytes + self._act_bytes > budget and self._with_acts:
            seq = next(iter(self._with_acts))
            self._replace(seq, self._items[seq].without_activations())
            self._counts["activations_dropped"] += 1
        over, total = [], self._token_bytes + self._act_bytes
        for seq, it in self._items.items():
            if total <= budget:
                break
            over.append(seq)
            total -= it.token_nbytes
        if over:
            self._remove(over)
            self._counts["evicted_budget"] += len(over)

    # ================================================================== sample and priorities
    def sample(self, n: int, rng: np.random.Generator | None = None) -> LLMReplaySample:
        """Draw ``n`` items exactly from ``P`` (module docstring), with importance weights and slots.

        Items whose activations were dropped are returned with activations rebuilt by ``recompute`` (the stored
        item stays token-only); ``rng`` (default: the buffer's own generator) drives the draw.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got n={n!r}")
        with self._lock:
            if not self._items:
                raise ValueError("cannot sample from an empty LLMReplayBuffer; add() items first")
            own = self.index._rng
            if rng is not None:
                self.index._rng = rng
            try:
                batch = self.index.sample(n)
            finally:
                self.index._rng = own
            slots = batch.indices.numpy()
            items = []
            for seq in self._seqs(slots).tolist():
                it = self._items[seq]  # evicted slots have probability 0, so every sampled slot holds an item
                if it.context_states is not None:
                    self._counts["hits"] += 1
                else:
                    self._counts["misses"] += 1
                    if self.recompute is not None:
                        ctx, cands = self.recompute(it)
                        it = dataclasses.replace(it, context_states=ctx, cand_states=list(cands))
                        it.validate()  # a recompute of the wrong shapes is named here, not deep in the learner
                        self._counts["recomputed"] += 1
                items.append(it)
            return LLMReplaySample(items, batch.weights.reshape(-1).float(), slots)

    def update_priorities(self, indices: np.ndarray | torch.Tensor, values: np.ndarray | torch.Tensor,
                          advantages: np.ndarray | torch.Tensor | None = None) -> None:
        """Store new ``|delta|`` (TD errors, or |advantages| for critic-free learners) for sampled ``indices``;
        ``advantages`` also replaces the items' advantage term."""
        with self._lock:
            self.index.update_priorities(indices, values, rewards=advantages)
            if advantages is not None:
                adv = torch.as_tensor(advantages).detach().cpu().reshape(-1).tolist()
                for seq, a in zip(self._seqs(np.asarray(indices).reshape(-1)).tolist(), adv, strict=True):
                    if seq in self._items:
                        self._replace(seq, dataclasses.replace(self._items[seq], advantage=float(a)))

    def probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, P)`` of the current sampling distribution over the stored items (the exact reference)."""
        with self._lock:
            return self.index.probabilities()

    # ================================================================== staleness
    def set_version(self, version: int) -> int:
        """Record the current weight version; with ``max_staleness``, evict or re-score items older than
        ``version - max_staleness``. Returns how many items were evicted or re-scored."""
        with self._lock:
            self.version = int(version)
            if self.max_staleness is None:
                return 0
            oldest = self.version - self.max_staleness
            stale = [seq for seq, it in self._items.items() if it.version < oldest]
            if not stale:
                return 0
            if self.rescore is None:
                self._remove(stale)
                self._counts["evicted_stale"] += len(stale)
                return len(stale)
            old = [self._items[s] for s in stale]
            new = list(self.rescore(old))
            if len(new) != len(old):
                raise ValueError(f"rescore must return one item per stale item, got {len(new)} for {len(old)}")
            for seq, before, it in zip(stale, old, new, strict=True):
                it.validate()
                if it.version < oldest:
                    raise ValueError(f"rescore must return items of version >= {oldest}, got version={it.version}")
                if it.context_states is None and before.context_states is not None:
                    # the frozen layers did not change: the captured activations are still exact
                    it = dataclasses.replace(it, context_states=before.context_states, cand_states=before.cand_states)
                self._replace(seq, it)
            self.index.update_priorities(np.array([self._slot(s) for s in stale]),
                                         np.array([self._td(it) for it in new]),
                                         rewards=np.array([it.advantage for it in new], np.float32))
            self._counts["rescored"] += len(stale)
            self._enforce_budget()
            return len(stale)

    # ================================================================== stats
    def stats(self) -> dict[str, float]:
        """Memory (MB = 10^6 bytes, total and per 1,000 items), activation hit rate and eviction counters.

        ``hit_rate`` = replayed samples served with kept activations / all replayed samples (the rest were
        recomputed, or served token-only without ``recompute``); NaN before the first sample.
        """
        with self._lock:
            n, mem = len(self._items), self._token_bytes + self._act_bytes
            replayed = self._counts["hits"] + self._counts["misses"]
            return {
                "items": n, "items_with_activations": len(self._with_acts), "memory_mb": mem / 1e6,
                "token_mb": self._token_bytes / 1e6, "activation_mb": self._act_bytes / 1e6,
                "mb_per_1000": mem / 1e6 / n * 1000 if n else 0.0,
                "replayed": replayed, "hit_rate": self._counts["hits"] / replayed if replayed else math.nan,
                **self._counts,
            }

    def close(self) -> None:
        """Close the inner buffer's cold memmaps (a private temporary folder is deleted)."""
        self.index.close()
