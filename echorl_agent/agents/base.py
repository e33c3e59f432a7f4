"""The one agent protocol of echorl: every agent the bench runs, and every agent a user writes, follows it.

An episode is ``reset(env_id, obs, info, seed)``, then ``act(obs, info)`` / ``observe(action, obs, reward, done,
info)`` once per step, with ``info`` the env's info dict (``admissible_actions``, ``task``, ``won``...). ``stats()``
returns cumulative counters (LLM tokens, KV reuse, cache hits...): the runner reports the difference after an
episode minus before it. ``close()`` frees what the agent holds.

It imports nothing of the package; every agent lives beside it in :mod:`echorl_agent.agents` (frozen LLM agents,
the prior-cache and experience agents, SB3 and LLM learners, experts), and the bench runner drives them all through
it. The public name is ``echorl_agent.agents.Agent``.

>>> class Echo(Agent):
...     name = "echo"
...     def act(self, obs, info):
...         return info["admissible_actions"][0]
>>> a = Echo()
>>> a.reset("EchoRL/Any-v0", "You see a door.", {"admissible_actions": ["open door"]}, seed=0)
>>> a.act("You see a door.", {"admissible_actions": ["open door"]})
'open door'
>>> a.stats()
{}
"""

from __future__ import annotations

from typing import Any

__all__ = ["Agent"]


class Agent:
    """Base class: an agent acting in an echorl text env (see the module docstring for the call order).

    Attributes:
        name: the registry name.
    """

    name = "agent"

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        """Start an episode (``seed`` makes stochastic agents reproducible)."""

    def act(self, obs: str, info: dict[str, Any]) -> str:  # pragma: no cover - every agent overrides
        raise TypeError(f"{type(self).__name__} must implement act()")

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        """See the result of the last action (agents that learn or keep history override this)."""

    def stats(self) -> dict[str, float]:
        """Counters for the summary (e.g. ``prompt_tokens``, ``cached_tokens``, ``generated_tokens``)."""
        return {}

    def close(self) -> None:
        """Release resources (models, engines)."""
