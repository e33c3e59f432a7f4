"""The BC warm start of a run (``bc``, ``bc+ppo``, ``echoppo``, ``bc+gigpo``, ``echorl`` with ``bc_warm_start``):
behaviour-clone the env's expert into the run's policy before RL, and record the losses in ``bc.json``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echorl_agent.llm_rl.algorithms.bc.clone import behaviour_clone, collect_expert_states

__all__ = ["BCConfig", "bc_warm_start"]


@dataclass
class BCConfig:
    """The BC warm start's settings (the run's ``bc_*`` fields)."""

    episodes: int = 8
    """Expert episodes to clone (seeds ``10_000 + seed``, ...)."""
    epochs: int = 3
    """Passes over the expert's transitions."""
    learning_rate: float | None = None
    """Learning rate while cloning (None: the run's ``learning_rate``)."""
    batch_size: int | None = None
    """Minibatch while cloning (None: the run's ``batch_size``)."""

    def __post_init__(self) -> None:
        for name in ("episodes", "epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"bc_{name} must be a positive int, got bc_{name}={v!r}")

    @classmethod
    def from_run(cls, run: Any) -> BCConfig:
        return cls(episodes=run.bc_episodes, epochs=run.bc_epochs, learning_rate=run.bc_learning_rate,
                   batch_size=run.bc_batch_size)


def bc_warm_start(run: Any, policy: Any, out: Path | None, progress: Any = None) -> None:
    """Clone ``run.bc_episodes`` expert episodes into ``policy`` at ``bc_learning_rate``, then set the optimizer back
    to the run's ``learning_rate``; writes ``<out>/bc.json`` (losses, transitions, episodes, expert wins, seconds).
    ``progress``: the run's :class:`~echorl_agent.llm_rl.progress.RunProgress` (a live BC stage)."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    bc = BCConfig.from_run(run)
    t0 = time.perf_counter()
    data = collect_expert_states(lambda: make_choice_env(run.env_id, run.history, run.max_episode_steps,
                                                         run.env_kwargs),
                                 bc.episodes, seed=10_000 + run.seed)
    for g in policy.optimizer.param_groups:
        g["lr"] = bc.learning_rate or run.learning_rate
    live = progress is not None and progress.enabled
    if live:
        progress.stage(f"BC ({data.episodes} expert episodes, {len(data.actions)} states x {bc.epochs} epochs)",
                       total=len(data.actions) * bc.epochs, unit="state", counting="learner_rows")
        progress.attach(policy)
    losses = behaviour_clone(policy, data, epochs=bc.epochs, batch_size=bc.batch_size or run.batch_size,
                             seed=run.seed, progress=run.progress and not live,
                             on_epoch=(lambda e, loss: progress.update(0, epoch=e + 1, loss=loss)) if live else None)
    for g in policy.optimizer.param_groups:
        g["lr"] = run.learning_rate
    if out is not None:
        (out / "bc.json").write_text(json.dumps({"losses": losses, "transitions": len(data.actions),
                                                 "episodes": data.episodes, "expert_wins": data.successes,
                                                 "seconds": round(time.perf_counter() - t0, 1)}))
