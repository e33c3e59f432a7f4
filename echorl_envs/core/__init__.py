"""The text-environment protocol: base classes, spaces, action matching, info keys, the engine host and
the cache folder."""

from echorl_envs.core.actions import ActionMatch, match_action, normalize_action, to_printable
from echorl_envs.core.base import (
    INFO_KEYS,
    MAX_TEXT,
    DatasetTextEnv,
    InvalidAction,
    TextEnv,
    Transition,
    text_space,
)
from echorl_envs.core.cache import build_once, cache_root
from echorl_envs.core.engine_calls import (
    EngineError,
    EngineHost,
    EngineProcess,
    EngineTimeout,
    timeout_transition,
)
from echorl_envs.core.engine_env import EngineHostedEnv
from echorl_envs.core.replay_pickle import ReplayPickledEnv

__all__ = [
    "INFO_KEYS",
    "MAX_TEXT",
    "ActionMatch",
    "DatasetTextEnv",
    "EngineError",
    "EngineHost",
    "EngineHostedEnv",
    "EngineProcess",
    "EngineTimeout",
    "InvalidAction",
    "ReplayPickledEnv",
    "TextEnv",
    "Transition",
    "build_once",
    "cache_root",
    "match_action",
    "normalize_action",
    "text_space",
    "timeout_transition",
    "to_printable",
]
