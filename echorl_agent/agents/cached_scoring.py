"""The prior cache in front of the LLM scoring agent's call.

:class:`CachedScoringAgent` is :class:`echorl_agent.agents.chat.ScoringAgent` whose ``policy`` goes through an
:class:`~echorl_agent.priors.cache.LLMPriorCache`: the current state (instruction + latest observation) is embedded,
and on a hit the cached distribution over the admissible actions is used without scoring; on a miss (or a refresh)
the agent scores the candidates with the LLM as usual (shared-prefix KV) and the result is stored. The dialogue
history stays append-only either way, so later misses still reuse the prompt's KV.

The cache key is the current state only, while the scoring agent's prompt holds the whole dialogue: a hit
reuses the prior computed under a different history -- the approximation the prior cache makes by design.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from echorl_agent.agents.chat import ScoringAgent
from echorl_agent.llm import ScoreResult
from echorl_agent.priors.cache import LLMPriorCache, PriorCacheConfig
from echorl_agent.priors.llm import state_text

__all__ = ["CachedScoringAgent"]


class CachedScoringAgent(ScoringAgent):
    """:class:`ScoringAgent` with an :class:`LLMPriorCache` in front of its scoring call (module docstring).

    Args:
        engine: the shared :class:`~echorl_agent.llm.engine.LLMEngine`.
        encoder: state-embedding encoder (``dim``, ``encode_one(text)``), e.g. ``MiniLMEncoder()``.
        cache: an existing cache (shared across agents/episodes), or None to build one from ``cache_config``.
        cache_config: knobs of a new cache.
        **kwargs: :class:`ScoringAgent` arguments (``temperature``, ``seed``, ``system_prompt``).
    """

    def __init__(self, engine: Any, encoder: Any, cache: LLMPriorCache | None = None,
                 cache_config: PriorCacheConfig | None = None, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)
        self.encoder = encoder
        self.cache = cache if cache is not None else LLMPriorCache(encoder.dim, cache_config)
        self._state = ""

    name = "llm-score-cached"

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self._state = state_text(obs, info)
        super().reset(env_id, obs, info, seed)

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        self._state = state_text(obs, info)
        super().observe(action, obs, reward, done, info)

    def policy(self, admissible: list[str]) -> tuple[np.ndarray, Any]:
        """pi over ``admissible`` from the cache on a hit, else from the LLM (then stored)."""
        if not admissible:
            raise ValueError("CachedScoringAgent needs info['admissible_actions'] (a choice env), got an empty list")
        scored: list[Any] = []

        def compute() -> np.ndarray:
            probs, res = ScoringAgent.policy(self, admissible)
            scored.append(res)
            return probs

        look = self.cache.lookup(self.encoder.encode_one(self._state), admissible, compute)
        res = scored[-1] if scored else ScoreResult([], [], 0, 0)
        probs = look.prior
        if self.temperature == 0:
            probs = (probs == probs.max()).astype(np.float64)
            probs /= probs.sum()
        return probs, res
