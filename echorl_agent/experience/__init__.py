"""Experience reuse without weight updates: a step-level bank with retrieve-then-sample, and a residual SB3 head.

* :class:`ExperienceBank` -- step records (observation key, action, next observation) of successful and failed
  rollouts; instruction filter -> top-k steps by mean–max fused keys -> softmax sample with an efficiency prior;
  online growth; atomic save/load.
* :class:`ResidualExperiencePolicy` -- a frozen SB3 policy whose logits a small residual head adjusts given the
  retrieved action.

The frozen LLM agent the bank guides, ``ExperienceGuidedAgent``, lives with the other agents in
:mod:`echorl_agent.agents`.
"""

from __future__ import annotations

from echorl_agent.experience.bank import (
    ExperienceBank,
    ExperienceConfig,
    Retrieved,
    RolloutRecord,
    StepRecord,
)
from echorl_agent.experience.keys import (
    HashingKeyEncoder,
    KeyEncoder,
    MiniLMKeyEncoder,
    make_key_encoder,
    mean_max_fuse,
)
from echorl_agent.experience.residual import ResidualExperiencePolicy, ResidualHead

__all__ = [
    "ExperienceBank", "ExperienceConfig", "HashingKeyEncoder", "KeyEncoder",
    "MiniLMKeyEncoder", "ResidualExperiencePolicy", "ResidualHead", "Retrieved", "RolloutRecord", "StepRecord",
    "make_key_encoder", "mean_max_fuse",
]
