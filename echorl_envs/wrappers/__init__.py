"""Gymnasium wrappers that make echorl text environments consumable by Stable-Baselines3.

SB3 rejects ``spaces.Text``; these wrappers encode text observations into vectors and admissible text
actions into ``Discrete`` actions with a mask:

* :class:`AdmissibleActionWrapper` -- admissible actions → ``Discrete(max_actions)`` + ``action_masks()``;
* :class:`EncodedTextObservation` -- text → ``Box`` (or the DRRN-style ``Dict`` with encoded action slots);
* :class:`HistoryWindow` -- the last ``k + 2`` encoded observations (EchoRL's window and the previous one);
* :func:`make_sb3_env` -- all of the above for ``n_envs`` copies, as an SB3 ``VecEnv``;
* :class:`RobustAsyncVectorEnv` -- an ``AsyncVectorEnv`` that restarts dead or hung workers (episode truncated,
  ``info["error"]``) and whose ``close()`` is bounded in time;
* encoders: :class:`HashingEncoder` (default) and :class:`MiniLMEncoder` (a real sentence encoder).
"""

from __future__ import annotations

from echorl_envs.wrappers.actions import AdmissibleActionWrapper
from echorl_envs.wrappers.encoders import ENCODERS, HashingEncoder, MiniLMEncoder, TextEncoder, make_encoder
from echorl_envs.wrappers.observations import EncodedTextObservation, HistoryWindow
from echorl_envs.wrappers.sb3 import default_max_actions, make_sb3_env, probe_max_actions, wrap_text_env
from echorl_envs.wrappers.vector import RobustAsyncVectorEnv

__all__ = [
    "ENCODERS",
    "AdmissibleActionWrapper",
    "EncodedTextObservation",
    "HashingEncoder",
    "HistoryWindow",
    "MiniLMEncoder",
    "RobustAsyncVectorEnv",
    "TextEncoder",
    "default_max_actions",
    "make_encoder",
    "make_sb3_env",
    "probe_max_actions",
    "wrap_text_env",
]
