"""Hot/cold prioritized replay (EchoRL Eq. 6-7, Algorithm 3): SB3 buffer, LLM-transition buffer, EMA plan tracker,
cold memmap tier."""

from __future__ import annotations

from echorl_agent.replay.buffer import HotColdReplayBuffer
from echorl_agent.replay.cold import ColdStore
from echorl_agent.replay.llm import (
    LLMReplayBuffer,
    LLMReplaySample,
    critic_free_priority,
    mix_batch,
    off_policy_ratio,
)
from echorl_agent.replay.llm_items import LLMTransition
from echorl_agent.replay.samples import HotColdReplayBufferSamples
from echorl_agent.replay.serialization import ReplayFileError
from echorl_agent.replay.sumtree import SumTree
from echorl_agent.replay.tracker import EMAPlanTracker

__all__ = [
    "HotColdReplayBuffer",
    "HotColdReplayBufferSamples",
    "EMAPlanTracker",
    "ColdStore",
    "LLMReplayBuffer",
    "LLMReplaySample",
    "LLMTransition",
    "critic_free_priority",
    "mix_batch",
    "off_policy_ratio",
    "SumTree",
    "ReplayFileError",
]
