"""Behaviour cloning of :class:`~echorl_agent.llm_rl.policy.LLMPolicy` on the env's expert (warm start for RL).

Every choice env exposes ``info["expert_action"]`` (an expert, planner, walkthrough or oracle). BC collects expert
trajectories through the same :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper` the RL agent sees, and
minimises ``-log pi(a* | s)`` with the same policy class and the same learner forward -- so BC -> PPO is one
pipeline: ``behaviour_clone(model.policy, ...)`` then ``model.learn(...)``. GLAM's maintainers note that small LMs
learn GoToLocal slowly from scratch with PPO; an expert warm start is the usual remedy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from echorl_envs.wrappers.llm import LLMObservationWrapper

__all__ = ["ExpertData", "collect_expert_states", "behaviour_clone", "LR_SCHEDULERS", "lr_factor"]

LR_SCHEDULERS = ("constant", "linear", "cosine")
"""How the BC learning rate moves over one clone's optimizer steps (HF's ``lr_scheduler_type`` names, no warm-up)."""


def lr_factor(scheduler: str, step: int, total: int) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based) of ``total``: 1 throughout
    (``constant``), ``1 - step / total`` (``linear``) or ``(1 + cos(pi * step / total)) / 2`` (``cosine``); the last
    step runs at a small positive rate, never 0."""
    if scheduler not in LR_SCHEDULERS:
        raise ValueError(f"bc_lr_scheduler must be one of {LR_SCHEDULERS}, got bc_lr_scheduler={scheduler!r}")
    frac = min(max(step / max(total, 1), 0.0), 1.0)
    if scheduler == "linear":
        return 1.0 - frac
    if scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * frac))
    return 1.0

log = logging.getLogger(__name__)


@dataclass
class ExpertData:
    """Expert states (wrapper byte observations) and the expert's action slot in each."""

    observations: np.ndarray  # [N, max_bytes] uint8
    actions: np.ndarray  # [N] int64
    episodes: int
    successes: int
    returns: list[float] = field(default_factory=list)
    deviations: int = 0
    """Steps that executed another action than the labelled expert one (``collect_expert_states(noise=...)``)."""
    unlabelled: int = 0
    """Noisy episodes that ended early at a state the expert has no action for (that state is not kept)."""


