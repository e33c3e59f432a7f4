"""A frozen LLM agent guided by retrieved experience (the retrieved step goes into its prompt).

:class:`ExperienceGuidedAgent` follows the :class:`~echorl_agent.agents.Agent` protocol and wraps
another agent on the same protocol -- a frozen chat agent of :mod:`echorl_agent.agents.chat` (``ScoringAgent`` or
``ReActAgent``), whose weights never change. Before each turn it
retrieves-then-samples one step from the :class:`~echorl_agent.experience.bank.ExperienceBank` for the current
(instruction, observation) and appends it to the observation the LLM sees::

    <observation>
    Past experience in a similar situation: you saw "<obs>", did "<action>", then "<next obs>" (that episode
    succeeded in 6 steps).

After each episode the rollout (successful or not) is added to the bank, so the agent improves as the bank grows
without any gradient step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_agent.agents.base import Agent
from echorl_agent.experience.bank import ExperienceBank, Retrieved

__all__ = ["ExperienceGuidedAgent", "guidance_text"]


def _squash(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guidance_text(r: Retrieved, max_chars: int = 160) -> str:
    """One line of prompt guidance describing a retrieved step and how its episode ended."""
    outcome = f"succeeded in {r.rollout.length} steps" if r.rollout.success else "failed"
    return (f'Past experience in a similar situation: you saw "{_squash(r.step.observation, max_chars)}", '
            f'did "{r.step.action}", then "{_squash(r.step.next_observation, max_chars)}" (that episode {outcome}).')


class ExperienceGuidedAgent(Agent):
    """A frozen chat agent + an experience bank (module docstring).

    Args:
        inner: the frozen agent it shows the guided observations to (any :class:`~echorl_agent.agents.Agent`).
        bank: the experience bank (shared across episodes; grows online when ``grow=True``).
        grow: add every finished episode to the bank.
        guide: put retrieved experience into the prompt (False: the plain frozen agent, same code path).
        max_chars: cap on each quoted observation in the guidance.
    """

    name = "experience"

    def __init__(self, inner: Agent, bank: ExperienceBank, grow: bool = True, guide: bool = True,
                 max_chars: int = 160) -> None:
        self.inner = inner
        self.bank = bank
        self.grow = grow
        self.guide = guide
        self.max_chars = max_chars
        self.rng = np.random.default_rng(0)
        self._instruction = ""
        self._prev_obs = ""
        self._shown = ""  # the (guided) observation the inner agent saw last
        self.num_guided_turns = 0
        self.last_guidance: str | None = None

    def _augment(self, obs: str) -> str:
        self.last_guidance = None
        if not self.guide:
            return obs
        r = self.bank.sample(self._instruction, obs, self.rng)
        if r is None:
            return obs
        self.num_guided_turns += 1
        self.last_guidance = guidance_text(r, self.max_chars)
        return f"{obs}\n{self.last_guidance}"

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self._instruction = str(info.get("task") or "")
        self._prev_obs = obs
        if self.grow:
            self.bank.begin_episode(self._instruction, {"env_id": env_id, "seed": seed})
        self._shown = self._augment(obs)
        self.inner.reset(env_id, self._shown, info, seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        return self.inner.act(self._shown, info)

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        if self.grow:
            self.bank.record(self._prev_obs, action, obs, reward)
        self._prev_obs = obs
        if done:
            if self.grow:
                self.bank.end_episode(bool(info.get("won", False)))
            self.inner.observe(action, obs, reward, done, info)
            return
        self._shown = self._augment(obs)
        self.inner.observe(action, self._shown, reward, done, info)

    def stats(self) -> dict[str, float]:
        return {"guided_turns": float(self.num_guided_turns), "bank_rollouts": float(self.bank.num_rollouts)}
