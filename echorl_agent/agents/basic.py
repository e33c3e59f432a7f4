"""The agents that need no model: ``random`` (the baseline every agent is compared with) and ``expert``."""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_agent.agents.base import Agent

__all__ = ["RandomAgent", "ExpertAgent"]


class RandomAgent(Agent):
    """Uniform over the admissible actions; on a search page with nothing to click (WebShop's
    ``info["has_search_bar"]``), searches the instruction as WebShop's random baseline does; on free-text envs, a
    uniform integer answer in [0, 100]."""

    name = "random"

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        adm = info.get("admissible_actions") or []
        if adm:
            return adm[int(self.rng.integers(len(adm)))]
        if info.get("has_search_bar"):
            return f"search[{info['task']}]"
        return str(int(self.rng.integers(0, 101)))


class ExpertAgent(Agent):
    """Follows ``info["expert_action"]`` (the env's expert, oracle or walkthrough): an upper bound."""

    name = "expert"

    def act(self, obs: str, info: dict[str, Any]) -> str:
        action = info.get("expert_action")
        if action is None:
            # No expert at this step (e.g. the expert has no plan from here): do nothing the env accepts.
            adm = info.get("admissible_actions") or []
            return adm[0] if adm else ""
        return action
