"""``LLMPPO``: EchoPPO over :class:`~echorl_agent.llm_rl.policy.LLMPolicy` (EchoRL Algorithm 1/2 with the LM as pi).

``LLMPPO("LLMPolicy", env, ...)``: EchoPPO for the LM policy. On top of EchoPPO (PPO + lambda_KL * plan KL, masks):

* rollouts: the policy scores actions on the rollout engine and keeps each state's captured activations;
* before the update: old log-probabilities are recomputed by the learner (the PPO ratio is exactly 1 on the first
  minibatch) and the policy-gradient term is weighted by truncated importance weights
  ``min(pi_learner_old / pi_rollout, C)`` -- the rollout engine may compute the distribution differently (other
  kernels, quantized weights); logged as ``train/is_weight_mean`` and ``train/is_weight_max``;
* after the update: the adapters are merged into the engine's weights (:meth:`LLMPolicy.sync_engine`), whose
  prefix cache then never serves KV of the old weights (``train/weight_version``, ``train/sync_ms``);
* with ``replay`` (EchoRL's hot/cold replay, ``echorl`` with the PPO learner): each update mixes ``replay_ratio``
  replayed LLM transitions per fresh one, weighted by their prioritized-replay weight times
  ``min(pi_old / mu, C)``, and the rollout's transitions then enter the buffer
  (:mod:`echorl_agent.llm_rl.algorithms.ppo.replay`; ``train/replayed``, ``train/replay_items``, ``train/replay_hit_rate``,
  ``train/replay_mb_per_1000``, ``train/replay_is_weight_mean``).
"""

from __future__ import annotations

import time
from typing import Any

import torch as th

from echorl_agent.algorithms.echo_ppo import EchoPPO
from echorl_agent.llm_rl.algorithms.ppo.replay import PPOReplay, ReplayMinibatch, fresh_transitions
from echorl_agent.llm_rl.policy import LLMPolicy
from echorl_agent.replay.llm import LLMReplayBuffer

__all__ = ["LLMPPO"]


class LLMPPO(EchoPPO):
    """PPO/EchoPPO for the LLM policy (see the module docstring). Takes every ``EchoPPO`` argument."""

    policy_aliases = {**EchoPPO.policy_aliases, "LLMPolicy": LLMPolicy}  # noqa: RUF012
    policy: LLMPolicy

    def __init__(self, policy: Any, env: Any, *args: Any, replay: dict[str, Any] | None = None,
                 replay_ratio: float = 1.0, **kwargs: Any) -> None:
        """Args: every ``EchoPPO`` argument, plus ``replay`` (:class:`~echorl_agent.replay.llm.LLMReplayBuffer`
        keyword arguments, e.g. ``{"capacity": 4096, "replay_memory_mb": 1024}``; None: no replay) and
        ``replay_ratio`` (replayed items per fresh item in each update)."""
        if replay is not None and not isinstance(replay, dict):
            raise ValueError(f"replay must be None or a dict of LLMReplayBuffer arguments, got replay={replay!r}")
        kwargs.setdefault("use_masking", False)  # the policy reads the admissible list from the state itself
        super().__init__(policy, env, *args, **kwargs)
        self.replay: PPOReplay | None = None
        if replay is not None:
            buffer = LLMReplayBuffer(**{"capacity": 4096, **replay})
            self.replay = PPOReplay(buffer, replay_ratio, self.policy.cfg.is_truncation, self.seed)
            buffer.set_version(self.policy.lm.engine.weight_version)

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
        if self.replay is not None:
            fresh = fresh_transitions(self.policy, buf, self.policy.lm.engine.weight_version)
            self.replay.begin(self.policy, fresh, self.batch_size)

    def _replay_minibatch(self, n_fresh: int) -> ReplayMinibatch | None:
        return None if self.replay is None else self.replay.next_minibatch()

    def _pg_weights(self, data: Any) -> th.Tensor:
        return self.policy.importance_weights(data.observations, data.actions).to(data.advantages.device)

    def _after_train(self) -> None:
        t = time.perf_counter()
        version = self.policy.sync_engine()
        self.logger.record("train/sync_ms", 1000 * (time.perf_counter() - t))
        self.logger.record("train/weight_version", version)
        if self.replay is not None:
            for k, v in self.replay.end(version).items():
                self.logger.record(f"train/{k}", v)
        self.policy.clear_store()

    def _excluded_save_params(self) -> list[str]:
        # the replay buffer has its own checksummed file (algorithms.ppo.checkpoint.save_ppo writes it)
        return [*super()._excluded_save_params(), "replay"]

    def save(self, path: Any, exclude: Any = None, include: Any = None) -> None:
        """SB3's ``save``; a live ``TrainableLM`` passed as ``policy_kwargs["lm"]`` is not pickled (the adapter
        weights are in the policy's state dict)."""
        lm = self.policy_kwargs.pop("lm", None)
        try:
            super().save(path, exclude, include)
        finally:
            if lm is not None:
                self.policy_kwargs["lm"] = lm
