"""EchoPPO: SB3's PPO plus EchoRL's plan-consistency term, with MaskablePPO-style action masks.

Loss (EchoRL Eq. 3 / Algorithm 2)::

    L = L_clip + c_vf * L_vf - c_ent * H[pi] + lambda_KL * E_t KL[p_phi(tau_t | s_{t-k:t}) || p_phi(tau_{t-1} | s_{t-k-1:t-1})]

with the closed-form Gaussian KL (:func:`echorl_agent.policies.gaussian_kl`) between the plan of the window and
of the window shifted by one step, both read from the same stacked observation (``HistoryWindow``).
``lambda_KL`` is ``PlanningConfig.kl_coef`` (``policy_kwargs={"kl_coef": ...}``).

Masks follow sb3-contrib's ``MaskablePPO``: at every rollout step ``env.env_method("action_masks")`` is read
(when the env provides it), stored in a ``MaskableRolloutBuffer`` and re-applied in the update, so the
probability ratio compares the same masked distributions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import explained_variance, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch.nn import functional as F

from echorl_agent.policies import EchoPolicy, gaussian_kl

__all__ = ["EchoPPO"]


class EchoPPO(PPO):
    """PPO with EchoRL latent planning (``"EchoPolicy"``) and optional action masking.

    Takes every ``PPO`` argument, plus ``use_masking`` (default True: use the env's ``action_masks()`` when it
    has one). Logs ``train/plan_kl`` (mean KL between consecutive plan Gaussians) and ``train/plan_norm``
    (mean ``||mu_t||``) next to PPO's usual ``train/*`` keys, so TensorBoard shows them.

    Example:
        >>> from echorl_envs.wrappers import make_sb3_env
        >>> vec = make_sb3_env("EchoRL/MiniGrid-Empty-5x5-v0", history=2)
        >>> model = EchoPPO("EchoPolicy", vec, n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(32)
        >>> sorted(k for k in model.logger.name_to_value if k.startswith("train/plan"))
        ['train/plan_kl', 'train/plan_norm']
    """

    policy_aliases = {**PPO.policy_aliases, "EchoPolicy": EchoPolicy}  # noqa: RUF012
    policy: EchoPolicy

    def __init__(self, policy: str | type[EchoPolicy], env: Any, *args: Any, use_masking: bool = True, **kwargs: Any):
        if type(self) is EchoPPO and (policy == "LLMPolicy" or getattr(policy, "__name__", "") == "LLMPolicy"):
            raise ValueError("policy='LLMPolicy' trains the LM itself: use LLMPPO('LLMPolicy', env, ...) "
                             "(from echorl_agent import LLMPPO), which takes every EchoPPO argument")
        self.use_masking = bool(use_masking)
        super().__init__(policy, env, *args, **kwargs)


    def _setup_model(self) -> None:
        if not (isinstance(self.policy_class, type) and hasattr(self.policy_class, "evaluate_actions_and_plans")):
            raise ValueError(
                f"EchoPPO needs policy='EchoPolicy' (or a subclass), got policy={self.policy_class!r}; "
                "use stable_baselines3.PPO for other policies"
            )
        if self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = MaskableDictRolloutBuffer if dict_obs else MaskableRolloutBuffer
        super()._setup_model()

    # ------------------------------------------------------------------ rollouts (MaskablePPO-style)
    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """PPO's rollout loop, reading ``action_masks()`` before each step and storing them with the step."""
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        masked = self.use_masking and is_masking_supported(env)
        maskable = isinstance(rollout_buffer, (MaskableRolloutBuffer, MaskableDictRolloutBuffer))
        n_steps = 0
        rollout_buffer.reset()
        callback.on_rollout_start()
        while n_steps < n_rollout_steps:
            action_masks = get_action_masks(env) if masked else None
            with th.no_grad():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions, values, log_probs = self.policy(obs_tensor, action_masks=action_masks)
            actions = actions.cpu().numpy()
            new_obs, rewards, dones, infos = env.step(actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            actions = actions.reshape(-1, 1)
            # Bootstrap on time-limit truncation (SB3 issue #633), as PPO does.
            for idx, done in enumerate(dones):
                if done and infos[idx].get("terminal_observation") is not None and infos[idx].get(
                    "TimeLimit.truncated", False
                ):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.no_grad():
                        terminal_value = self.policy.predict_values(terminal_obs)[0]
                    rewards[idx] += self.gamma * terminal_value
            extra = {"action_masks": action_masks} if maskable else {}
            rollout_buffer.add(
                self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs, **extra  # type: ignore[arg-type]
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
        with th.no_grad():
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    # ------------------------------------------------------------------ update (PPO + lambda_KL * plan KL)
    def train(self) -> None:
        """PPO's clipped update (SB3 ``PPO.train``) with the plan-consistency KL added to the loss."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self._before_train()
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = None
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]
        kl_coef = float(self.policy.planning.kl_coef)
        entropy_losses, pg_losses, value_losses, clip_fractions = [], [], [], []
        plan_kls, plan_norms, approx_kl_divs = [], [], []
        continue_training = True
        loss = th.zeros(())
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            for data in self.rollout_buffer.get(self.batch_size):
                actions = data.actions.long().flatten()
                masks = getattr(data, "action_masks", None)
                values, log_prob, entropy, plans = self.policy.evaluate_actions_and_plans(
                    data.observations, actions, action_masks=masks
                )
                values = values.flatten()
                n = len(actions)
                replay = self._replay_minibatch(n)  # LLMPPO: replayed (off-policy) items mixed into this minibatch
                advantages = data.advantages if replay is None else th.cat([data.advantages, replay.advantages])
                if self.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                ratio = th.exp(log_prob - data.old_log_prob)
                surrogate = th.min(advantages[:n] * ratio, advantages[:n] * th.clamp(ratio, 1 - clip_range, 1 + clip_range))
                weights = self._pg_weights(data)
                pg_terms = surrogate if weights is None else weights * surrogate
                clip_fractions.append(th.mean((th.abs(ratio - 1) > clip_range).float()).item())
                if clip_range_vf is None:
                    values_pred = values
                else:
                    values_pred = data.old_values + th.clamp(values - data.old_values, -clip_range_vf, clip_range_vf)
                if replay is None:
                    value_loss = F.mse_loss(data.returns, values_pred)
                else:  # one mean over the mixed minibatch; replayed terms carry their weights
                    replay_pg, replay_vf = replay.loss_terms(advantages[n:], clip_range)
                    pg_terms = th.cat([pg_terms, replay_pg])
                    value_loss = th.cat([(data.returns - values_pred) ** 2, replay_vf]).mean()
                policy_loss = -pg_terms.mean()
                pg_losses.append(policy_loss.item())
                value_losses.append(value_loss.item())
                entropy_loss = -th.mean(entropy)
                entropy_losses.append(entropy_loss.item())
                plan_kl = gaussian_kl(*plans).mean()  # EchoRL Eq. 3
                plan_kls.append(plan_kl.item())
                plan_norms.append(plans[0].norm(dim=-1).mean().item())
                loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss + kl_coef * plan_kl

                with th.no_grad():
                    log_ratio = log_prob - data.old_log_prob
                    approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
                    approx_kl_divs.append(approx_kl_div)
                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        self.logger.info(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
                    break
                self.policy.optimizer.zero_grad()
                loss.backward()
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += 1
            if not continue_training:
                break

        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/plan_kl", np.mean(plan_kls))
        self.logger.record("train/plan_norm", np.mean(plan_norms))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        self._after_train()

    # ------------------------------------------------------------------ hooks (LLMPPO)
    def _before_train(self) -> None:
        """Called before the epochs of an update."""

    def _pg_weights(self, data: Any) -> th.Tensor | None:
        """Per-sample weights of the policy-gradient term (None: all 1)."""
        return None

    def _replay_minibatch(self, n_fresh: int) -> Any:
        """Replayed items to mix into a minibatch of ``n_fresh`` fresh ones (None: none). The result has
        ``advantages [m]`` and ``loss_terms(advantages, clip_range) -> (surrogate [m], value error [m])``, both
        already weighted (see :class:`~echorl_agent.llm_rl.algorithms.ppo.replay.ReplayMinibatch`)."""
        return None

    def _after_train(self) -> None:
        """Called after an update."""

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict`` with sb3-contrib's ``action_masks`` (from ``env.action_masks()``)."""
        return self.policy.predict(observation, state, episode_start, deterministic, action_masks=action_masks)
