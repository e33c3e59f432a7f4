"""DAgger (Ross et al., 2011) with the env's expert: the cloned policy plays, the expert labels the states it reached.

Behaviour cloning only sees the states the expert visits; a cloned policy that steps off that path (into a wall the
expert never walked into) meets states it never learned from, and its errors compound. Every choice env here
advises along any path (``info["expert_action"]`` after every step: BabyAI's bot replans from the agent's actual
state), so each DAgger round

1. plays ``episodes`` episodes with the current policy (sampled from its own distribution, ``n_envs`` at a time,
   one batched engine call per step),
2. labels every state it visited with the expert's action there (states where the expert has none are left out),
3. adds them to the data and clones the whole aggregate again (:func:`~.clone.behaviour_clone`).

The policy's own episodes are also a free measurement: the success of each round's play is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from echorl_agent.llm_rl.algorithms.bc.clone import ExpertData
from echorl_envs.wrappers.llm import LLMObservationWrapper

__all__ = ["PolicyStates", "collect_policy_states", "dagger_seed", "merge_data"]

log = logging.getLogger(__name__)


def dagger_seed(seed: int, round_: int, ep: int) -> int:
    """Reset seed of episode ``ep`` of DAgger round ``round_`` (1-based) of run ``seed``: ``10**8 + 10**4 * seed +
    1000 * round + ep``, above every held-out seed (``100000 + 1000 * seed + ep``) and BC demonstration seed
    (``10000 + seed + ep``) of the same run."""
    if not 1 <= round_ <= 9 or not 0 <= ep < 1000:
        raise ValueError(f"DAgger seeds hold rounds 1..9 of up to 1000 episodes, got round={round_}, ep={ep}")
    return 10**8 + 10**4 * seed + 1000 * round_ + ep


@dataclass
class PolicyStates:
    """The states a policy visited, labelled by the expert (``data``), and how its episodes went."""

    data: ExpertData
    steps: int
    """Env steps played (labelled or not)."""
    unlabelled: int
    """Visited states where the expert had no admissible action (left out of ``data``)."""

    @property
    def success(self) -> float:
        return self.data.successes / max(self.data.episodes, 1)


def collect_policy_states(policy, make_env: Callable[[], LLMObservationWrapper], seeds: list[int], n_envs: int = 16,
                          generator: torch.Generator | None = None) -> PolicyStates:
    """Play one episode per seed with ``policy`` (actions sampled from its rollout distribution, ``n_envs`` envs
    stepping together) and label each visited state with ``info["expert_action"]``."""
    if not seeds:
        raise ValueError("collect_policy_states needs at least one episode seed")
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got n_envs={n_envs}")
    envs = [make_env() for _ in range(min(n_envs, len(seeds)))]
    todo = list(seeds)
    obs_rows: list[np.ndarray] = []
    actions: list[int] = []
    returns: list[float] = []
    wins = steps = unlabelled = 0
    live: dict[int, tuple[np.ndarray, dict, float]] = {}  # env index -> (obs, info, return so far)
    try:
        for j, env in enumerate(envs):
            obs, info = env.reset(seed=todo.pop(0))
            live[j] = (obs, info, 0.0)
        while live:
            order = sorted(live)
            recs = policy.record_many([live[j][0] for j in order])
            for j, rec in zip(order, recs, strict=True):
                obs, info, ret = live[j]
                adm = envs[j].get_wrapper_attr("slot_texts")()
                expert = info.get("expert_action")
                if expert is not None and expert in adm:
                    obs_rows.append(obs)
                    actions.append(adm.index(expert))
                else:
                    unlabelled += 1
                a = int(torch.multinomial(rec.rollout_logp.exp(), 1, generator=generator))
                obs, r, term, trunc, info = envs[j].step(a)
                steps += 1
                ret += float(r)
                if term or trunc:
                    wins += bool(info.get("won"))
                    returns.append(ret)
                    if todo:
                        obs, info = envs[j].reset(seed=todo.pop(0))
                        live[j] = (obs, info, 0.0)
                    else:
                        del live[j]
                else:
                    live[j] = (obs, info, ret)
    finally:
        for env in envs:
            env.close()
        policy.clear_store()
    if not obs_rows:
        raise ValueError(f"the expert labelled none of the {steps} states the policy visited "
                         "(info['expert_action'] missing or not admissible everywhere)")
    data = ExpertData(np.stack(obs_rows), np.asarray(actions, dtype=np.int64), len(seeds), wins, returns)
    return PolicyStates(data, steps, unlabelled)


def merge_data(a: ExpertData, b: ExpertData) -> ExpertData:
    """The aggregate of two labelled state sets (DAgger's growing data set)."""
    width = max(a.observations.shape[1], b.observations.shape[1])
    pad = lambda x: np.pad(x, ((0, 0), (0, width - x.shape[1])))  # noqa: E731 (byte rows: zero padding ends them)
    return ExpertData(np.concatenate([pad(a.observations), pad(b.observations)]),
                      np.concatenate([a.actions, b.actions]), a.episodes + b.episodes, a.successes + b.successes,
                      a.returns + b.returns, a.deviations + b.deviations,
                      a.unlabelled + b.unlabelled)
