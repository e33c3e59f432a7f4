"""Reuse of LLM priors: a prior cache keyed by state embeddings, posterior sampling, and their integrations.

* :class:`LLMPriorCache` -- embedding -> LLM prior over admissible actions, hit when the nearest stored embedding
  has cosine >= delta; K, delta and the refresh rate adapt online (:class:`AdaptiveController`).
* :class:`PosteriorSampler` -- pi(a|s) ∝ p_prior(a|s) · exp(Q(s,a)/tau(h)), tau(h) = 0.8 · exp(-2h).
* :class:`LLMActionPrior` -- the LLM prior (SmolLM2 scoring); :class:`PosteriorDQN` + :class:`LLMPriorSource` --
  DQN exploring by posterior sampling. The agents that act from the prior live with the other agents:
  ``PriorCacheAgent`` and ``CachedScoringAgent`` in :mod:`echorl_agent.agents`.
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
from echorl_agent.priors.llm import LLMActionPrior, state_text
from echorl_agent.priors.posterior import PosteriorSampler

__all__ = [
    "AdaptiveConfig", "AdaptiveController", "AdaptiveRecord", "AutoIndex", "CacheCounters", "FaissIndex",
    "HNSWIndex", "LLMActionPrior", "LLMPriorCache", "LLMPriorSource", "NumpyIndex", "PosteriorDQN",
    "PosteriorSampler", "PriorCacheConfig", "PriorLookup", "TextTap", "make_index",
    "make_prior_env", "state_text", "total_variation",
]

