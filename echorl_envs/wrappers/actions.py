"""Admissible text actions → ``Discrete(max_actions)`` with an action mask (sb3-contrib ``MaskablePPO``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["AdmissibleActionWrapper"]


class AdmissibleActionWrapper(gym.Wrapper):
    """Turn a text env's admissible actions into ``Discrete(max_actions)`` plus ``action_masks()``.

    Two ways to number actions:

    * ``vocabulary=None`` (positional, for action sets that change every step such as ALFWorld or WebShop):
      index ``i`` means the ``i``-th entry of ``info["admissible_actions"]`` *now*; the mask marks
      ``i < len(admissible)``. Admissible lists longer than ``max_actions`` are cut (with a warning once).
    * ``vocabulary=[...]`` (fixed, for MiniGrid-like envs): index ``i`` always means ``vocabulary[i]``; the mask
      marks the vocabulary entries that are admissible now.

    An index without an action (no mask used, e.g. ``PPO``/``DQN``) is forwarded to the env as a text that
    matches nothing, so the env answers as for any invalid action (feedback observation,
    ``info["invalid_action"]=True``, reward 0, the step counts) -- it never raises. ``action_masks()`` is the
    method sb3-contrib's ``MaskablePPO`` looks up through the wrappers (``get_wrapper_attr``); when the env
    lists no admissible action (episode over, free-text env) every slot is marked valid rather than none,
    since an all-false mask has no distribution.

    Args:
        env: a text env (``str`` observations and actions, ``info["admissible_actions"]``).
        max_actions: size of the discrete action space (default: ``len(vocabulary)``; required otherwise).
        vocabulary: fixed action texts, or ``None`` for positional numbering.

    Example:
        >>> import echorl_envs
        >>> env = AdmissibleActionWrapper(echorl_envs.make("EchoRL/MiniGrid-Empty-5x5-v0"), max_actions=8)
        >>> obs, info = env.reset(seed=0)
        >>> env.slot_texts()[:2] == info["admissible_actions"][:2], env.slot_texts()[-1]
        (True, None)
        >>> env.action_masks().tolist()
        [True, True, True, True, True, True, True, False]
        >>> obs, reward, terminated, truncated, info = env.step(7)  # an empty slot: the env calls it invalid
        >>> info["invalid_action"], reward
        (True, 0.0)
    """

    def __init__(self, env: gym.Env, max_actions: int | None = None, vocabulary: Sequence[str] | None = None):
        super().__init__(env)
        if vocabulary is not None:
            vocabulary = [str(a) for a in vocabulary]
            if not vocabulary:
                raise ValueError("vocabulary must list at least one action, got vocabulary=[]")
            if max_actions is None:
                max_actions = len(vocabulary)
            elif max_actions != len(vocabulary):
                raise ValueError(
                    f"max_actions must equal len(vocabulary)={len(vocabulary)} when a vocabulary is given, "
                    f"got max_actions={max_actions}; drop max_actions"
                )
        if max_actions is None:
            raise ValueError("max_actions is required without a vocabulary, got max_actions=None; e.g. max_actions=32")
        if isinstance(max_actions, bool) or not isinstance(max_actions, (int, np.integer)) or max_actions < 1:
            raise ValueError(f"max_actions must be a positive int, got max_actions={max_actions!r}")
        self.max_actions = int(max_actions)
        self.vocabulary = vocabulary
        self.action_space = spaces.Discrete(self.max_actions)
        self._admissible: list[str] = []
        self._warned = False

    def _track(self, info: dict[str, Any]) -> None:
        self._admissible = [str(a) for a in info.get("admissible_actions", [])]
        if self.vocabulary is None and len(self._admissible) > self.max_actions and not self._warned:
            self._warned = True
            warnings.warn(
                f"{len(self._admissible)} admissible actions exceed max_actions={self.max_actions}; "
                f"the last {len(self._admissible) - self.max_actions} are unreachable (raise max_actions)",
                stacklevel=3,
            )

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._track(info)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        text = self.action_text(int(action))
        obs, reward, terminated, truncated, info = self.env.step(text)
        self._track(info)
        return obs, reward, terminated, truncated, info

    def action_text(self, index: int) -> str:
        """The text sent to the env for ``index`` (an unmatchable text for an empty slot)."""
        if not 0 <= index < self.max_actions:
            raise ValueError(f"action must be in [0, {self.max_actions}), got action={index}")
        text = self.slot_texts()[index]
        if text is None:
            if self.vocabulary is not None:
                return self.vocabulary[index]  # the env explains why it is not admissible now
            return f"<no action in slot {index}>"
        return text

    def slot_texts(self) -> list[str | None]:
        """The action text behind each slot now (``None`` for a slot with no admissible action)."""
        if self.vocabulary is not None:
            allowed = set(self._admissible)
            return [a if (a in allowed or not allowed) else None for a in self.vocabulary]
        shown: list[str | None] = list(self._admissible[: self.max_actions])
        return shown + [None] * (self.max_actions - len(shown))

    def action_masks(self) -> np.ndarray:
        """Boolean mask over the ``max_actions`` slots (sb3-contrib ``MaskablePPO`` protocol)."""
        mask = np.array([t is not None for t in self.slot_texts()], dtype=bool)
        if not mask.any():
            mask[:] = True
        return mask
