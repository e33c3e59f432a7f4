"""An eval-runner agent acting from the LLM action prior, with or without the prior cache in front of the LLM.

:class:`PriorCacheAgent` (``reset/act/observe/stats``) samples from
:class:`~echorl_agent.priors.llm.LLMActionPrior`, either through an
:class:`~echorl_agent.priors.cache.LLMPriorCache` (``use_cache=True``) or querying the LLM every step
(``use_cache=False``, the baseline of ``benchmarks/prior_cache.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_agent.agents.base import Agent
from echorl_agent.priors.cache import LLMPriorCache, PriorCacheConfig
from echorl_agent.priors.llm import LLMActionPrior, state_text

__all__ = ["PriorCacheAgent"]


class PriorCacheAgent(Agent):
    """Acts by sampling from the LLM prior, with or without the prior cache in front of the LLM.

    Args:
        prior: the :class:`LLMActionPrior`.
        encoder: a :class:`echorl_envs.wrappers.TextEncoder` giving state embeddings (e.g. ``MiniLMEncoder``).
        use_cache: put an :class:`LLMPriorCache` in front of the LLM (False: query it every step).
        cache_config: the cache's knobs.
        greedy: act with the prior's argmax instead of sampling from it.
    """

    name = "llm-prior-cache"

    def __init__(self, prior: LLMActionPrior, encoder: Any, use_cache: bool = True,
                 cache_config: PriorCacheConfig | None = None, greedy: bool = False) -> None:
        self.prior = prior
        self.encoder = encoder
        self.cache = LLMPriorCache(encoder.dim, cache_config) if use_cache else None
        self.greedy = greedy
        self.rng = np.random.default_rng(0)
        self.steps = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def distribution(self, obs: str, info: dict[str, Any]) -> np.ndarray:
        """p_prior over ``info["admissible_actions"]`` (from the cache when it hits)."""
        actions = list(info.get("admissible_actions") or [])
        text = state_text(obs, info)
        if self.cache is None:
            return self.prior(text, actions)
        return self.cache.lookup(self.encoder.encode_one(text), actions, lambda: self.prior(text, actions)).prior

    def act(self, obs: str, info: dict[str, Any]) -> str:
        actions = list(info.get("admissible_actions") or [])
        if not actions:
            raise ValueError("PriorCacheAgent needs info['admissible_actions'] (a choice env), got none")
        p = self.distribution(obs, info)
        self.steps += 1
        i = int(np.argmax(p)) if self.greedy else int(self.rng.choice(len(actions), p=p))
        return actions[i]

    def stats(self) -> dict[str, float]:
        out = {"llm_queries": float(self.prior.num_queries), "llm_seconds": self.prior.seconds,
               "agent_steps": float(self.steps)}
        if self.cache is not None:
            out.update({k: float(v) for k, v in self.cache.stats().items() if k != "llm_queries"})
        return out
