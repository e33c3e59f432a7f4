"""EchoDQN: SB3's DQN trained from the hot/cold prioritized replay (EchoRL Algorithm 3).

Differences from ``stable_baselines3.DQN.train`` (whose structure this follows line by line):

* the default ``replay_buffer_class`` is :class:`~echorl_agent.replay.HotColdReplayBuffer`;
* the Huber loss of each transition is multiplied by its importance weight ``w_i`` (Schaul et al. 2016, Alg. 1
  line 11: ``Delta <- Delta + w_j delta_j grad Q``), i.e. ``loss = mean_i(w_i * huber(Q_i - y_i))``;
* after each gradient step the TD errors ``Q_i - y_i`` go back to the buffer with
  ``replay_buffer.update_priorities(indices, td_errors)``;
* when the Q-network's features extractor can produce plans (``features_extractor.plans(obs)``, as
  :class:`echorl_agent.policies.PlanFeaturesExtractor` does), the buffer takes tau_t from it (``plan_fn``).

With any other replay buffer (no ``weights``) the loss is SB3's unweighted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from echorl_agent.replay.buffer import HotColdReplayBuffer

__all__ = ["EchoDQN"]


class EchoDQN(DQN):
    """DQN with importance-weighted loss and TD-error priority updates (see module docstring).

    Takes every ``stable_baselines3.DQN`` argument; ``replay_buffer_class`` defaults to ``HotColdReplayBuffer``.
    """

    #: Replay defaults of EchoDQN (user ``replay_buffer_kwargs`` override them): the TD term with kappa = 0.6 and
    #: beta = 1 is proportional PER with alpha = 0.6 (Schaul et al. 2016); plans add the surprise term when the
    #: env (``info["plan"]``) or the Q-network's extractor provides them, otherwise there is no plan term.
    REPLAY_DEFAULTS: dict[str, Any] = {"td_weight": 0.6, "alpha": 0.0, "plan_fallback": "none"}

    def __init__(self, policy: Any, env: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("replay_buffer_class", HotColdReplayBuffer)
        if issubclass(kwargs["replay_buffer_class"], HotColdReplayBuffer):
            user = dict(kwargs.get("replay_buffer_kwargs") or {})
            if "config" not in user:
                kwargs["replay_buffer_kwargs"] = {**self.REPLAY_DEFAULTS, **user}
        super().__init__(policy, env, *args, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        buffer = self.replay_buffer
        extractor = getattr(self.q_net, "features_extractor", None)
        if isinstance(buffer, HotColdReplayBuffer) and buffer.plan_fn is None and hasattr(extractor, "plans"):
            buffer.plan_fn = self._plans_of

    def _plans_of(self, obs: np.ndarray) -> np.ndarray:
        """Plan means ``mu_t`` of the Q-network's trajectory encoder for raw observations ``obs``."""
        with th.no_grad():
            obs_t, _ = self.q_net.obs_to_tensor(obs)
            feats = self.q_net.features_extractor
            mu = feats.plans(self.q_net.preprocess_obs(obs_t) if hasattr(self.q_net, "preprocess_obs") else obs_t)[0]
        return mu.cpu().numpy()

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)

        losses, mean_weights = [], []
        for _ in range(gradient_steps):
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            with th.no_grad():
                next_q_values = self.q_net_target(replay_data.next_observations)
                next_q_values, _ = next_q_values.max(dim=1)
                next_q_values = next_q_values.reshape(-1, 1)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values

            current_q_values = self.q_net(replay_data.observations)
            current_q_values = th.gather(current_q_values, dim=1, index=replay_data.actions.long())

            weights = getattr(replay_data, "weights", None)
            if weights is None:
                loss = F.smooth_l1_loss(current_q_values, target_q_values)
            else:
                per_sample = F.smooth_l1_loss(current_q_values, target_q_values, reduction="none")
                loss = (weights * per_sample).mean()
                mean_weights.append(weights.mean().item())
            losses.append(loss.item())

            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()

            indices = getattr(replay_data, "indices", None)
            if indices is not None and hasattr(self.replay_buffer, "update_priorities"):
                td_errors = (current_q_values.detach() - target_q_values).reshape(-1)
                self.replay_buffer.update_priorities(indices, td_errors)

        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        if mean_weights:
            self.logger.record("train/is_weight_mean", np.mean(mean_weights))
