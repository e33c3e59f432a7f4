"""A text env as SB3 sees it for an LLM policy: the whole text state packed into a byte ``Box``.

SB3's vector envs and rollout buffers carry fixed-shape arrays, never strings. An LLM policy needs the text
itself: the task, a window of recent steps, the current observation and the admissible actions. This wrapper
packs them as UTF-8 JSON into ``Box(0, 255, (max_bytes,), uint8)`` (zero padded) so ``DummyVecEnv``,
``RolloutBuffer``, ``evaluate_policy`` and ``predict`` move them unchanged; :func:`decode_llm_obs` unpacks them
in the policy. Actions are positional slots of the admissible list (``Discrete(max_actions)`` + ``action_masks()``,
as :class:`~echorl_envs.wrappers.actions.AdmissibleActionWrapper`).

The state holds ``history = [[obs_i, admissible_i, action_i] for i in h0..t-1]`` and the current ``obs`` and
``admissible``, so a policy can render it as an append-only chat (one user turn per observation, one assistant turn
per action). The history window is *chunked* so the prompt an LLM builds from it is append-only most of the time (its KV stays
in the prefix cache): at step ``t`` it holds steps ``h0 .. t-1`` with ``h0 = max(0, (t // k - 1) * k)``, i.e.
between ``k`` and ``2k - 1`` earlier steps, and the start moves only every ``k`` steps.

Example:
    >>> import echorl_envs
    >>> env = LLMObservationWrapper(echorl_envs.make("EchoRL/MiniGrid-Empty-5x5-v0"), history=2)
    >>> obs, info = env.reset(seed=0)
    >>> state = decode_llm_obs(obs)
    >>> state["task"], state["admissible"][:2], state["t"]
    ('get to the green goal square', ['turn left', 'turn right'], 0)
    >>> obs, *_ = env.step(2)
    >>> decode_llm_obs(obs)["history"][0][2]
    'go forward'
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from echorl_envs.wrappers.actions import AdmissibleActionWrapper

__all__ = ["LLMObservationWrapper", "decode_llm_obs", "encode_llm_obs", "history_start"]

_EPISODES = itertools.count()


def history_start(t: int, k: int) -> int:
    """First step shown at step ``t`` with window ``k`` (chunked, see the module docstring)."""
    return max(0, (t // k - 1) * k) if k > 0 else t


def encode_llm_obs(state: dict[str, Any], max_bytes: int = 16384) -> np.ndarray:
    """The byte row of a state dict that fits ``max_bytes`` (the inverse of :func:`decode_llm_obs`; an
    ``encode=False`` wrapper's observation becomes the ``encode=True`` one's)."""
    raw = json.dumps(state, ensure_ascii=False).encode("utf-8")[:max_bytes]
    out = np.zeros(max_bytes, np.uint8)
    out[: len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_llm_obs(obs: np.ndarray | bytes | dict[str, Any]) -> dict[str, Any]:
    """Unpack one observation of :class:`LLMObservationWrapper` into its dict (a dict, the observation of a wrapper
    with ``encode=False``, is returned as it is)."""
    if isinstance(obs, dict):
        return obs
    raw = obs.tobytes() if isinstance(obs, np.ndarray) else bytes(obs)
    return json.loads(raw.rstrip(b"\x00").decode("utf-8"))


class LLMObservationWrapper(AdmissibleActionWrapper):
    """Observation = JSON bytes of ``{task, obs, history, admissible, episode, t}``; action = admissible slot.

    Args:
        env: a choice text env (``info["admissible_actions"]`` non-empty).
        history: window ``k`` of earlier steps kept (each ``[action, observation]``).
        max_actions: action slots (positional).
        max_bytes: size of the byte observation; a state that does not fit keeps the newest steps and then cuts
            the oldest observation texts (with a ``[...]`` mark), never the admissible actions.
        encode: True: observations are the JSON bytes (what SB3's rollout buffers store). False: they are the dict
            itself, exactly what :func:`decode_llm_obs` would return for the bytes (same fitting to ``max_bytes``),
            for loops that keep no SB3 buffer (GiGPO): text stays text. ``observation_space`` is the byte ``Box``
            either way (the LLM policy's space).
    """

    def __init__(self, env: gym.Env, history: int = 2, max_actions: int = 16, max_bytes: int = 16384,
                 encode: bool = True) -> None:
        super().__init__(env, max_actions=max_actions)
        if history < 0:
            raise ValueError(f"history must be >= 0, got history={history}")
        if max_bytes < 512:
            raise ValueError(f"max_bytes must be >= 512, got max_bytes={max_bytes}")
        self.history, self.max_bytes, self.encode = int(history), int(max_bytes), bool(encode)
        self.observation_space = spaces.Box(0, 255, (self.max_bytes,), np.uint8)
        self._steps: list[list[Any]] = []
        self._obs, self._task, self._episode, self._t = "", "", "", 0
        self._adm: list[str] = []

    def reset(self, **kwargs: Any) -> tuple[np.ndarray | dict[str, Any], dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        if not info.get("admissible_actions"):
            raise ValueError(
                f"LLMObservationWrapper needs a choice env (info['admissible_actions'] non-empty); "
                f"{self.env.spec.id if self.env.spec else self.env} lists none. Use a token-level policy (GRPO) "
                "for free-text envs"
            )
        self._steps, self._obs, self._t = [], str(obs), 0
        self._adm = self._slots()
        self._task = str(info.get("task", ""))
        self._episode = f"{os.getpid()}-{next(_EPISODES)}"
        return self._pack(), info

    def step(self, action: Any) -> tuple[np.ndarray | dict[str, Any], float, bool, bool, dict[str, Any]]:
        text = self.action_text(int(action))
        obs, reward, terminated, truncated, info = super().step(action)
        self._steps.append([self._obs, self._adm, text])
        self._obs, self._t, self._adm = str(obs), self._t + 1, self._slots()
        return self._pack(), reward, terminated, truncated, info

    def state(self) -> dict[str, Any]:
        """The current state as a dict (what :func:`decode_llm_obs` returns)."""
        h0 = history_start(self._t, self.history)
        return {"task": self._task, "obs": self._obs, "history": [list(s) for s in self._steps[h0:]],
                "h0": h0, "admissible": list(self._adm), "episode": self._episode, "t": self._t}

    def _slots(self) -> list[str]:
        return [a for a in self.slot_texts() if a is not None]

    def _pack(self) -> np.ndarray | dict[str, Any]:
        state = self.state()
        raw = json.dumps(state, ensure_ascii=False).encode("utf-8")
        while len(raw) > self.max_bytes and state["history"]:
            state["history"].pop(0)
            state["h0"] += 1
            raw = json.dumps(state, ensure_ascii=False).encode("utf-8")
        if len(raw) > self.max_bytes:  # the current observation alone is too long: cut its text
            over = len(raw) - self.max_bytes + 8
            state["obs"] = state["obs"][: max(0, len(state["obs"].encode("utf-8")) - over) // 4] + " [...]"
            raw = json.dumps(state, ensure_ascii=False).encode("utf-8")[: self.max_bytes]
        if not self.encode:
            return state
        out = np.zeros(self.max_bytes, np.uint8)
        out[: len(raw)] = np.frombuffer(raw, np.uint8)
        return out
