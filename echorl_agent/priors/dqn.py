"""Posterior-sampling exploration for SB3's DQN, with the LLM prior (through the cache) as the prior.

:class:`PosteriorDQN` is ``stable_baselines3.DQN`` whose behaviour policy during ``learn`` is the posterior of
:class:`~echorl_agent.priors.posterior.PosteriorSampler` instead of epsilon-greedy:

    a_t ~ pi(a | s_t) ∝ p_prior(a | s_t) · exp(Q_theta(s_t, a) / tau(h)),   tau(h) = 0.8 · exp(-2 h)

with ``p_prior`` from a prior source (:class:`LLMPriorSource`: the LLM prior behind an
:class:`~echorl_agent.priors.cache.LLMPriorCache`) and ``h`` the cache's running hit rate. During the warm-up
(``learning_starts``) Q is not used yet, so actions come from the prior alone. After each ``train`` call the mean
TD (Huber) loss goes to the cache (``record_td_error``, which raises delta when it climbs) and the change of the
Q-softmax on the current observations is reported as the policy shift (which drives the refresh rate).
``predict`` (evaluation) is DQN's own greedy argmax over Q, unchanged.

The prior source needs the text behind each encoded observation: build the env with :func:`make_prior_env`, which
inserts :class:`TextTap` (remembers the last text observation and info) under the SB3 wrappers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3 import DQN

from echorl_agent.priors.cache import LLMPriorCache, total_variation
from echorl_agent.priors.llm import state_text
from echorl_agent.priors.posterior import PosteriorSampler

__all__ = ["TextTap", "make_prior_env", "LLMPriorSource", "PosteriorDQN"]


class TextTap(gym.Wrapper):
    """Remembers the last text observation and info of a text env (``last_text``, ``last_info``), so code that
    only sees encoded observations (a prior source inside an SB3 algorithm) can recover the text."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.last_text = ""
        self.last_info: dict[str, Any] = {}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.last_text, self.last_info = obs, dict(info)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.last_text, self.last_info = obs, dict(info)
        return obs, reward, terminated, truncated, info


def make_prior_env(env_id: str, n_envs: int = 1, seed: int = 0, env_kwargs: dict[str, Any] | None = None,
                   **wrapper_kwargs: Any) -> Any:
    """A ``DummyVecEnv`` like :func:`echorl_envs.wrappers.make_sb3_env` with a :class:`TextTap` under the
    SB3 wrappers (``wrapper_kwargs`` as in :func:`echorl_envs.wrappers.wrap_text_env`)."""
    from stable_baselines3.common.env_util import make_vec_env

    from echorl_envs.wrappers import default_max_actions, make_encoder, wrap_text_env

    kwargs = dict(env_kwargs or {})
    enc = make_encoder(wrapper_kwargs.pop("encoder", "hash"), **(wrapper_kwargs.pop("encoder_kwargs", None) or {}))
    if wrapper_kwargs.get("max_actions") is None and wrapper_kwargs.get("vocabulary") is None:
        wrapper_kwargs["max_actions"] = default_max_actions(env_id, kwargs, seed)

    def env_fn() -> gym.Env:
        return wrap_text_env(TextTap(gym.make(env_id, **kwargs)), encoder=enc, **wrapper_kwargs)

    return make_vec_env(env_fn, n_envs=n_envs, seed=seed)


