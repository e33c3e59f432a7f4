"""Hot/cold replay of LLM transitions for the PPO learner (``echorl`` with ``echorl_learner="ppo"``; EchoRL
Algorithm 1's buffer, Eq. 6-7).

:class:`PPOReplay` joins :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` and
:class:`~echorl_agent.replay.llm.LLMReplayBuffer`. One update (``EchoPPO.train``) goes:

1. :meth:`PPOReplay.begin` -- the rollout's transitions (token ids, captured activations, plan window, behaviour
   distribution ``mu``, GAE advantage, return, value) are built from the rollout buffer; ``round(replay_ratio * n)``
   items are drawn from the buffer (items of earlier rollouts only: this rollout's go in at the end), and
   :func:`~echorl_agent.replay.llm.mix_batch` gives the weights of the mixed batch: exactly 1 for the fresh
   (on-policy) items, the prioritized-replay weight ``(N P)^(-beta_is)`` for replayed ones. A replayed item's weight
   is then multiplied by the truncated importance weight ``min(pi_old(a|s) / mu(a|s), C)``
   (:func:`~echorl_agent.replay.llm.off_policy_ratio`, ``C = LLMPolicy.cfg.is_truncation``), where ``pi_old`` is the
   learner's distribution at the start of this update (no gradient) and ``mu`` the engine distribution that sampled
   the action (``rollout_logp``).
2. :meth:`PPOReplay.next_minibatch` -- every PPO minibatch of ``b`` fresh items gets its share (about
   ``replay_ratio * b``) of the replayed items, reshuffled each epoch. Their loss terms
   (:meth:`ReplayMinibatch.loss_terms`) are PPO's: the clipped surrogate with ratio ``pi_theta / pi_old`` on the
   item's **stored** advantage (the GAE advantage of the rollout that produced it; it is not recomputed under the
   current critic), normalised together with the fresh advantages of the minibatch, and the value loss against the
   item's **stored** return (a slightly stale target, weighted like the policy term). Both are multiplied by the
   item's weight and averaged over the mixed minibatch. Entropy and the plan KL are taken on the fresh items only.
3. :meth:`PPOReplay.end` -- the replayed items' priorities are updated with ``|delta| = |ret - V_theta(s)|``, the
   item's advantage re-estimated with the critic of the update's last epoch (the buffer's TD term of Eq. 7; their
   stored advantages, the ``alpha |A|`` term, stay), the rollout's transitions enter the buffer (their ``|delta|``
   is ``|ret - value| = |A_GAE|``), and the buffer learns the engine's new weight version (staleness).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from echorl_agent.llm_rl.policy import LLMPolicy, StepRecord
from echorl_agent.replay.llm import LLMReplayBuffer, LLMTransition, mix_batch, off_policy_ratio

__all__ = ["PPOReplay", "ReplayMinibatch", "fresh_transitions"]

_CHUNK = 32
"""Records per no-grad learner pass when computing the replayed items' ``pi_old``."""


