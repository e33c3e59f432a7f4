"""Live progress of a ``train-llm`` run: one tqdm bar per stage (behaviour cloning, RL, held-out evaluation) that
moves with the work and is redrawn at least every :data:`HEARTBEAT_S` seconds even while one long call runs.

The bars count what the LLM policy does, at the two calls every stage goes through: :meth:`LLMPolicy.record_many`
(the rollout engine scores the admissible actions of a batch of states: one call per env step of a batch of envs)
and :meth:`LLMPolicy.learner_scores_many` (the learner's forward on a minibatch). :meth:`RunProgress.attach` wraps the
two on the policy instance, so no trainer needs a progress argument; a GiGPO iteration's rollout and update phases
are told apart by which of the two runs (rollouts score, updates learn), a PPO run's by SB3's rollout callbacks.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

__all__ = ["HEARTBEAT_S", "RunProgress", "describe", "used"]

HEARTBEAT_S = 2.0
"""Seconds between redraws of the live bar while nothing else moves it (elapsed time, phase)."""


class RunProgress:
    """The progress bars of one run (see the module docstring); every method is a no-op when ``enabled`` is False.

    Args:
        enabled: show bars (``LLMTrainConfig.progress``; ``echorl train-llm --quiet`` turns it off).
        heartbeat_s: seconds between redraws while the work sits inside one call.
    """

    def __init__(self, enabled: bool = True, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.phase = ""
        self.counting: str | None = None
        self._learned = 0
        self.scoring = "rollout"
        self.desc = ""
        self.post: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat_s = heartbeat_s
        self._t_first: float | None = None

    # ------------------------------------------------------------------ stages
    def stage(self, desc: str, total: int | None = None, unit: str = "step", initial: int = 0,
              counting: str | None = None, scoring: str = "rollout") -> None:
        """Close the current bar and open one for a new stage. ``counting`` says what moves it: ``"env_steps"``
        (the policy's scoring calls: one state per env step, as in GiGPO rollouts and held-out episodes),
        ``"learner_rows"`` (the learner's rows, as in behaviour cloning) or None (the caller's :meth:`update`);
        ``scoring``: the phase shown while the policy scores states."""
        if not self.enabled:
            return
        from tqdm.auto import tqdm

        with self._lock:
            if self.bar is not None:
                self.bar.close()
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)
            self.phase, self.post, self.counting, self._learned, self.scoring = "", {}, counting, 0, scoring
            self.desc = desc
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="train-llm-progress", daemon=True)
            self._thread.start()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance the current bar by ``n`` and set postfix fields (``success=0.25``, ``loss=0.41``)."""
        if not self.enabled or self.bar is None:
            return
        with self._lock:
            self.post.update({k: (f"{v:.3g}" if isinstance(v, float) else str(v)) for k, v in postfix.items()})
            self.bar.set_postfix(self.post, refresh=False)
            if n:
                self.bar.update(n)

    def set_phase(self, phase: str) -> None:
        if self.enabled and phase != self.phase:
            self.phase = phase
            self.update(0, phase=phase)

    def sync(self, n: int, **postfix: Any) -> None:
        """Move the current bar to ``n`` (a trainer's own count) and set postfix fields."""
        if self.enabled and self.bar is not None:
            self.update(n - self.bar.n, **postfix)

    def write(self, line: str) -> None:
        """A line above the bars (stderr)."""
        if self.enabled:
            import sys

            from tqdm.auto import tqdm

            tqdm.write(line, file=sys.stderr)

    def iteration_done(self, timesteps: int, budget: int, stats: dict[str, float]) -> None:
        """After an RL iteration: sync the bar to the trainer's env steps, show success / loss / env steps/s, and
        after the first one say how long the budget will take."""
        if not self.enabled:
            return
        post = {k: stats[key] for k, key in (("success", "success_rate"), ("loss", "loss"),
                                              ("steps_s", "env_steps_per_s")) if key in stats}
        self.sync(timesteps, **post)
        if self._t_first is None and timesteps > 0:
            self._t_first = time.perf_counter()
            took = self.bar.format_dict["elapsed"] if self.bar is not None else 0.0
            if took > 0 and budget > timesteps:
                left = took / timesteps * (budget - timesteps)
                self.write(f"[train-llm] first iteration: {timesteps:,} env steps in {took:.0f} s; the "
                           f"{budget:,}-step budget needs about {_duration(left)} more (plus held-out evaluation)")

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    # ------------------------------------------------------------------ hooks on the policy
    def attach(self, policy: Any) -> None:
        """Count ``policy``'s scoring and learner calls on this run's current bar (wraps the two bound methods on the
        instance once; a later run's :meth:`attach` takes the counts over; the class is untouched)."""
        if not self.enabled:
            return
        policy._run_progress = self
        if getattr(policy, "_progress_wrapped", False):
            return
        record_many, learner_scores_many = policy.record_many, policy.learner_scores_many

        def counted_record_many(rows, *args, **kwargs):
            out = record_many(rows, *args, **kwargs)
            policy._run_progress._scored(len(out))
            return out

        def counted_learner_scores_many(recs, *args, **kwargs):
            out = learner_scores_many(recs, *args, **kwargs)
            policy._run_progress._learner(len(recs))
            return out

        policy.record_many, policy.learner_scores_many = counted_record_many, counted_learner_scores_many
        policy._progress_wrapped = True

    def _scored(self, n: int) -> None:
        if self.counting == "env_steps":
            self.set_phase(self.scoring)
            self.update(n)
        elif self.counting == "learner_rows":
            self.set_phase("scoring states")

    def _learner(self, n: int) -> None:
        self._learned += n
        if self.counting == "learner_rows":
            self.set_phase("learning")
            self.update(n)
        else:
            if self.counting == "env_steps":
                self.set_phase("update")
            self.update(0, learner_rows=self._learned)

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            with self._lock:
                if self.bar is not None:
                    self.bar.refresh()


def used(model: Any, cfg: Any = None) -> str:
    """What a finished run trained, in words: the exact env steps (or completions) and iterations."""
    if cfg is not None and cfg.method == "bc":
        dagger = (f", {cfg.bc_dagger_rounds} DAgger rounds x {cfg.bc_dagger_episodes} episodes"
                  if cfg.bc_dagger_rounds else "")
        return (f"behaviour cloning only ({cfg.bc_episodes} expert episodes x {cfg.bc_epochs} epochs{dagger}, "
                f"no RL env steps)")
    if hasattr(model, "num_iterations"):  # GiGPO
        return f"{model.num_timesteps:,} env steps in {model.num_iterations} iterations"
    if hasattr(model, "answers"):  # GRPO
        per = model.cfg.group_size * model.cfg.prompts_per_step
        return f"{model.num_steps * per:,} completions in {model.num_steps} GRPO steps"
    return f"{model.num_timesteps:,} env steps"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(cfg: Any) -> str:
    """What a run of ``cfg`` (an :class:`~echorl_agent.llm_rl.train.LLMTrainConfig`) will do, in one line: the BC
    warm start, the RL budget with its rounding rule and iteration size, and the held-out evaluations."""
    import math

    from echorl_agent.llm_rl.algorithms.registry import get_method

    method = get_method(cfg.method)
    parts = []
    bc = method.warm_starts(cfg) and method.warm_start in ("bc", "bc_warm_start")
    if bc:
        parts.append(f"BC on {cfg.bc_episodes} expert episodes x {cfg.bc_epochs} epochs"
                     + (f" (noise {cfg.bc_noise:g}"
                        + (f" executing {', '.join(cfg.bc_noise_actions)}" if cfg.bc_noise_actions else "") + ")"
                        if cfg.bc_noise else "")
                     + (f", lr {cfg.bc_lr_scheduler}" if cfg.bc_lr_scheduler != "constant" else ""))
        if cfg.bc_dagger_rounds:
            parts.append(f"{cfg.bc_dagger_rounds} DAgger rounds of {cfg.bc_dagger_episodes} policy episodes "
                         f"(expert-labelled, BC again on all states)")
    elif method.warm_start == "oracle" and cfg.bc_episodes:
        parts.append(f"SFT on {cfg.bc_episodes} oracle answers x {cfg.bc_epochs} epochs")
    cap = f"<= {cfg.max_episode_steps} steps each" if cfg.max_episode_steps else "the env's step limit"
    if not method.rl:
        pass
    elif cfg.learner == "gigpo":
        groups = max(1, cfg.n_envs // cfg.group_size)
        parts.append(f"{cfg.method} RL for >= {cfg.train_steps:,} env steps (train_steps rounded UP to whole "
                     f"iterations: it stops after the first iteration at or past it; an iteration is {groups} groups "
                     f"x {cfg.group_size} episodes, {cap})")
        if getattr(cfg, "backend", "local") == "ray":
            lag = f", up to {cfg.max_policy_lag} iteration(s) ahead" if cfg.max_policy_lag else ""
            parts.append(f"groups played on {cfg.rollout_workers} Ray rollout worker(s){lag}")
    elif cfg.learner == "ppo":
        rollout = cfg.n_steps * cfg.n_envs
        n = math.ceil(cfg.train_steps / rollout)
        parts.append(f"{cfg.method} RL for {n * rollout:,} env steps ({n} rollouts of {cfg.n_steps} steps x "
                     f"{cfg.n_envs} envs; train_steps={cfg.train_steps:,} rounded UP to whole rollouts)")
    elif cfg.learner != "grpo":  # a registered method's learner
        parts.append(f"{cfg.method} RL for about {cfg.train_steps:,} env steps ({cfg.learner} learner)")
    else:
        from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig

        g = {**{f: getattr(GRPOConfig, f) for f in ("group_size", "prompts_per_step")}, **cfg.grpo_kwargs}
        per = g["group_size"] * g["prompts_per_step"]
        steps = max(1, cfg.train_steps // per) if cfg.train_steps else 0
        parts.append(f"GRPO for {steps} steps of {g['prompts_per_step']} prompts x {g['group_size']} completions = "
                     f"{steps * per:,} completions (train_steps={cfg.train_steps:,} rounded DOWN to whole steps)")
    if cfg.eval_episodes:
        when = ["before"] * cfg.eval_before + (["after BC"] if bc and method.rl else []) + ["after"]
        every = f", every {cfg.eval_every} iterations" if cfg.eval_every else ""
        where = (f" in the env with {json.dumps(cfg.eval_env_kwargs, sort_keys=True)}"
                 if getattr(cfg, "eval_env_kwargs", None) else "")
        parts.append(f"held-out {cfg.eval_episodes} episodes x 2 modes{where} {', '.join(when)}{every}")
    return "; ".join(parts)
