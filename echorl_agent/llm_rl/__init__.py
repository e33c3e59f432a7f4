"""The language model itself learning by RL: LLM policies and one folder per RL method.

* :class:`LLMPolicy` -- pi(a|s, tau) over admissible actions scored by the LM (+ value head, + latent plan);
* :mod:`~echorl_agent.llm_rl.algorithms` -- one folder per method, each a Config + trainer on one protocol, and the
  registry ``echorl train-llm``, checkpoints and the ``llm-*`` bench agents are generated from:

  * :class:`LLMPPO` -- ``LLMPPO("LLMPolicy", env)``: PPO/EchoPPO for the LM, rollouts on the KV-aware engine, learner
    reusing the rollout's frozen-layer activations, truncated importance weights, weight sync;
  * :class:`GiGPOTrainer` (:class:`GiGPOConfig`) -- critic-free group RL on choice envs, K episodes per seed;
  * :class:`GRPOTrainer` (:class:`GRPOConfig`) -- GRPO for free-text envs;
  * :func:`behaviour_clone` / :func:`collect_expert_states` -- behaviour cloning on the env's expert (warm starts);
  * :func:`collect_policy_states` / :func:`merge_data` -- DAgger: the expert labels the states the policy reached;

* :func:`~echorl_agent.llm_rl.train.train_llm` -- one entry point for every registered method.

Heavy dependencies (transformers, peft) load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMPolicy": "policy",
    "LLMPPO": "algorithms.ppo.llm_ppo",
    "LLMPolicyConfig": "config",
    "TrainableLM": "lm",
    "behaviour_clone": "algorithms.bc.clone",
    "collect_expert_states": "algorithms.bc.clone",
    "collect_policy_states": "algorithms.bc.dagger",
    "merge_data": "algorithms.bc.dagger",
    "GRPOConfig": "algorithms.grpo.config",
    "GRPOTrainer": "algorithms.grpo.trainer",
    "GiGPOConfig": "algorithms.gigpo.config",
    "GiGPOTrainer": "algorithms.gigpo.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"echorl_agent.llm_rl.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'echorl_agent.llm_rl' has no attribute {name!r}")
