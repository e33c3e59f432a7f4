"""Critic-free advantages of group RL for multi-turn episodes: GRPO's episode level and GiGPO's anchor-state step level.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978):

* episode level: the K episodes of a group start from one state;
  ``A_E(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F``, ``R`` the episode return;
* step level: steps of the group's episodes that start from the same environment state (an *anchor
  state*, matched exactly) form a step group; each step's discounted return-to-go
  ``G_t = sum_k gamma^k r_{t+k}`` is compared within its step group, ``A_S = (G_t - mean G) / F``;
* ``A = A_E + omega * A_S``, the same advantage for every token of the action.

``F`` is the group's standard deviation (``normalize="std"``, GRPO's choice) or 1 (``"mean"``, Dr. GRPO's / the
paper's unbiased variant). A group (or step group) of one, or with equal values, gets advantage 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from echorl_agent.llm_rl.rollout import Episode

__all__ = ["discounted_returns", "episode_advantages", "step_advantages", "gigpo_advantages", "anchor_groups",
           "episode_sample_weights", "center_advantages"]

_EPS = 1e-6


def _normalise(values: np.ndarray, normalize: str) -> np.ndarray:
    if len(values) < 2:
        return np.zeros_like(values)
    centred = values - values.mean()
    if normalize == "std":
        return centred / (values.std() + _EPS)
    return centred


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` for every step of one episode."""
    out = np.zeros(len(rewards), dtype=np.float64)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def episode_advantages(episodes: Sequence[Episode], normalize: str = "std") -> np.ndarray:
    """GiGPO's episode level (GRPO): each episode's return normalised within its group (one value per episode)."""
    out = np.zeros(len(episodes), dtype=np.float64)
    by_group: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        by_group[e.group].append(i)
    for idx in by_group.values():
        out[idx] = _normalise(np.array([episodes[i].ret for i in idx], dtype=np.float64), normalize)
    return out


def anchor_groups(episodes: Sequence[Episode]) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """``(group, anchor key) -> [(episode index, step index)]``: the steps that start from one state."""
    groups: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for i, e in enumerate(episodes):
        for t, s in enumerate(e.steps):
            groups[(e.group, s.anchor)].append((i, t))
    return dict(groups)


def step_advantages(episodes: Sequence[Episode], gamma: float, normalize: str = "std") -> list[np.ndarray]:
    """GiGPO's step level: each step's discounted return-to-go normalised within its anchor-state group."""
    returns = [discounted_returns([s.reward for s in e.steps], gamma) for e in episodes]
    out = [np.zeros(len(e.steps), dtype=np.float64) for e in episodes]
    for members in anchor_groups(episodes).values():
        adv = _normalise(np.array([returns[i][t] for i, t in members], dtype=np.float64), normalize)
        for (i, t), a in zip(members, adv, strict=True):
            out[i][t] = a
    return out


def gigpo_advantages(episodes: Sequence[Episode], gamma: float = 0.95, step_weight: float = 1.0,
                     normalize: str = "std") -> list[np.ndarray]:
    """GiGPO: ``A = A_E + omega * A_S`` for every step of every episode (``step_weight`` = omega;
    ``step_weight=0`` is GRPO with the episode advantage on every step)."""
    if normalize not in ("std", "mean"):
        raise ValueError(f"normalize must be 'std' or 'mean', got normalize={normalize!r}")
    ep = episode_advantages(episodes, normalize)
    st = step_advantages(episodes, gamma, normalize) if step_weight else [np.zeros(len(e.steps)) for e in episodes]
    return [ep[i] + step_weight * st[i] for i in range(len(episodes))]


def episode_sample_weights(episodes: Sequence[Episode], mode: str = "sample") -> list[float]:
    """The loss weight of every step of each episode (one value per episode), mean 1 over all steps.

    ``"sample"``: 1 for every step, so an episode weighs as many steps as it has. A group's episode advantages sum to 0
    over its episodes, not over its steps: failed episodes run to the step limit and short successes have few steps,
    so the steps' mean advantage is negative and most of the update pushes sampled actions down (on BabyAI-GoToLocal
    after a BC warm start it was negative in every update of 3 seeds, and the policy's entropy rose from ~0.75 to
    ~1.15 nats: docs/studies/gotolocal-centred-gigpo-from-bc.md). ``"episode"``: ``N / (E * len(episode))`` (N steps, E
    episodes), so every episode carries the same total weight and the episode-level part of the advantage has
    weighted mean 0 in every group.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in ("sample", "episode"):
        raise ValueError(f"sample_weighting must be 'sample' or 'episode', got sample_weighting={mode!r}")
    if mode == "sample":
        return [1.0] * len(episodes)
    total = sum(len(e.steps) for e in episodes)
    return [total / (len(episodes) * len(e.steps)) if e.steps else 0.0 for e in episodes]


def center_advantages(advantages: Sequence[np.ndarray], weights: Sequence[float],
                      mode: bool | str = True) -> tuple[list[np.ndarray], float]:
    """Centre the steps' advantages on their loss-weighted mean; returns ``(advantages, weighted mean afterwards)``.

    ``weights`` holds one loss weight per episode (:func:`episode_sample_weights`). ``mode``: ``False`` leaves them
    as they are; ``True`` subtracts the mean over all steps, so every step (also those of groups whose episodes all
    got the same return) gets a non-zero advantage; ``"signal"`` subtracts the mean over the steps whose advantage is
    non-zero only, and steps without signal keep 0. The returned mean is over all steps (0 after either centring).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if not (isinstance(mode, bool) or mode == "signal"):
        raise ValueError(f"center_advantages must be True, False or 'signal', got center_advantages={mode!r}")
    adv = [np.asarray(a, dtype=np.float64) for a in advantages]
    flat = np.concatenate(adv) if adv else np.zeros(0)
    w = np.repeat(np.asarray(weights, dtype=np.float64), [len(a) for a in adv])
    if flat.size == 0 or w.sum() <= 0:
        return adv, 0.0
    if mode is True:
        mean = float(np.average(flat, weights=w))
        adv = [a - mean for a in adv]
    elif mode == "signal":
        live = np.abs(flat) > 1e-12
        if live.any() and w[live].sum() > 0:
            mean = float(np.average(flat[live], weights=w[live]))
            adv = [np.where(np.abs(a) > 1e-12, a - mean, 0.0) for a in adv]
    return adv, float(np.average(np.concatenate(adv), weights=w))
