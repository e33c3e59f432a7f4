"""EchoPolicy: an SB3 ``ActorCriticPolicy`` with a latent plan inferred from a history window (EchoRL Eq. 1-2).

Observation layouts (built by ``echorl_envs.wrappers.make_sb3_env(..., history=k)``):

* ``Box(k + 2, D)``: encoded observations, ``obs[:, 1:]`` = window ``s_{t-k:t}``, ``obs[:, :-1]`` = previous window;
* ``Dict`` with ``"obs"`` as above plus ``"actions"`` ``(A, D_a)`` and ``"action_mask"`` ``(A,)``
  (``include_actions=True``): actions are scored DRRN-style from the state-plan features and each action's
  encoding, so the action set may change every step.

Forward pass: ``F_phi(window) -> (mu, log sigma)`` (Eq. 1); the policy and value heads read
``[s_t, mu]`` through SB3's ``mlp_extractor`` (``net_arch``), i.e. the plan enters by concatenation (Eq. 2).
The mean ``mu`` is used (not a sample) so the PPO ratio compares the same function at rollout and update time;
``sigma`` shapes the plan-consistency KL that ``EchoPPO`` adds (Eq. 3, :func:`gaussian_kl`).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from echorl_agent.config import PlanningConfig

__all__ = ["EchoPolicy", "PlanFeaturesExtractor", "TrajectoryEncoder", "WindowFeaturesExtractor", "gaussian_kl"]

#: Logit given to masked actions (sb3-contrib's MaskableCategorical uses the same value).
MASKED_LOGIT = -1e8


def gaussian_kl(mu_p: th.Tensor, log_std_p: th.Tensor, mu_q: th.Tensor, log_std_q: th.Tensor) -> th.Tensor:
    """Closed-form ``KL[N(mu_p, sigma_p^2) || N(mu_q, sigma_q^2)]`` of diagonal Gaussians, summed over the last dim.

    ``sum_d log(sigma_q / sigma_p) + (sigma_p^2 + (mu_p - mu_q)^2) / (2 sigma_q^2) - 1/2`` (Kingma & Welling,
    2014, App. B). Exactly zero when both arguments are equal.
    """
    var_p = th.exp(2.0 * log_std_p)
    var_q = th.exp(2.0 * log_std_q)
    return (log_std_q - log_std_p + (var_p + (mu_p - mu_q) ** 2) / (2.0 * var_q) - 0.5).sum(-1)


class TrajectoryEncoder(nn.Module):
    """``F_phi``: a window of ``num_frames`` encoded observations ``[B, F, D]`` → ``(mu, log_std)`` ``[B, d]``.

    ``"mlp"``: flatten, then ``Linear → LayerNorm → ReLU → Dropout`` per ``encoder_arch`` entry (EchoRL appendix);
    ``"gru"``: a GRU of width ``encoder_arch[0]`` over the frames, last hidden state;
    ``"transformer"``: linear projection + learned positions, one pre-norm encoder layer, last frame's output.
    """

    def __init__(self, frame_dim: int, num_frames: int, cfg: PlanningConfig) -> None:
        super().__init__()
        self.cfg = cfg
        width = cfg.encoder_arch[0]
        if cfg.encoder == "mlp":
            layers: list[nn.Module] = [nn.Flatten()]
            size = frame_dim * num_frames
            for h in cfg.encoder_arch:
                layers += [nn.Linear(size, h), nn.LayerNorm(h), nn.ReLU(), nn.Dropout(cfg.dropout)]
                size = h
            self.body: nn.Module = nn.Sequential(*layers)
            out = size
        elif cfg.encoder == "gru":
            self.body = nn.GRU(frame_dim, width, batch_first=True)
            out = width
        else:
            self.proj = nn.Linear(frame_dim, width)
            self.pos = nn.Parameter(th.zeros(num_frames, width))
            layer = nn.TransformerEncoderLayer(
                width, cfg.num_heads, dim_feedforward=2 * width, dropout=cfg.dropout, batch_first=True, norm_first=True
            )
            self.body = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
            out = width
        self.hidden_dim = out
        self.head = nn.Linear(out, 2 * cfg.latent_dim)

    def hidden(self, window: th.Tensor) -> th.Tensor:
        """The encoder's output before the Gaussian head, ``[B, hidden_dim]``."""
        if self.cfg.encoder == "mlp":
            return self.body(window)
        if self.cfg.encoder == "gru":
            _, h_n = self.body(window)  # h_n: [1, B, H]
            return h_n[-1]
        return self.body(self.proj(window) + self.pos)[:, -1]  # [B, H]

    def forward(self, window: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        mu, log_std = self.head(self.hidden(window)).chunk(2, dim=-1)
        lo, hi = self.cfg.log_std_bounds
        return mu, log_std.clamp(lo, hi)


class PlanFeaturesExtractor(BaseFeaturesExtractor):
    """SB3 features extractor returning ``[s_t, mu_t]`` and holding the trajectory encoder ``F_phi``.

    Args:
        observation_space: ``Box(k + 2, D)`` or a ``Dict`` whose ``"obs"`` entry is that ``Box``.
        planning: the validated :class:`~echorl_agent.config.PlanningConfig` (``window`` already resolved).
    """

    def __init__(self, observation_space: spaces.Space, planning: PlanningConfig) -> None:
        box = observation_space["obs"] if isinstance(observation_space, spaces.Dict) else observation_space
        frames, frame_dim = box.shape
        super().__init__(observation_space, features_dim=frame_dim + planning.latent_dim)
        self.planning = planning
        self.encoder = TrajectoryEncoder(frame_dim, frames - 1, planning)

    @staticmethod
    def frames(obs: th.Tensor | dict[str, th.Tensor]) -> th.Tensor:
        """The stacked frames ``[B, k + 2, D]`` of a (possibly Dict) observation."""
        return obs["obs"] if isinstance(obs, dict) else obs

    def plans(self, obs: th.Tensor | dict[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """``(mu_t, log_std_t, mu_{t-1}, log_std_{t-1})`` from the window and the window shifted by one.

        The two windows go through separate, same-shaped calls, so identical windows give bitwise identical
        Gaussians (and a KL of exactly 0).
        """
        f = self.frames(obs)
        mu, log_std = self.encoder(f[:, 1:])
        mu_prev, log_std_prev = self.encoder(f[:, :-1])
        return mu, log_std, mu_prev, log_std_prev

    def forward(self, obs: th.Tensor | dict[str, th.Tensor]) -> th.Tensor:
        f = self.frames(obs)
        mu, _ = self.encoder(f[:, 1:])
        return th.cat([f[:, -1], mu], dim=-1)


class WindowFeaturesExtractor(BaseFeaturesExtractor):
    """``[s_t, h_t]`` with ``h_t`` the trajectory encoder's output over the window: the same encoder as
    :class:`PlanFeaturesExtractor` but no plan (no Gaussian head, no KL).

    A baseline for plain SB3 ``PPO``: it sees the same window through the same ``F_phi`` body as ``EchoPolicy``,
    so a comparison with ``EchoPPO`` isolates the latent plan and its consistency term::

        PPO("MlpPolicy", vec, policy_kwargs={"features_extractor_class": WindowFeaturesExtractor,
                                             "features_extractor_kwargs": {"planning": PlanningConfig()}})

    Args:
        observation_space: ``Box(k + 2, D)`` (from ``make_sb3_env(..., history=k)``).
        planning: encoder settings (``encoder``, ``encoder_arch``, ``dropout``, ``num_heads``); ``latent_dim`` and
            ``kl_coef`` are unused.
    """

    def __init__(self, observation_space: spaces.Space, planning: PlanningConfig | None = None) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 2 or observation_space.shape[0] < 2:
            raise ValueError(
                f"WindowFeaturesExtractor needs a history window observation Box(k + 2, D), got {observation_space}; "
                "build the env with make_sb3_env(env_id, history=k)"
            )
        frames, frame_dim = observation_space.shape
        encoder = TrajectoryEncoder(frame_dim, frames - 1, planning or PlanningConfig())
        del encoder.head  # no plan: only the body is used (``hidden``)
        super().__init__(observation_space, features_dim=frame_dim + encoder.hidden_dim)
        self.encoder = encoder

    def forward(self, obs: th.Tensor) -> th.Tensor:
        return th.cat([obs[:, -1], self.encoder.hidden(obs[:, 1:])], dim=-1)


_BASE_KWARGS = set(inspect.signature(ActorCriticPolicy.__init__).parameters) - {"self"}
_PLAN_FIELDS = set(PlanningConfig.__dataclass_fields__)


class EchoPolicy(ActorCriticPolicy):
    """Actor-critic with a latent plan ``tau ~ N(mu, sigma^2) = F_phi(s_{t-k:t})`` and masked logits.

    Configure through ``policy_kwargs``: any ``ActorCriticPolicy`` argument (``net_arch``, ``activation_fn``,
    ...), ``planning=PlanningConfig(...)`` and/or ``PlanningConfig`` fields directly (``window``, ``latent_dim``,
    ``encoder``, ``kl_coef``, ...). Unknown keys and bad values raise ``ValueError`` naming the field.
    ``window`` defaults to the env's history window (``make_sb3_env(..., history=k)``).

    Masks: a ``Dict`` observation's ``"action_mask"`` is applied automatically; ``action_masks=`` (the
    sb3-contrib ``MaskablePPO`` protocol, used by ``EchoPPO``) is applied on top.

    Example:
        >>> from echorl_envs.wrappers import make_sb3_env
        >>> from echorl_agent import EchoPPO
        >>> vec = make_sb3_env("EchoRL/MiniGrid-Empty-5x5-v0", history=2)
        >>> model = EchoPPO("EchoPolicy", vec, n_steps=32, batch_size=32, policy_kwargs={"latent_dim": 8}, seed=0)
        >>> model.policy.planning.window, model.policy.planning.latent_dim
        (2, 8)
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, lr_schedule: Any, **kwargs: Any):
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(
                f"EchoPolicy needs a Discrete action space (admissible text actions), got {action_space}; "
                "build the env with echorl_envs.wrappers.make_sb3_env"
            )
        plan_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _PLAN_FIELDS or k == "planning"}
        unknown = sorted(set(kwargs) - _BASE_KWARGS)
        if unknown:
            options = sorted(_BASE_KWARGS | _PLAN_FIELDS | {"planning"})
            hint = difflib.get_close_matches(unknown[0], options, n=1)
            raise ValueError(
                f"unknown policy_kwargs key {unknown[0]!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                + " (EchoPolicy accepts ActorCriticPolicy arguments and PlanningConfig fields)"
            )
        frames_space = observation_space["obs"] if isinstance(observation_space, spaces.Dict) else observation_space
        if not isinstance(frames_space, spaces.Box) or len(frames_space.shape) != 2 or frames_space.shape[0] < 2:
            raise ValueError(
                f"EchoPolicy needs a history window observation Box(k + 2, D), got {frames_space}; "
                "build the env with make_sb3_env(env_id, history=k)"
            )
        env_window = frames_space.shape[0] - 2
        cfg = PlanningConfig.from_kwargs(**plan_kwargs)
        if cfg.window is None:
            cfg = dataclasses.replace(cfg, window=env_window)
        if cfg.window != env_window:
            raise ValueError(
                f"window={cfg.window} needs observations of {cfg.window + 2} frames, but the env gives "
                f"{frames_space.shape[0]} (history={env_window}); set window={env_window} or "
                f"make_sb3_env(..., history={cfg.window})"
            )
        self.planning = cfg
        self._drrn = isinstance(observation_space, spaces.Dict) and "actions" in observation_space.spaces
        if kwargs.get("features_extractor_class") not in (None, PlanFeaturesExtractor):
            raise ValueError(
                "features_extractor_class must be left to EchoPolicy (it holds the trajectory encoder), got "
                f"features_extractor_class={kwargs['features_extractor_class']!r}"
            )
        if not kwargs.get("share_features_extractor", True):
            raise ValueError(
                "share_features_extractor must be True for EchoPolicy (actor and critic read the same plan), "
                "got share_features_extractor=False"
            )
        kwargs["features_extractor_class"] = PlanFeaturesExtractor
        kwargs["features_extractor_kwargs"] = {"planning": cfg}
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        # SB3's orthogonal init (gain sqrt(2)) makes |mu| large at start; start the plan head near 0 so the
        # policy first reads s_t and the plan grows as it becomes useful (like SB3's 0.01 gain on action_net).
        head = self.pi_features_extractor.encoder.head
        nn.init.orthogonal_(head.weight, gain=0.1)
        nn.init.zeros_(head.bias)
        if self._drrn:
            action_dim = self.observation_space["actions"].shape[-1]
            hidden = self.mlp_extractor.latent_dim_pi
            # DRRN-style scorer: logit_i = g([latent_pi, enc(a_i)])  (He et al., 2016)
            self.action_scorer = nn.Sequential(
                nn.Linear(self.mlp_extractor.latent_dim_pi + action_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1)
            )
            self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.pop("features_extractor_class", None)
        data.pop("features_extractor_kwargs", None)
        data["planning"] = self.planning
        return data

    # ------------------------------------------------------------------ forward passes
    def _masks(self, obs: Any, action_masks: Any, like: th.Tensor) -> th.Tensor | None:
        mask = None
        if isinstance(obs, dict) and "action_mask" in obs:
            mask = obs["action_mask"].reshape(like.shape) > 0.5
        if action_masks is not None:
            given = th.as_tensor(np.asarray(action_masks) if not th.is_tensor(action_masks) else action_masks)
            given = given.to(like.device).reshape(like.shape).bool()
            mask = given if mask is None else mask & given
        if mask is not None:
            mask = mask | ~mask.any(dim=-1, keepdim=True)  # never an all-false row
        return mask

    def _logits(self, obs: Any, latent_pi: th.Tensor) -> th.Tensor:
        if not self._drrn:
            return self.action_net(latent_pi)
        acts = obs["actions"]  # [B, A, D_a]
        pairs = th.cat([latent_pi.unsqueeze(1).expand(-1, acts.shape[1], -1), acts], dim=-1)
        return self.action_scorer(pairs).squeeze(-1)  # [B, A]

    def _dist_values(self, obs: Any, features: th.Tensor, action_masks: Any = None):
        latent_pi, latent_vf = self.mlp_extractor(features)
        logits = self._logits(obs, latent_pi)
        mask = self._masks(obs, action_masks, logits)
        if mask is not None:
            logits = th.where(mask, logits, th.full_like(logits, MASKED_LOGIT))
        return self.action_dist.proba_distribution(action_logits=logits), self.value_net(latent_vf)

    def forward(self, obs: Any, deterministic: bool = False, action_masks: Any = None):
        dist, values = self._dist_values(obs, self.extract_features(obs, self.pi_features_extractor), action_masks)
        actions = dist.get_actions(deterministic=deterministic)
        return actions, values, dist.log_prob(actions)

    def evaluate_actions(self, obs: Any, actions: th.Tensor, action_masks: Any = None):
        values, log_prob, entropy, _ = self.evaluate_actions_and_plans(obs, actions, action_masks)
        return values, log_prob, entropy

    def evaluate_actions_and_plans(self, obs: Any, actions: th.Tensor, action_masks: Any = None):
        """``(values, log_prob, entropy, (mu_t, log_std_t, mu_{t-1}, log_std_{t-1}))`` in one encoder pass."""
        pre = self._preprocess(obs)
        extractor: PlanFeaturesExtractor = self.pi_features_extractor  # type: ignore[assignment]
        mu, log_std, mu_prev, log_std_prev = extractor.plans(pre)
        features = th.cat([extractor.frames(pre)[:, -1], mu], dim=-1)
        dist, values = self._dist_values(obs, features, action_masks)
        return values, dist.log_prob(actions), dist.entropy(), (mu, log_std, mu_prev, log_std_prev)

    def _preprocess(self, obs: Any) -> Any:
        from stable_baselines3.common.preprocessing import preprocess_obs

        return preprocess_obs(obs, self.observation_space, normalize_images=self.normalize_images)

    def plan_kl(self, obs: Any) -> th.Tensor:
        """Per-sample ``KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})]`` (EchoRL Eq. 3), shape ``[B]``."""
        return gaussian_kl(*self.pi_features_extractor.plans(self._preprocess(obs)))

    def get_distribution(self, obs: Any, action_masks: Any = None):
        features = self.extract_features(obs, self.pi_features_extractor)
        latent_pi = self.mlp_extractor.forward_actor(features)
        logits = self._logits(obs, latent_pi)
        mask = self._masks(obs, action_masks, logits)
        if mask is not None:
            logits = th.where(mask, logits, th.full_like(logits, MASKED_LOGIT))
        return self.action_dist.proba_distribution(action_logits=logits)

    def _predict(self, observation: Any, deterministic: bool = False, action_masks: Any = None) -> th.Tensor:
        return self.get_distribution(observation, action_masks).get_actions(deterministic=deterministic)

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict`` plus sb3-contrib's ``action_masks`` argument."""
        self.set_training_mode(False)
        obs_tensor, vectorized = self.obs_to_tensor(observation)
        with th.no_grad():
            actions = self._predict(obs_tensor, deterministic=deterministic, action_masks=action_masks)
        actions = actions.cpu().numpy().reshape((-1, *self.action_space.shape))
        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions, state
