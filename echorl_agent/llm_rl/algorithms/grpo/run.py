"""The ``grpo`` method's trainer on the :class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer` protocol: a
:class:`GRPOTrainer` after its oracle-answer warm start, checkpointed every ``checkpoint_every`` GRPO steps.

Outputs: ``curve.csv`` (completions, reward mean, frac_zero_std, loss per step), ``warm_start.json``, ``adapter/``,
``checkpoint/``. Its env steps are sampled completions (``group_size * prompts_per_step`` per GRPO step).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_agent.llm_rl.algorithms.grpo import checkpoint as grpo_ckpt
from echorl_agent.llm_rl.algorithms.grpo.config import grpo_config
from echorl_agent.llm_rl.algorithms.grpo.trainer import GRPOTrainer
from echorl_agent.llm_rl.progress import RunProgress

__all__ = ["GRPORun"]


class GRPORun:
    """A :class:`GRPOTrainer` run (see the module docstring)."""

    def __init__(self, run: Any, method: Any, model: GRPOTrainer, progress: Any = None, heldout: Any = None) -> None:
        self.run, self.method, self.model = run, method, model
        self.out = Path(run.out) if run.out else None
        self.progress = progress if progress is not None else RunProgress(False)
        self.heldout = heldout
        self.warm: list[float] = []
        """The warm start's losses (a resumed run gets the original run's back from the checkpoint)."""

    @classmethod
    def build(cls, run: Any, method: Any, lm: Any = None, progress: Any = None, heldout: Any = None) -> GRPORun:
        return cls(run, method, GRPOTrainer(grpo_config(run), lm=lm), progress, heldout)

    @property
    def per_step(self) -> int:
        """Completions sampled per GRPO step."""
        return self.model.cfg.group_size * self.model.cfg.prompts_per_step

    def steps_for(self, completions: int) -> int:
        """GRPO steps of a budget in completions (at least one when the budget is not 0)."""
        return max(1, completions // self.per_step) if completions else 0

    @property
    def num_timesteps(self) -> int:
        return self.model.num_steps * self.per_step

    def finished(self) -> bool:
        return self.model.num_steps >= self.steps_for(self.run.train_steps)

    def load(self, checkpoint: tuple[Path, dict[str, Any]]) -> None:
        self.warm = grpo_ckpt.load_grpo(self.model, checkpoint)

    def start(self, warm: bool, resume: bool = False) -> None:
        ev = self.heldout  # GRPO's warm start (oracle answers) has no stage checkpoint: ``resume`` never comes here
        if ev is not None:
            ev.run(self.model, "before")
        if warm:
            self.warm_start()
            if ev is not None and self.warm and self.steps_for(self.run.train_steps):
                ev.run(self.model, "after_bc")

    def warm_start(self, resume: bool = False) -> None:
        run = self.run
        first = 20_000 + 1000 * run.seed
        self.warm = self.model.warm_start(list(range(first, first + run.bc_episodes)),
                                          epochs=run.bc_epochs) if run.bc_episodes else []

    def train(self, env_steps: int) -> None:
        run, trainer, out = self.run, self.model, self.out
        steps, per, prog = self.steps_for(env_steps), self.per_step, self.progress
        if trainer.num_steps < steps:
            prog.stage("grpo RL", total=steps * per, initial=trainer.num_steps * per, unit="completion")
        while trainer.num_steps < steps:
            chunk = steps - trainer.num_steps
            if out is not None and run.checkpoint_every:
                chunk = min(chunk, run.checkpoint_every - trainer.num_steps % run.checkpoint_every)
            for _ in range(chunk):  # one GRPO step at a time: the bar moves with every group of completions
                h = trainer.train(1, progress=run.progress and not prog.enabled)[-1]
                prog.iteration_done(trainer.num_steps * per, steps * per,
                                    {"success_rate": h["reward_mean"], "loss": h["loss"]})
            if out is not None:
                self.save()
        if out is not None:
            with open(out / "curve.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["completions", "reward_mean", "frac_zero_std", "loss"])
                for h in trainer.history:
                    w.writerow([int(h["step"]) * self.per_step, h["reward_mean"], h["frac_zero_std"], h["loss"]])
            (out / "warm_start.json").write_text(json.dumps({"losses": self.warm}))
            if trainer.lm.cfg.lora_rank > 0:
                trainer.lm.save_adapter(out / "adapter")
        if self.heldout is not None:
            self.heldout.run(trainer, "after", keep_rng=True)
            self.heldout.write(trainer.num_steps * per)

    def evaluate(self, seeds: Sequence[int], deterministic: bool = True) -> list[float]:
        return [float(r) for r in self.model.evaluate(list(seeds), temperature=0.0 if deterministic else 1.0)]

    def save(self) -> Path:
        return grpo_ckpt.save_grpo(self.model, self.run, self.out, self.warm)

    def metrics(self) -> list[dict[str, float]]:
        return self.model.history

    def close(self) -> None:
        pass
