"""The LLM side of the prior cache: an LLM action prior, and agents that put the cache in front of it.

* :class:`LLMActionPrior` -- ``p_prior(a | s) = softmax_a(log pi_LLM(a | prompt(s)) / T)`` over the admissible
  actions, where ``log pi_LLM(a | .)`` is the log-likelihood of the reply ``a<end-of-turn>`` under a one-turn chat
  prompt (system + observation + admissible list), computed by :meth:`LLMEngine.score` with the prompt's KV shared
  by all candidates. One call = one LLM query.
* :class:`PriorCacheAgent` -- an eval-runner agent (``reset/act/observe/stats``) acting from that prior, either
  through an :class:`~echorl_agent.priors.cache.LLMPriorCache` (``use_cache=True``) or querying the LLM every step
  (``use_cache=False``, the baseline of ``benchmarks/prior_cache.py``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from echorl_agent.agent import Agent
from echorl_agent.priors.cache import LLMPriorCache, PriorCacheConfig

__all__ = ["LLMActionPrior", "PriorCacheAgent", "PRIOR_SYSTEM", "state_text"]

PRIOR_SYSTEM = "You are an agent in a text game. Reply with the single best action from the admissible actions."


def state_text(obs: str, info: dict[str, Any]) -> str:
    """The text a state is embedded and prompted from: the instruction (if any, and not already in ``obs``)
    followed by the observation -- the same convention as the SB3 wrappers' ``include_task``."""
    task = str(info.get("task") or "")
    return f"{task}\n{obs}" if task and task not in obs else obs


class LLMActionPrior:
    """``p_prior(a|s)`` from a causal LM's scores of each admissible action (module docstring).

    Args:
        engine: an :class:`echorl_agent.llm.engine.LLMEngine` (its prefix cache shares the system prompt's KV
            across queries).
        temperature: T of the softmax over log-likelihoods (> 0).
        system_prompt: the system turn of the prompt.

    Attributes:
        num_queries: LLM queries made so far.
        seconds: wall time spent in them.
    """

    def __init__(self, engine: Any, temperature: float = 1.0, system_prompt: str = PRIOR_SYSTEM) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got temperature={temperature}")
        self.engine = engine
        self.llm = engine.llm
        self.temperature = float(temperature)
        self.system_prompt = system_prompt
        self.num_queries = 0
        self.seconds = 0.0

    def prompt_ids(self, text: str, actions: list[str]) -> list[int]:
        """Token ids of the one-turn chat prompt for state ``text`` with ``actions`` listed."""
        user = text.strip() + "\nAdmissible actions: " + ", ".join(actions)
        return self.llm.chat_ids([{"role": "system", "content": self.system_prompt},
                                  {"role": "user", "content": user}])

    def log_likelihoods(self, text: str, actions: list[str]) -> np.ndarray:
        """``log pi_LLM(a<eos> | prompt)`` of each action (one LLM query)."""
        if not actions:
            raise ValueError("actions is empty: the LLM prior is over the admissible actions")
        t0 = time.perf_counter()
        eos = self.llm.eos_token_ids[:1]
        res = self.engine.score(self.prompt_ids(text, actions), [self.llm.encode(a) + eos for a in actions])
        self.num_queries += 1
        self.seconds += time.perf_counter() - t0
        return np.asarray(res.logprobs, dtype=np.float64)

    def __call__(self, text: str, actions: list[str]) -> np.ndarray:
        """The prior over ``actions`` (sums to 1)."""
        z = self.log_likelihoods(text, actions) / self.temperature
        p = np.exp(z - z.max())
        return p / p.sum()


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