def collect_expert_states(make_env: Callable[[], LLMObservationWrapper], episodes: int, seed: int = 0,
                          noise: float = 0.0, noise_actions: Sequence[str] = ()) -> ExpertData:
    """Roll out ``info["expert_action"]`` for ``episodes`` episodes (seeds ``seed, seed + 1, ...``).

    Args:
        make_env: builds a wrapped choice env (:class:`LLMObservationWrapper` outermost).
        noise: the probability that a step *executes* a uniformly drawn other admissible action instead of the
            expert's (DART, Laskey et al. 2017: the demonstrations then cover the states just off the expert's path,
            where a cloned policy's own mistakes lead); every state is still labelled with the expert's action, and
            the expert replans from the state the executed action reached. An episode whose noise led to a state the
            expert has no action for ends there (``ExpertData.unlabelled`` counts them; BabyAI's bot gives up after
            a random ``toggle`` opened a box). Draws from ``seed``; 0: the expert's own episodes, exactly as before.
        noise_actions: the action texts the noise may execute (drawn uniformly among those admissible and other than
            the expert's; a step where none is, runs the expert's action); empty: any admissible action. BabyAI's
            ``["go forward"]`` puts the states after a blocked ``go forward`` ("You cannot move forward: ...", which
            the expert's own episodes never reach) into the demonstrations, without the turn noise that adds
            turn-then-turn-back labels.

    Raises:
        ValueError: the env has no expert at some step of an episode no noise has touched
            (``info["expert_action"]`` missing or not admissible); a ``noise_actions`` text no collected state had
            admissible (a misspelt action would otherwise silently add no noise).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got episodes={episodes}")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise must be in [0, 1), got noise={noise!r}")
    noise_actions = list(noise_actions)
    if any(not isinstance(t, str) or not t for t in noise_actions):
        raise ValueError(f"noise_actions must be action texts, got noise_actions={noise_actions!r}")
    seen: set[str] = set()
    rng = np.random.default_rng(seed)
    env = make_env()
    obs_rows, actions, returns = [], [], []
    wins = deviations = unlabelled = 0
    try:
        for ep in range(episodes):
            obs, info = env.reset(seed=seed + ep)
            done, ret, noisy = False, 0.0, False
            while not done:
                expert = info.get("expert_action")
                adm = env.get_wrapper_attr("slot_texts")()
                if expert is None or expert not in adm:
                    if noisy:
                        unlabelled += 1
                        break
                    raise ValueError(f"no admissible expert action at step {info.get('step')} of episode {ep}: "
                                     f"expert_action={expert!r}")
                a = adm.index(expert)
                obs_rows.append(obs)
                actions.append(a)
                act = a
                seen.update(t for t in adm if t is not None)
                if noise and rng.random() < noise:
                    others = [i for i, text in enumerate(adm) if text is not None and i != a
                              and (not noise_actions or text in noise_actions)]
                    if others:
                        act = int(rng.choice(others))
                        deviations += 1
                        noisy = True
                obs, r, term, trunc, info = env.step(act)
                ret += float(r)
                done = term or trunc
            wins += bool(info.get("won"))
            returns.append(ret)
    finally:
        env.close()
    never = [t for t in noise_actions if t not in seen]
    if noise and never:
        raise ValueError(f"bc_noise_actions names actions no expert state had admissible: {never!r} "
                         f"(admissible ones seen: {sorted(seen)!r})")
    return ExpertData(np.stack(obs_rows), np.asarray(actions, dtype=np.int64), episodes, wins, returns, deviations, unlabelled)


def behaviour_clone(policy, data: ExpertData, epochs: int = 3, batch_size: int = 16, seed: int = 0,
                    progress: bool = False, on_epoch: Callable[[int, float], None] | None = None,
                    cache: dict[bytes, Any] | None = None, epochs_done: int = 0,
                    lr_scheduler: str = "constant") -> list[float]:
    """Minimise ``-log pi(a* | s)`` over the expert states; returns the mean loss of every epoch it ran.

    The states are scored once by the rollout engine (activations captured), then every epoch runs the learner's
    forward from those activations. The engine gets the new weights at the end.

    ``cache`` (DAgger's rounds clone a growing set): records of states scored by an earlier call are taken from it
    and new ones added. A record's captured activations are those of the frozen layers, which no update changes, so
    a cached record gives the learner exactly what a fresh one would (BC reads nothing else from it). Ignored with
    soft plan tokens (their windows follow the weights).

    ``epochs_done`` (a resumed BC stage, :mod:`~echorl_agent.llm_rl.algorithms.bc.stage`): the first epochs already
    ran on ``policy``'s weights; their shuffles are drawn and skipped, and epochs ``epochs_done .. epochs - 1`` run.

    ``lr_scheduler`` (:func:`lr_factor`): the optimizer's learning rate at the call becomes the base of a schedule
    over this call's ``epochs`` x minibatches optimizer steps (a resumed call continues it at ``epochs_done``); the
    base rate is set back at the end. ``constant`` leaves the rate alone, exactly as before.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got epochs={epochs}, batch_size={batch_size}")
    if not 0 <= epochs_done < epochs:
        raise ValueError(f"epochs_done must be in 0..epochs - 1, got epochs_done={epochs_done}, epochs={epochs}")
    lr_factor(lr_scheduler, 0, 1)  # a bad name fails before any work
    rng = np.random.default_rng(seed)
    for _ in range(epochs_done):
        rng.permutation(len(data.actions))
    if policy.plan is not None:
        cache = None
    keys = [policy._key(row) for row in data.observations] if cache is not None else []
    todo = [i for i in range(len(data.observations)) if cache is None or keys[i] not in cache]
    policy.clear_store()
    policy.recording = True
    try:
        fresh = []
        for lo in range(0, len(todo), 16):  # 16 states per batched engine call
            fresh += policy.record_many([data.observations[i] for i in todo[lo : lo + 16]])
    finally:
        policy.recording = False
    if cache is None:
        records = fresh
    else:
        cache.update((keys[i], rec) for i, rec in zip(todo, fresh, strict=True))
        records = [cache[k] for k in keys]
    policy.set_training_mode(True)
    groups = policy.optimizer.param_groups
    base = [g["lr"] for g in groups]
    per_epoch = -(-len(records) // batch_size)
    step = epochs_done * per_epoch
    losses: list[float] = []
    it = range(epochs_done, epochs)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="BC epochs", initial=epochs_done, total=epochs)
    for epoch in it:
        order = rng.permutation(len(records))
        total = 0.0
        for lo in range(0, len(order), batch_size):
            idx = sorted(order[lo : lo + batch_size])  # episode order inside a batch: shared prefixes meet
            logps = policy.learner_scores_many([records[i] for i in idx])[0]
            loss = torch.stack([-lp[int(data.actions[i])] for lp, i in zip(logps, idx, strict=True)]).mean()
            policy.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(policy.parameters()), 1.0)
            if lr_scheduler != "constant":
                f = lr_factor(lr_scheduler, step, epochs * per_epoch)
                for g, lr in zip(groups, base, strict=True):
                    g["lr"] = lr * f
            policy.optimizer.step()
            step += 1
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(order))
        for g, lr in zip(groups, base, strict=True):  # a BC stage saved now holds the base rate, not the last step's
            g["lr"] = lr
        if on_epoch is not None:
            on_epoch(epoch, losses[-1])
        log.info("BC epoch %d: loss %.4f", epoch, losses[-1])
    policy.set_training_mode(False)
    policy.sync_engine()
    policy.clear_store()
    return losses