class LLMPriorSource:
    """p_prior over the discrete action slots of each env copy, from an LLM prior behind a prior cache.

    Args:
        prior: ``prior(text, actions) -> probs`` (e.g. :class:`~echorl_agent.priors.llm.LLMActionPrior`).
        encoder: state-embedding encoder (``encode_one(text) -> [dim]``).
        cache: an :class:`LLMPriorCache` (None: query ``prior`` at every step, hit rate 0).
    """

    def __init__(self, prior: Callable[[str, list[str]], np.ndarray], encoder: Any,
                 cache: LLMPriorCache | None = None) -> None:
        self.prior = prior
        self.encoder = encoder
        self.cache = cache

    @property
    def hit_rate(self) -> float:
        """h for tau(h): the cache's running hit rate (0 without a cache)."""
        return self.cache.hit_rate if self.cache is not None else 0.0

    def __call__(self, env: Any) -> np.ndarray:
        """``[n_envs, max_actions]`` priors for the current state of every copy of ``env`` (a VecEnv over
        :func:`make_prior_env` envs); empty slots get 0."""
        texts = env.get_attr("last_text")
        infos = env.get_attr("last_info")
        slots = env.env_method("slot_texts")
        out = np.zeros((len(texts), len(slots[0])), dtype=np.float64)
        for i, (obs, info, row) in enumerate(zip(texts, infos, slots, strict=True)):
            idx = [j for j, a in enumerate(row) if a is not None]
            if not idx:
                out[i] = 1.0 / out.shape[1]
                continue
            actions = [row[j] for j in idx]
            text = state_text(obs, info)
            if self.cache is None:
                p = self.prior(text, actions)
            else:
                emb = self.encoder.encode_one(text)
                p = self.cache.lookup(emb, actions, lambda t=text, a=actions: self.prior(t, a)).prior
            out[i, idx] = p
        return out


class PosteriorDQN(DQN):
    """SB3 DQN exploring by posterior sampling from an LLM prior and Q (module docstring).

    Takes every ``stable_baselines3.DQN`` argument plus:

    Args:
        prior_source: ``prior_source(vec_env) -> [n_envs, n_actions]`` priors, with a ``hit_rate`` attribute
            (:class:`LLMPriorSource`).
        posterior: the sampler (default ``PosteriorSampler()``: tau0=0.8, kappa=2).
        posterior_seed: seed of the posterior sampling.
    """

    def __init__(self, policy: Any, env: Any, *args: Any, prior_source: Callable[[Any], np.ndarray] | None = None,
                 posterior: PosteriorSampler | None = None, posterior_seed: int = 0, **kwargs: Any) -> None:
        if prior_source is None:
            raise ValueError("prior_source is required, got prior_source=None; pass LLMPriorSource(prior, encoder, "
                             "cache) built over an env from make_prior_env(...)")
        self.prior_source = prior_source
        self.posterior = posterior or PosteriorSampler()
        self._posterior_rng = np.random.default_rng(posterior_seed)
        super().__init__(policy, env, *args, **kwargs)

    def _q_values(self, obs: np.ndarray) -> np.ndarray:
        with th.no_grad():
            obs_t, _ = self.policy.obs_to_tensor(obs)
            return self.q_net(obs_t).cpu().numpy().astype(np.float64)

    def _sample_action(self, learning_starts: int, action_noise: Any = None, n_envs: int = 1
                       ) -> tuple[np.ndarray, np.ndarray]:
        assert self._last_obs is not None, "self._last_obs was not set"
        prior = self.prior_source(self.env)
        h = float(getattr(self.prior_source, "hit_rate", 0.0))
        if self.num_timesteps < learning_starts:
            q = np.zeros_like(prior)
        else:
            q = self._q_values(self._last_obs)  # type: ignore[arg-type]
        action = self.posterior.sample(prior, q, h, self._posterior_rng).astype(np.int64)
        return action, action

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        cache = getattr(self.prior_source, "cache", None)
        obs = self._last_obs
        before = self._q_values(obs) if cache is not None and obs is not None else None  # type: ignore[arg-type]
        super().train(gradient_steps, batch_size)
        if cache is None:
            return
        loss = self.logger.name_to_value.get("train/loss")
        if loss is not None:
            cache.record_td_error(float(loss))
        if before is not None:
            after = self._q_values(obs)  # type: ignore[arg-type]
            t = self.posterior.temperature(cache.hit_rate)

            def soft(q: np.ndarray) -> np.ndarray:
                z = q / t
                e = np.exp(z - z.max(-1, keepdims=True))
                return e / e.sum(-1, keepdims=True)

            pb, pa = soft(before), soft(after)
            cache.record_policy_shift(float(np.mean([total_variation(x, y) for x, y in zip(pb, pa, strict=True)])))
