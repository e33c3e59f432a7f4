"""The LLM side of the prior cache: an LLM action prior (the agent that acts from it is
:class:`echorl_agent.agents.prior_cache.PriorCacheAgent`).

* :class:`LLMActionPrior` -- ``p_prior(a | s) = softmax_a(log pi_LLM(a | prompt(s)) / T)`` over the admissible
  actions, where ``log pi_LLM(a | .)`` is the log-likelihood of the reply ``a<end-of-turn>`` under a one-turn chat
  prompt (system + observation + admissible list), computed by :meth:`LLMEngine.score` with the prompt's KV shared
  by all candidates. One call = one LLM query.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["LLMActionPrior", "PRIOR_SYSTEM", "state_text"]

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
