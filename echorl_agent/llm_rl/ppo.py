"""``LLMPPO``: EchoPPO over :class:`~echorl_agent.llm_rl.policy.LLMPolicy` (EchoRL Algorithm 1/2 with the LM as pi).

``LLMPPO("LLMPolicy", env, ...)``: EchoPPO for the LM policy. On top of EchoPPO (PPO + lambda_KL * plan KL, masks):

* rollouts: the policy scores actions on the rollout engine and keeps each state's captured activations;
* before the update: old log-probabilities are recomputed by the learner (the PPO ratio is exactly 1 on the first
  minibatch) and the policy-gradient term is weighted by truncated importance weights
  ``min(pi_learner_old / pi_rollout, C)`` -- the rollout engine may compute the distribution differently (other
  kernels, quantized weights); logged as ``train/is_weight_mean`` and ``train/is_weight_max``;
* after the update: the adapters are merged into the engine's weights (:meth:`LLMPolicy.sync_engine`), whose
  prefix cache then never serves KV of the old weights (``train/weight_version``, ``train/sync_ms``).
"""

from __future__ import annotations

import time
from typing import Any

import torch as th

from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.llm_rl.policy import LLMPolicy

__all__ = ["LLMPPO"]


class LLMPPO(EchoPPO):
    """PPO/EchoPPO for the LLM policy (see the module docstring). Takes every ``EchoPPO`` argument."""

    policy_aliases = {**EchoPPO.policy_aliases, "LLMPolicy": LLMPolicy}  # noqa: RUF012
    policy: LLMPolicy

    def __init__(self, policy: Any, env: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("use_masking", False)  # the policy reads the admissible list from the state itself
        super().__init__(policy, env, *args, **kwargs)

    def collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps) -> bool:
        self.policy.clear_store()
        self.policy.recording = True
        try:
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        finally:
            self.policy.recording = False

    def _before_train(self) -> None:
        buf = self.rollout_buffer
        obs = th.as_tensor(buf.observations.reshape(-1, buf.observations.shape[-1]))
        actions = th.as_tensor(buf.actions.reshape(-1))
        old, w = self.policy.refresh_old_log_prob(obs, actions)
        buf.log_probs[:] = old.cpu().numpy().reshape(buf.log_probs.shape)
        self.logger.record("train/is_weight_mean", float(w.mean()))
        self.logger.record("train/is_weight_max", float(w.max()))

    def _pg_weights(self, data: Any) -> th.Tensor:
        return self.policy.importance_weights(data.observations, data.actions).to(data.advantages.device)

    def _after_train(self) -> None:
        t = time.perf_counter()
        version = self.policy.sync_engine()
        self.logger.record("train/sync_ms", 1000 * (time.perf_counter() - t))
        self.logger.record("train/weight_version", version)
        self.policy.clear_store()

    def save(self, path: Any, exclude: Any = None, include: Any = None) -> None:
        """SB3's ``save``; a live ``TrainableLM`` passed as ``policy_kwargs["lm"]`` is not pickled (the adapter
        weights are in the policy's state dict)."""
        lm = self.policy_kwargs.pop("lm", None)
        try:
            super().save(path, exclude, include)
        finally:
            if lm is not None:
                self.policy_kwargs["lm"] = lm
