"""Experience reuse without weight updates: a step-level bank with retrieve-then-sample, and frozen-agent users.

* :class:`ExperienceBank` -- step records (observation key, action, next observation) of successful and failed
  rollouts; instruction filter -> top-k steps by mean–max fused keys -> softmax sample with an efficiency prior;
  online growth; atomic save/load.
* :class:`ExperienceGuidedAgent` -- a frozen LLM agent with the retrieved step in its prompt.
* :class:`ResidualExperiencePolicy` -- a frozen SB3 policy whose logits a small residual head adjusts given the
  retrieved action.
"""

from __future__ import annotations

from echorl_agent.experience.agents import ExperienceGuidedAgent, guidance_text
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
    "ExperienceBank", "ExperienceConfig", "ExperienceGuidedAgent", "HashingKeyEncoder", "KeyEncoder",
    "MiniLMKeyEncoder", "ResidualExperiencePolicy", "ResidualHead", "Retrieved", "RolloutRecord", "StepRecord",
    "guidance_text", "make_key_encoder", "mean_max_fuse",
]
