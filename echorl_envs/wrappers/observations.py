"""Encoded observations for SB3: text → ``Box``, the DRRN-style ``Dict`` variant, and the history window."""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from echorl_envs.wrappers.encoders import TextEncoder, make_encoder

__all__ = ["EncodedTextObservation", "HistoryWindow"]


class EncodedTextObservation(gym.Wrapper):
    """Encode text observations into a ``Box(-1, 1, (dim,))`` (or a ``Dict`` carrying the action set too).

    With ``include_actions=False`` the observation is ``encoder(text)``. With ``include_actions=True`` (needs an
    :class:`~echorl_envs.wrappers.actions.AdmissibleActionWrapper` underneath) it is a ``Dict``:

    * ``"obs"``: ``Box(-1, 1, (dim,))`` -- the encoded observation;
    * ``"actions"``: ``Box(-1, 1, (max_actions, dim))`` -- the encoded text of each action slot (zeros when empty);
    * ``"action_mask"``: ``MultiBinary(max_actions)`` -- the slots holding an admissible action,

    so a policy can score state-action pairs (He et al., 2016, DRRN: ``Q(s, a) = g(f(s), h(a))``) even when the
    action set changes every step (ALFWorld, WebShop). Encoders are L2-normalised, so values lie in ``[-1, 1]``.

    Args:
        env: a text env (possibly already wrapped by ``AdmissibleActionWrapper``).
        encoder: ``"hash"``, ``"minilm"`` or a :class:`~echorl_envs.wrappers.encoders.TextEncoder`.
        encoder_kwargs: keyword arguments of the named encoder (e.g. ``{"dim": 128}``).
        include_task: prepend ``info["task"]`` (the instruction) to every observation before encoding, so the
            policy sees the goal at every step and not only in the first observation.
        include_actions: return the ``Dict`` variant above.

    Example:
        >>> import echorl_envs
        >>> from echorl_envs.wrappers import AdmissibleActionWrapper, EncodedTextObservation
        >>> env = echorl_envs.make("EchoRL/MiniGrid-Empty-5x5-v0")
        >>> env = EncodedTextObservation(AdmissibleActionWrapper(env, max_actions=8), encoder_kwargs={"dim": 64},
        ...                              include_actions=True)
        >>> obs, info = env.reset(seed=0)
        >>> sorted(obs), obs["obs"].shape, obs["actions"].shape
        (['action_mask', 'actions', 'obs'], (64,), (8, 64))
        >>> bool(env.observation_space.contains(obs))
        True
    """

    def __init__(
        self,
        env: gym.Env,
        encoder: str | TextEncoder = "hash",
        encoder_kwargs: dict[str, Any] | None = None,
        include_task: bool = True,
        include_actions: bool = False,
    ) -> None:
        super().__init__(env)
        if not isinstance(env.observation_space, spaces.Text):
            raise ValueError(
                f"EncodedTextObservation needs a Text observation space, got {env.observation_space}; "
                "apply it directly on an echorl text env (or its action wrapper)"
            )
        self.encoder = make_encoder(encoder, **(encoder_kwargs or {}))
        self.include_task = bool(include_task)
        self.include_actions = bool(include_actions)
        dim = self.encoder.dim
        obs_space = spaces.Box(-1.0, 1.0, (dim,), np.float32)
        if include_actions:
            try:
                self._max_actions = int(env.get_wrapper_attr("max_actions"))
            except AttributeError as e:
                raise ValueError(
                    "include_actions=True needs an AdmissibleActionWrapper underneath; "
                    "wrap as EncodedTextObservation(AdmissibleActionWrapper(env, max_actions=...), ...)"
                ) from e
            self.observation_space = spaces.Dict(
                {
                    "obs": obs_space,
                    "actions": spaces.Box(-1.0, 1.0, (self._max_actions, dim), np.float32),
                    "action_mask": spaces.MultiBinary(self._max_actions),
                }
            )
        else:
            self.observation_space = obs_space

    def _text(self, obs: str, info: dict[str, Any]) -> str:
        task = info.get("task", "") if self.include_task else ""
        return f"{task}\n{obs}" if task else obs

    def _encode(self, obs: str, info: dict[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
        state = np.clip(self.encoder.encode_one(self._text(obs, info)), -1.0, 1.0).astype(np.float32)
        if not self.include_actions:
            return state
        slots = self.env.get_wrapper_attr("slot_texts")()
        actions = np.zeros((self._max_actions, self.encoder.dim), dtype=np.float32)
        filled = [i for i, t in enumerate(slots) if t is not None]
        if filled:
            actions[filled] = np.clip(self.encoder.encode([slots[i] for i in filled]), -1.0, 1.0)
        mask = np.asarray(self.env.get_wrapper_attr("action_masks")(), dtype=np.int8)
        return {"obs": state, "actions": actions, "action_mask": mask}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._encode(obs, info), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._encode(obs, info), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The action mask of the ``AdmissibleActionWrapper`` underneath (gymnasium 1.x wrappers do not forward
        attributes, so outer wrappers re-expose it for ``env.action_masks()`` calls)."""
        return self.env.get_wrapper_attr("action_masks")()


class HistoryWindow(gym.Wrapper):
    """Keep the last ``k + 2`` encoded observations: the window ``s_{t-k:t}`` and the one before it.

    EchoRL's plan distribution ``p_phi(tau_t | s_{t-k:t})`` (Eq. 1) and its consistency term
    ``KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})]`` (Eq. 3) need both windows, which overlap in
    ``k`` frames; storing ``k + 2`` frames gives both: ``obs[1:]`` is the current window (``obs[-1]`` = ``s_t``)
    and ``obs[:-1]`` the previous one. At reset the first observation fills every frame (gymnasium's
    ``FrameStackObservation(padding_type="reset")`` convention), so at ``t = 0`` both windows are equal and the
    consistency term is exactly zero. On a ``Dict`` observation only the ``"obs"`` entry is stacked.

    Args:
        env: an env with a ``Box(dim,)`` observation, or a ``Dict`` with an ``"obs"`` ``Box(dim,)`` entry.
        k: the window covers ``k + 1`` observations (``k = 0``: the current observation only).

    Example:
        >>> import echorl_envs
        >>> from echorl_envs.wrappers import AdmissibleActionWrapper, EncodedTextObservation, HistoryWindow
        >>> env = echorl_envs.make("EchoRL/MiniGrid-Empty-5x5-v0")
        >>> env = HistoryWindow(EncodedTextObservation(AdmissibleActionWrapper(env, max_actions=8)), k=3)
        >>> obs, _ = env.reset(seed=0)
        >>> obs.shape  # k + 2 frames of 256
        (5, 256)
        >>> bool((obs == obs[-1]).all())  # padded with the first observation
        True
        >>> obs2, *_ = env.step(0)
        >>> bool((obs2[-2] == obs[-1]).all())  # the window slides by one
        True
    """

    def __init__(self, env: gym.Env, k: int = 4) -> None:
        super().__init__(env)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be an int >= 0, got k={k!r}; e.g. k=4 (a window of 5 observations)")
        self.k = int(k)
        self.num_frames = self.k + 2
        space = env.observation_space
        self._key: str | None = None
        if isinstance(space, spaces.Dict):
            if "obs" not in space.spaces:
                raise ValueError(f"HistoryWindow needs a Dict observation with an 'obs' entry, got keys {list(space)}")
            self._key = "obs"
            base = space.spaces["obs"]
        else:
            base = space
        if not isinstance(base, spaces.Box) or len(base.shape) != 1:
            raise ValueError(f"HistoryWindow needs a 1-D Box observation (an encoded text), got {base}")
        stacked = spaces.Box(
            np.repeat(base.low[None], self.num_frames, 0), np.repeat(base.high[None], self.num_frames, 0),
            dtype=base.dtype,
        )
        if self._key is None:
            self.observation_space = stacked
        else:
            self.observation_space = spaces.Dict({**space.spaces, self._key: stacked})
        self._frames: deque[np.ndarray] = deque(maxlen=self.num_frames)

    def _out(self, obs: Any) -> Any:
        stacked = np.stack(self._frames)
        if self._key is None:
            return stacked
        return {**obs, self._key: stacked}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        frame = obs if self._key is None else obs[self._key]
        self._frames.clear()
        self._frames.extend([frame] * self.num_frames)
        return self._out(obs), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._frames.append(obs if self._key is None else obs[self._key])
        return self._out(obs), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The action mask of the ``AdmissibleActionWrapper`` underneath (gymnasium 1.x wrappers do not forward
        attributes, so outer wrappers re-expose it for ``env.action_masks()`` calls)."""
        return self.env.get_wrapper_attr("action_masks")()
