"""A frozen SB3 policy + retrieved-action prior + a small residual head (experience without touching the policy).

For a fixed action vocabulary ``a_1..a_A`` (e.g. MiniGrid's seven words) and an encoded observation ``x``::

    logits(x) = f_frozen(x) + g_psi([x, onehot(a_retrieved)])

``f_frozen`` are the frozen model's logits (``DQN``: Q-values; ``PPO``/``MaskablePPO``: the categorical
distribution's logits); ``a_retrieved`` is the action of the step retrieved-then-sampled from the
:class:`~echorl_agent.experience.bank.ExperienceBank` (a zero vector when nothing is retrieved); ``g_psi`` is a
two-layer MLP whose output layer starts at zero, so before fitting the policy is exactly the frozen one. Only
``psi`` is trained (:meth:`ResidualExperiencePolicy.fit`): cross-entropy towards the actions of the bank's
successful steps, with the retrieval done leave-one-rollout-out so the head learns when retrieved actions are worth
following rather than copying its own label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch as th
from torch import nn

from echorl_agent.experience.bank import ExperienceBank

__all__ = ["ResidualHead", "ResidualExperiencePolicy"]


class ResidualHead(nn.Module):
    """``g_psi([x, prior]) -> [A]`` with a zero-initialised output layer."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim + n_actions, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, obs: th.Tensor, prior: th.Tensor) -> th.Tensor:
        return self.net(th.cat([obs, prior], dim=-1))


class ResidualExperiencePolicy:
    """Frozen SB3 model + experience prior + residual head (module docstring).

    Args:
        model: a trained SB3 model over ``Box`` observations and ``Discrete(len(actions))`` actions (DQN, PPO,
            MaskablePPO...); it is never updated.
        bank: the experience bank.
        text_encoder: the :class:`echorl_envs.wrappers.TextEncoder` the model's env used (same text convention:
            ``"<task>\\n<observation>"``, i.e. ``include_task=True``).
        actions: the fixed action vocabulary (slot ``i`` = ``actions[i]``).
        hidden: width of the residual head.
        seed: seed of the head's initialisation and of retrieval sampling.
        use_retrieval: False feeds a zero prior (an ablation: the head then learns from the bank's successful
            steps alone, like behaviour cloning on top of the frozen logits).
    """

    def __init__(self, model: Any, bank: ExperienceBank, text_encoder: Any, actions: Sequence[str],
                 hidden: int = 64, seed: int = 0, use_retrieval: bool = True) -> None:
        self.model = model
        self.bank = bank
        self.text_encoder = text_encoder
        self.actions = [str(a) for a in actions]
        if not self.actions:
            raise ValueError("actions must list the fixed action vocabulary, got actions=[]")
        self._slot = {a: i for i, a in enumerate(self.actions)}
        th.manual_seed(seed)
        self.head = ResidualHead(int(text_encoder.dim), len(self.actions), hidden)
        self.rng = np.random.default_rng(seed)
        self.use_retrieval = use_retrieval

    # ------------------------------------------------------------------ pieces
    def encode(self, task: str, obs: str) -> np.ndarray:
        """The model's observation vector (the SB3 wrapper's ``include_task`` convention)."""
        return self.text_encoder.encode_one(f"{task}\n{obs}" if task else obs).astype(np.float32)

    def frozen_logits(self, x: np.ndarray) -> th.Tensor:
        """``f_frozen``: Q-values of a DQN-style model, else the policy distribution's logits (no gradient)."""
        with th.no_grad():
            obs_t, _ = self.model.policy.obs_to_tensor(np.asarray(x, dtype=np.float32))
            if hasattr(self.model, "q_net"):
                return self.model.q_net(obs_t).float()
            return self.model.policy.get_distribution(obs_t).distribution.logits.float()

    def prior(self, task: str, obs: str, exclude_rollout: int | None = None) -> np.ndarray:
        """One-hot of the retrieved-then-sampled action (zeros when nothing is retrieved or it is unknown)."""
        out = np.zeros(len(self.actions), dtype=np.float32)
        if not self.use_retrieval:
            return out
        r = self.bank.sample(task, obs, self.rng, exclude_rollout=exclude_rollout)
        if r is not None and r.step.action in self._slot:
            out[self._slot[r.step.action]] = 1.0
        return out

    # ------------------------------------------------------------------ training
    def fit(self, epochs: int = 30, lr: float = 3e-3, batch_size: int = 64) -> list[float]:
        """Train the residual head on the bank's successful steps; returns the mean loss of each epoch (empty
        when the bank holds no successful step)."""
        xs, priors, ys = [], [], []
        by_id = {r.id: r for r in self.bank.rollouts}
        for s in self.bank.steps:
            roll = by_id.get(s.rollout)
            if roll is None or not roll.success or s.action not in self._slot:
                continue
            xs.append(self.encode(roll.instruction, s.observation))
            priors.append(self.prior(roll.instruction, s.observation, exclude_rollout=roll.id))
            ys.append(self._slot[s.action])
        if not xs:
            return []
        x = th.as_tensor(np.stack(xs))
        p = th.as_tensor(np.stack(priors))
        y = th.as_tensor(ys, dtype=th.long)
        base = self.frozen_logits(x.numpy())
        opt = th.optim.Adam(self.head.parameters(), lr=lr)
        gen = th.Generator().manual_seed(0)
        losses = []
        for _ in range(epochs):
            perm = th.randperm(len(y), generator=gen)
            total = 0.0
            for i in range(0, len(y), batch_size):
                b = perm[i : i + batch_size]
                loss = nn.functional.cross_entropy(base[b] + self.head(x[b], p[b]), y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(b)
            losses.append(total / len(y))
        return losses

    # ------------------------------------------------------------------ acting
    def logits(self, task: str, obs: str) -> th.Tensor:
        x = self.encode(task, obs)
        with th.no_grad():
            return self.frozen_logits(x[None])[0] + self.head(th.as_tensor(x[None]),
                                                              th.as_tensor(self.prior(task, obs)[None]))[0]

    def act(self, obs: str, info: dict[str, Any]) -> str:
        """Greedy action among the admissible ones."""
        logits = self.logits(str(info.get("task") or ""), obs).numpy()
        adm = set(info.get("admissible_actions") or self.actions)
        masked = np.where([a in adm for a in self.actions], logits, -np.inf)
        return self.actions[int(np.argmax(masked))]
