"""EchoRL on the LM (method ``echorl``): a learner (GiGPO or PPO) under the latent plan and the hot/cold replay of
LLM transitions. Its trainer is the learner's (:class:`~echorl_agent.llm_rl.algorithms.gigpo.run.GiGPORun` or
:class:`~echorl_agent.llm_rl.algorithms.ppo.trainer.PPORun`) with the registry's ``plan`` and ``replay`` on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ECHORL_LEARNERS", "EchoRLConfig", "PLAN_DEFAULTS"]

ECHORL_LEARNERS = ("gigpo", "ppo")
"""Learners of ``method="echorl"`` (the run's ``echorl_learner``)."""
PLAN_DEFAULTS = {"plan_tokens": 2, "kl_coef": 0.01}
"""The latent plan of echoppo / echorl unless ``policy_kwargs`` sets them: m = 2 soft plan tokens, lambda_KL 0.01."""


@dataclass
class EchoRLConfig:
    """The echorl-only settings of a run (the run's fields of the same names)."""

    learner: str = "gigpo"
    """"gigpo" (critic-free groups of K episodes) or "ppo" (echoppo: BC warm start, PPO with the value head)."""
    replay: dict[str, Any] | None = None
    """:class:`~echorl_agent.replay.llm.LLMReplayBuffer` arguments (None: capacity 4096, 1024 MB of activations);
    ``{"off": True}`` disables replay (the plan-only ablation)."""
    replay_ratio: float = 1.0
    """Replayed samples per fresh sample in each update."""
    bc_warm_start: bool = False
    """With the GiGPO learner: behaviour-clone the expert first (the PPO learner always warm-starts, as echoppo)."""

    def __post_init__(self) -> None:
        if self.learner not in ECHORL_LEARNERS:
            raise ValueError(f"echorl_learner must be one of {ECHORL_LEARNERS}, got echorl_learner={self.learner!r}")
        if self.replay is not None and not isinstance(self.replay, dict):
            raise ValueError(f"replay must be None or a dict of LLMReplayBuffer arguments, got replay={self.replay!r}")
        if not self.replay_ratio >= 0:
            raise ValueError(f"replay_ratio must be >= 0, got replay_ratio={self.replay_ratio!r}")

    @classmethod
    def from_run(cls, run: Any) -> EchoRLConfig:
        return cls(learner=run.echorl_learner, replay=run.replay, replay_ratio=run.replay_ratio,
                   bc_warm_start=run.bc_warm_start)

    def replay_kwargs(self) -> dict[str, Any] | None:
        """The replay buffer's arguments (None: ``{"off": True}``)."""
        replay = {"capacity": 4096, "replay_memory_mb": 1024.0} if self.replay is None else dict(self.replay)
        return None if replay.pop("off", False) else replay
