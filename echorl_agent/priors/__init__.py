"""Reuse of LLM priors: a prior cache keyed by state embeddings, posterior sampling, and their integrations.

* :class:`LLMPriorCache` -- embedding -> LLM prior over admissible actions, hit when the nearest stored embedding
  has cosine >= delta; K, delta and the refresh rate adapt online (:class:`AdaptiveController`).
* :class:`PosteriorSampler` -- pi(a|s) ∝ p_prior(a|s) · exp(Q(s,a)/tau(h)), tau(h) = 0.8 · exp(-2h).
* :class:`LLMActionPrior`, :class:`PriorCacheAgent` -- the LLM prior (SmolLM2 scoring) and an agent using it
  with or without the cache; :class:`PosteriorDQN` + :class:`LLMPriorSource` -- DQN exploring by posterior
  sampling. (The cache in front of the LLM scoring agent's call, ``CachedScoringAgent``, is an agent:
  :mod:`echorl_agent.agents.cached_scoring`.)
* :mod:`echorl_agent.priors.index` -- nearest-neighbour backends (numpy / faiss / hnswlib, ``"auto"``).
"""

from __future__ import annotations

from echorl_agent.priors.adaptive import AdaptiveConfig, AdaptiveController, AdaptiveRecord
from echorl_agent.priors.cache import (
    CacheCounters,
    LLMPriorCache,
    PriorCacheConfig,
    PriorLookup,
    total_variation,
)
from echorl_agent.priors.dqn import LLMPriorSource, PosteriorDQN, TextTap, make_prior_env
from echorl_agent.priors.index import AutoIndex, FaissIndex, HNSWIndex, NumpyIndex, make_index
from echorl_agent.priors.llm import LLMActionPrior, PriorCacheAgent, state_text
from echorl_agent.priors.posterior import PosteriorSampler

__all__ = [
    "AdaptiveConfig", "AdaptiveController", "AdaptiveRecord", "AutoIndex", "CacheCounters", "FaissIndex",
    "HNSWIndex", "LLMActionPrior", "LLMPriorCache", "LLMPriorSource", "NumpyIndex", "PosteriorDQN",
    "PosteriorSampler", "PriorCacheAgent", "PriorCacheConfig", "PriorLookup", "TextTap", "make_index",
    "make_prior_env", "state_text", "total_variation",
]


def __getattr__(name: str):
    if name == "CachedScoringAgent":
        # ImportError (not AttributeError) so that `from echorl_agent.priors import ...` shows this message
        raise ImportError("CachedScoringAgent moved with the other agents: "
                          "from echorl_agent.agents import CachedScoringAgent")
    raise AttributeError(f"module 'echorl_agent.priors' has no attribute {name!r}")
