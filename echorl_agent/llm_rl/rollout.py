"""Group rollouts of an :class:`~echorl_agent.llm_rl.policy.LLMPolicy`: K episodes from one start state, many envs
in lockstep, every step's candidates scored in one engine call.

GiGPO (Feng et al. 2025, arXiv 2505.10978) compares K trajectories that start from the *same* initial state. Our
envs are seeded and deterministic, so a group is K envs reset with one seed; the reset observations of a group are
checked to be identical (an env whose seed does not reproduce its start state cannot be grouped). All active envs
of all groups step together: their states go to :meth:`LLMPolicy.record_many`, which prefills every prompt and
scores every candidate in one batched engine call; identical prompts (the K copies of a group's first state, and
every state the K episodes still share) are computed once, and a state that extends an earlier one is served from
the prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch

import echorl_envs
from echorl_agent.llm_rl.policy import LLMPolicy, StepRecord
from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs

__all__ = ["Step", "Episode", "collect_groups", "anchor_key", "make_choice_env"]


@dataclass
class Step:
    """One decision: the rollout's record (prompt, candidates, log pi_rollout, captured activations), the action
    slot taken, the reward that followed, and the state's anchor key (GiGPO's step-level grouping)."""

    record: StepRecord
    action: int
    reward: float
    anchor: str


@dataclass
class Episode:
    """One trajectory of a group."""

    group: int
    seed: int
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    truncated: bool = False
    policy_version: int = 0
    """The weights version that acted (the learner engine's ``weight_version`` when the episode was played)."""

    @property
    def ret(self) -> float:
        """Undiscounted episode return."""
        return float(sum(s.reward for s in self.steps))


def make_choice_env(env_id: str, history: int, max_episode_steps: int | None = None,
                    env_kwargs: dict[str, Any] | None = None, encode: bool = True) -> LLMObservationWrapper:
    """The wrapped env an LLM policy acts in (its own step limit unless ``max_episode_steps`` is given);
    ``encode=False``: observations are the state dicts, not their JSON bytes (no SB3 buffer needs them)."""
    kw = dict(env_kwargs or {})
    if max_episode_steps:
        kw["max_episode_steps"] = max_episode_steps
    max_actions = echorl_envs.entry(env_id).max_actions  # the registry's slots (EnvEntry.max_actions)
    return LLMObservationWrapper(gym.make(env_id, **kw), history=history, max_actions=max_actions, encode=encode)


def anchor_key(state: dict) -> str:
    """The exact environment state a step starts from, as GiGPO matches it: the current observation text and the
    admissible actions (the history window is not part of the state)."""
    return state["obs"] + "\x00" + "\x1f".join(state.get("admissible", []))


def collect_groups(policy: LLMPolicy, envs: Sequence[LLMObservationWrapper], seeds: Sequence[int], group_size: int,
                   generator: torch.Generator | None = None, deterministic: bool = False) -> list[Episode]:
    """Run one episode in each env: env ``j`` belongs to group ``j // group_size`` and starts from ``seeds[group]``.

    Args:
        policy: the LLM policy (its engine scores the actions; sampling follows ``pi_rollout``).
        envs: ``len(seeds) * group_size`` wrapped choice envs (their own step limits truncate episodes).
        seeds: one reset seed per group.
        group_size: K, episodes per group.
        generator: torch generator for the action samples (reproducible rollouts).
        deterministic: greedy actions (evaluation) instead of samples.

    Raises:
        ValueError: ``len(envs) != len(seeds) * group_size``, or a group's reset observations differ (the env's
            seeds do not reproduce the start state).
    """
    if len(envs) != len(seeds) * group_size:
        raise ValueError(f"collect_groups needs len(seeds) * group_size envs, got {len(envs)} envs for "
                         f"{len(seeds)} seeds x group_size={group_size}")
    episodes = [Episode(j // group_size, int(seeds[j // group_size])) for j in range(len(envs))]
    obs = [env.reset(seed=int(seeds[j // group_size]))[0] for j, env in enumerate(envs)]
    states = [decode_llm_obs(o) for o in obs]
    for g in range(len(seeds)):
        first = [anchor_key(states[j]) for j in range(g * group_size, (g + 1) * group_size)]
        if len(set(first)) > 1:
            raise ValueError(f"seeds: the {group_size} resets of group {g} with seed={seeds[g]} gave different first "
                             "observations; GiGPO needs an env whose seed reproduces the start state")
    active = list(range(len(envs)))
    while active:
        recs = policy.record_many([obs[j] for j in active])
        still = []
        for j, rec in zip(active, recs, strict=True):
            if deterministic:
                a = int(torch.argmax(rec.rollout_logp))
            else:
                a = int(torch.multinomial(rec.rollout_logp.exp(), 1, generator=generator))
            o, r, terminated, truncated, info = envs[j].step(a)
            episodes[j].steps.append(Step(rec, a, float(r), anchor_key(states[j])))
            if terminated or truncated:
                episodes[j].won = bool(info.get("won", False))
                episodes[j].truncated = bool(truncated and not terminated)
            else:
                obs[j], states[j] = o, decode_llm_obs(o)
                still.append(j)
        active = still
    return episodes