@dataclass
class ReplayMinibatch:
    """The replayed items mixed into one PPO minibatch (every tensor ``[n]``)."""

    policy: LLMPolicy
    records: list[StepRecord]
    actions: list[int]
    advantages: torch.Tensor
    """Stored GAE advantages (raw; ``EchoPPO.train`` normalises them with the minibatch's fresh ones)."""
    returns: torch.Tensor
    """Stored returns (the value target)."""
    old_logp: torch.Tensor
    """Learner ``log pi_old(a|s)`` at the start of the update (the PPO ratio's denominator)."""
    weights: torch.Tensor
    """Prioritized-replay weight times ``min(pi_old / mu, C)``."""
    positions: np.ndarray
    """Positions in :attr:`PPOReplay.items` (for the priority update)."""
    values: torch.Tensor | None = field(default=None, repr=False)
    """Detached critic values of the last :meth:`loss_terms` call."""

    def __len__(self) -> int:
        return len(self.records)

    def loss_terms(self, advantages: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-item weighted ``(clipped surrogate [n], squared value error [n])``, differentiable.

        Args:
            advantages: the items' advantages as the loss uses them (normalised with the fresh ones, or raw).
            clip_range: PPO's epsilon.
        """
        logps, values, _ = self.policy.learner_scores_many(self.records)
        logp = torch.stack([lp[a] for lp, a in zip(logps, self.actions, strict=True)])
        ratio = torch.exp(logp - self.old_logp)
        surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range))
        values = values.flatten()
        self.values = values.detach()
        return self.weights * surrogate, self.weights * (self.returns - values) ** 2


def fresh_transitions(policy: LLMPolicy, rollout_buffer: Any, version: int) -> list[LLMTransition]:
    """One :class:`LLMTransition` per step of ``rollout_buffer`` (``n_steps * n_envs``, step-major), from the
    records the rollout kept (:meth:`LLMPolicy.record_many` finds them by observation bytes): token ids, captured
    activations, plan window, ``rollout_logp`` and SB3's GAE advantage, return and value."""
    buf = rollout_buffer
    recs = policy.record_many(buf.observations.reshape(-1, buf.observations.shape[-1]).astype(np.uint8))
    acts = buf.actions.reshape(-1).astype(np.int64).tolist()
    out = []
    for rec, a, adv, ret, value in zip(recs, acts, buf.advantages.reshape(-1).tolist(), buf.returns.reshape(-1).tolist(),
                                       buf.values.reshape(-1).tolist(), strict=True):
        it = LLMTransition.from_record(rec, action=min(a, len(rec.cands) - 1), advantage=adv, ret=ret, version=version)
        it.value = float(value)
        out.append(it)
    return out


class PPOReplay:
    """Replay for :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` (see the module docstring).

    Args:
        buffer: the hot/cold buffer of LLM transitions.
        replay_ratio: replayed items per fresh item in each update (>= 0).
        truncation: ``C`` of the truncated importance weight.
        seed: seed of the generator drawing replay samples and their minibatch order (SB3's global numpy
            generator, which orders the fresh minibatches, is not touched).
    """

    def __init__(self, buffer: LLMReplayBuffer, replay_ratio: float, truncation: float, seed: int | None) -> None:
        if isinstance(replay_ratio, bool) or not isinstance(replay_ratio, (int, float)) or not replay_ratio >= 0:
            raise ValueError(f"replay_ratio must be a number >= 0, got replay_ratio={replay_ratio!r}")
        self.buffer = buffer
        self.replay_ratio = float(replay_ratio)
        self.truncation = truncation
        self.rng = np.random.default_rng(seed)
        self.fresh: list[LLMTransition] = []
        self.items: list[LLMTransition] = []
        """The replayed items of the current update."""
        self.weights = torch.ones(0)
        """Weights of the mixed batch ``[len(fresh) + len(items)]``: 1 for fresh, PER x truncated IS for replayed."""
        self.per_weights = torch.ones(0)
        """Prioritized-replay weight ``(N P)^(-beta_is)`` (batch max 1) of each replayed item ``[len(items)]``."""
        self.is_weights = torch.ones(0)
        """``min(pi_old / mu, C)`` of each replayed item ``[len(items)]``."""
        self._slots = np.zeros(0, np.int64)
        self._records: list[StepRecord] = []
        self._old = torch.zeros(0)
        self._queue: list[ReplayMinibatch] = []
        self._minibatches = 1
        self._issued: list[ReplayMinibatch] = []
        self._policy: LLMPolicy | None = None

    def begin(self, policy: LLMPolicy, fresh: list[LLMTransition], batch_size: int) -> None:
        """Start an update on ``fresh`` (this rollout's transitions): draw the replayed items and their weights."""
        self.fresh, self.items, self._issued, self._queue = fresh, [], [], []
        self._minibatches = max(1, -(-len(fresh) // batch_size))
        n = int(round(self.replay_ratio * len(fresh)))
        if n == 0 or len(self.buffer) == 0:
            self.weights, self.per_weights, self.is_weights = torch.ones(len(fresh)), torch.ones(0), torch.ones(0)
            return
        sample = self.buffer.sample(n, self.rng)
        _, weights, is_replay = mix_batch(fresh, sample)
        self.items, self._slots, self.per_weights = list(sample.items), sample.indices, weights[is_replay].clone()
        self._records = [StepRecord.from_transition(it) for it in self.items]
        self._old = self._learner_logp(policy, self._records)
        behaviour = torch.stack([it.rollout_logp[it.action] for it in self.items]).float()
        self.is_weights = off_policy_ratio(self._old, behaviour, self.truncation).float()
        weights[is_replay] = weights[is_replay] * self.is_weights
        self.weights = weights
        self._policy = policy

    def _learner_logp(self, policy: LLMPolicy, records: list[StepRecord]) -> torch.Tensor:
        """Learner ``log pi(a|s)`` of the replayed items' actions under the current weights, without gradients."""
        out = []
        with torch.no_grad():
            for lo in range(0, len(records), _CHUNK):
                out.extend(policy.learner_scores_many(records[lo : lo + _CHUNK])[0])
        return torch.stack([lp[it.action] for lp, it in zip(out, self.items, strict=True)]).float().cpu()

    def next_minibatch(self) -> ReplayMinibatch | None:
        """The replayed items of the next PPO minibatch (None when nothing is replayed). The items are split over
        the update's ``ceil(len(fresh) / batch_size)`` minibatches and reshuffled each epoch."""
        if not self.items:
            return None
        if not self._queue:
            w = self.weights[len(self.fresh):]
            for pos in np.array_split(self.rng.permutation(len(self.items)), self._minibatches):
                if len(pos) == 0:  # fewer replayed items than minibatches
                    continue
                idx = torch.as_tensor(pos)
                self._queue.append(ReplayMinibatch(
                    self._policy, [self._records[i] for i in pos], [self.items[i].action for i in pos],
                    torch.tensor([self.items[i].advantage for i in pos], dtype=torch.float32),
                    torch.tensor([self.items[i].ret for i in pos], dtype=torch.float32),
                    self._old[idx], w[idx], pos))
        mb = self._queue.pop(0)
        self._issued.append(mb)
        return mb

    def end(self, version: int) -> dict[str, float]:
        """Finish the update: priorities of the replayed items, the rollout's transitions into the buffer, the new
        weight version; returns statistics (replayed items, buffer size, hit rate, MB per 1,000, IS weight mean)."""
        last: dict[int, float] = {}  # position -> the critic's value in the item's latest forward
        for mb in self._issued:
            if mb.values is not None:
                last.update(zip(mb.positions.tolist(), mb.values.tolist(), strict=True))
        if last:
            pos = np.array(sorted(last), dtype=np.int64)
            self.buffer.update_priorities(self._slots[pos], np.array([abs(self.items[p].ret - last[p]) for p in pos]))
        if self.fresh:
            self.buffer.add(self.fresh)
        self.buffer.set_version(version)
        st = self.buffer.stats()
        out = {"replayed": float(len(self.items)), "replay_items": float(st["items"]),
               "replay_hit_rate": float(st["hit_rate"]), "replay_mb_per_1000": float(st["mb_per_1000"]),
               "replay_is_weight_mean": float(self.is_weights.mean()) if len(self.is_weights) else float("nan")}
        self.fresh, self.items, self._records, self._queue, self._issued = [], [], [], [], []
        return out
