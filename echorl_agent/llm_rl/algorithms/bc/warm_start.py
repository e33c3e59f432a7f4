"""The BC warm start of a run (``bc``, ``bc+ppo``, ``echoppo``, ``bc+gigpo``, ``echorl`` with ``bc_warm_start``):
behaviour-clone the env's expert into the run's policy before RL (then ``bc_dagger_rounds`` of DAgger), and record
the losses in ``bc.json``."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from echorl_agent.llm_rl.algorithms.bc.clone import behaviour_clone, collect_expert_states
from echorl_agent.llm_rl.algorithms.bc.dagger import collect_policy_states, dagger_seed, merge_data
from echorl_agent.llm_rl.algorithms.bc.stage import BCStage, has_stage, load_stage, save_stage

__all__ = ["BCConfig", "bc_warm_start"]

log = logging.getLogger(__name__)


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
    dagger_rounds: int = 0
    """DAgger rounds after BC (:mod:`~echorl_agent.llm_rl.algorithms.bc.dagger`): the cloned policy plays
    ``dagger_episodes`` episodes, the expert labels the states it reached, and the aggregate is cloned again for
    ``epochs``; 0: BC alone."""
    dagger_episodes: int = 32
    """Episodes the policy plays per DAgger round."""
    noise: float = 0.0
    """Probability that an expert episode's step executes another admissible action than the expert's (DART; the
    state keeps the expert's label): :func:`~echorl_agent.llm_rl.algorithms.bc.clone.collect_expert_states`."""
    noise_actions: tuple[str, ...] = ()
    """The actions the noise may execute (empty: any admissible one)."""
    lr_scheduler: str = "constant"
    """The learning rate over each clone's optimizer steps (:func:`~echorl_agent.llm_rl.algorithms.bc.clone.lr_factor`)."""

    def __post_init__(self) -> None:
        for name in ("episodes", "epochs", "dagger_episodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"bc_{name} must be a positive int, got bc_{name}={v!r}")
        v = self.dagger_rounds
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 9:
            raise ValueError(f"bc_dagger_rounds must be an int in 0..9, got bc_dagger_rounds={v!r}")
        if self.dagger_episodes > 1000:
            raise ValueError(f"bc_dagger_episodes must be <= 1000 (seeds per round), got "
                             f"bc_dagger_episodes={self.dagger_episodes}")

    @classmethod
    def from_run(cls, run: Any) -> BCConfig:
        return cls(episodes=run.bc_episodes, epochs=run.bc_epochs, learning_rate=run.bc_learning_rate,
                   batch_size=run.bc_batch_size, dagger_rounds=run.bc_dagger_rounds,
                   dagger_episodes=run.bc_dagger_episodes, noise=run.bc_noise,
                   noise_actions=tuple(run.bc_noise_actions or ()), lr_scheduler=run.bc_lr_scheduler)


def bc_warm_start(run: Any, policy: Any, out: Path | None, progress: Any = None, resume: bool = False) -> None:
    """Clone ``run.bc_episodes`` expert episodes into ``policy`` at ``bc_learning_rate``, then set the optimizer back
    to the run's ``learning_rate``; writes ``<out>/bc.json`` (losses of every epoch, the expert's transitions,
    episodes and wins, per DAgger round the policy's success and the states it added, seconds) and, after every
    epoch, ``<out>/bc_stage/`` (:mod:`~echorl_agent.llm_rl.algorithms.bc.stage`).
    ``progress``: the run's :class:`~echorl_agent.llm_rl.progress.RunProgress` (a live BC stage).
    ``resume``: continue from ``<out>/bc_stage/`` where there is one (the run was cut during its BC stage)."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    if run.init_from is not None:  # the start is an earlier run's adapter, loaded by train_llm
        if out is not None:
            (out / "bc.json").write_text(json.dumps({"init_from": run.init_from, "losses": [], "seconds": 0.0}))
        return
    bc = BCConfig.from_run(run)
    t0 = time.perf_counter()
    make_env = lambda: make_choice_env(run.env_id, run.history, run.max_episode_steps, run.env_kwargs)  # noqa: E731
    gen = torch.Generator().manual_seed(run.seed)
    stage = None
    if resume and out is not None and has_stage(out):
        stage = load_stage(out, run, policy, gen)
        log.info("BC stage resumed at round %d, epoch %d of %d", stage.round, stage.epochs, bc.epochs)
    else:
        data = collect_expert_states(make_env, bc.episodes, seed=10_000 + run.seed, noise=bc.noise,
                                     noise_actions=bc.noise_actions)
        for g in policy.optimizer.param_groups:
            g["lr"] = bc.learning_rate or run.learning_rate
        stage = BCStage(0, 0, data, [], expert={"transitions": len(data.actions), "expert_wins": data.successes,
                                                "deviations": data.deviations, "unlabelled": data.unlabelled})
    spent = stage.seconds
    live = progress is not None and progress.enabled
    if live:
        progress.attach(policy)
    cache: dict | None = {} if bc.dagger_rounds else None  # DAgger re-clones a growing set: score each state once

    def epoch_done(e: int, loss: float) -> None:
        stage.epochs = e + 1
        stage.losses.append(loss)
        stage.seconds = spent + time.perf_counter() - t0
        if out is not None:
            save_stage(out, run, policy, stage, gen)
        if live:
            progress.update(0, epoch=e + 1, loss=loss)

    def clone(title: str) -> None:
        n = len(stage.data.actions)
        if stage.epochs == bc.epochs:  # resumed after the clone's last epoch: what behaviour_clone does at its end
            policy.sync_engine()
            return
        if live:
            progress.stage(title, total=n * bc.epochs, initial=n * stage.epochs, unit="state", counting="learner_rows")
        behaviour_clone(policy, stage.data, epochs=bc.epochs, batch_size=bc.batch_size or run.batch_size,
                        seed=run.seed, cache=cache, progress=run.progress and not live, on_epoch=epoch_done,
                        epochs_done=stage.epochs, lr_scheduler=bc.lr_scheduler)

    if stage.round == 0:
        clone(f"BC ({stage.data.episodes} expert episodes, {len(stage.data.actions)} states x {bc.epochs} epochs)")
    for k in range(max(stage.round, 1), bc.dagger_rounds + 1):
        if k > stage.round:  # the policy plays this round's episodes
            if live:
                progress.stage(f"DAgger round {k}: the policy plays {bc.dagger_episodes} episodes", unit="state",
                               counting="env_steps")
            seeds = [dagger_seed(run.seed, k, ep) for ep in range(bc.dagger_episodes)]
            got = collect_policy_states(policy, make_env, seeds, n_envs=max(run.n_envs, 16), generator=gen)
            stage.data = merge_data(stage.data, got.data)
            stage.round, stage.epochs = k, 0
            stage.rounds.append({"round": k, "policy_success": got.success, "policy_steps": got.steps,
                                 "labelled": len(got.data.actions), "unlabelled": got.unlabelled,
                                 "states": len(stage.data.actions), "loss": None})
        clone(f"DAgger round {k}: BC on {len(stage.data.actions)} states x {bc.epochs} epochs")
        stage.rounds[-1]["loss"] = stage.losses[-1]
        log.info("DAgger round %d: the policy won %.3f of %d episodes; %d states now", k,
                 stage.rounds[-1]["policy_success"], bc.dagger_episodes, len(stage.data.actions))
    for g in policy.optimizer.param_groups:
        g["lr"] = run.learning_rate
    if out is not None:
        x = stage.expert
        (out / "bc.json").write_text(json.dumps({"losses": stage.losses, "transitions": x["transitions"],
                                                 "episodes": bc.episodes, "expert_wins": x["expert_wins"],
                                                 **({"noise": bc.noise, "deviations": x["deviations"],
                                                     "unlabelled": x["unlabelled"]} if bc.noise else {}),
                                                 **({"noise_actions": list(bc.noise_actions)}
                                                    if bc.noise_actions else {}),
                                                 **({"lr_scheduler": bc.lr_scheduler}
                                                    if bc.lr_scheduler != "constant" else {}),
                                                 **({"dagger": stage.rounds} if stage.rounds else {}),
                                                 "seconds": round(spent + time.perf_counter() - t0, 1)}))
