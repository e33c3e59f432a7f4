"""SB3-facing replay buffers of echorl (the implementation lives in :mod:`echorl_agent.replay`)."""

from __future__ import annotations

from echorl_agent.replay import (
    ColdStore,
    EMAPlanTracker,
    HotColdReplayBuffer,
    HotColdReplayBufferSamples,
    ReplayFileError,
)

__all__ = ["HotColdReplayBuffer", "HotColdReplayBufferSamples", "EMAPlanTracker", "ColdStore", "ReplayFileError"]
