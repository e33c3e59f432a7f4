"""The GiGPO methods' trainer (``gigpo``, ``bc+gigpo``, ``echorl``) on the
:class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer` protocol: a :class:`GiGPOTrainer` with TensorBoard
logging, periodic checkpoints and the run's files.

Outputs: ``curve.csv``, ``gigpo.csv`` (one row per iteration), ``adapter/`` (peft), ``tb/`` (``train/*``,
``rollout/*``, ``time/*``), ``bc.json`` (a BC warm start), ``checkpoint/``.

A subclass swaps the learner's maths by naming another :attr:`GiGPORun.trainer_class` (a :class:`GiGPOTrainer`
subclass, e.g. other advantages; :meth:`GiGPORun.make_trainer` hands it the run's options) and keeps the loop, the
logs and exact resumes (``tests/test_llm_rl_plugin_method.py``: REINFORCE in a few lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_agent.llm_rl.algorithms.base import open_tensorboard, write_metrics
from echorl_agent.llm_rl.algorithms.bc.warm_start import bc_warm_start
from echorl_agent.llm_rl.algorithms.gigpo import checkpoint as gigpo_ckpt
from echorl_agent.llm_rl.algorithms.gigpo.config import gigpo_config
from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer
from echorl_agent.llm_rl.curve import rolling_rows, write_curve
from echorl_agent.llm_rl.progress import RunProgress

__all__ = ["GiGPORun", "write_gigpo_rows"]

_TB_TAGS = (("success_rate", "rollout/success_rate"), ("return_mean", "rollout/ep_rew_mean"),
            ("episode_length", "rollout/ep_len_mean"), ("loss", "train/loss"),
            ("frac_zero_std", "train/frac_zero_std"), ("anchor_steps_grouped", "train/anchor_steps_grouped"),
            ("is_weight_mean", "train/is_weight_mean"), ("clip_fraction", "train/clip_fraction"),
            ("entropy", "train/entropy"), ("cache_hit_rate", "rollout/cache_hit_rate"),
            ("env_steps_per_s", "time/env_steps_per_s"), ("rollout_s", "time/rollout_s"),
            ("learner_s", "time/learner_s"))


class GiGPORun:
    """A :class:`GiGPOTrainer` run (see the module docstring)."""

    trainer_class: type[GiGPOTrainer] = GiGPOTrainer
    """The trainer the run builds (a subclass may name another GiGPOTrainer)."""
    rows_file = "gigpo.csv"
    """The per-iteration metrics file in the output folder."""

    def __init__(self, run: Any, method: Any, model: GiGPOTrainer, progress: Any = None, heldout: Any = None) -> None:
        self.run, self.method, self.model = run, method, model
        self.out = Path(run.out) if run.out else None
        self.resumed = False
        self.writer: Any = None
        self.progress = progress if progress is not None else RunProgress(False)
        self.progress.attach(model.policy)
        self.heldout = heldout
        self.heldout_rows: list[dict] = []
        self.servers: Any = None  # --env-url: the EnvServerPool the groups play on (build sets it)
        """This session's held-out points (``eval_every``), rows of curve.csv."""

    @classmethod
    def config(cls, run: Any, method: Any) -> tuple[Any, dict[str, Any]]:
        """The trainer's config and the policy keyword arguments (:func:`gigpo_config`)."""
        return gigpo_config(run, plan=method.plan, replay=method.replay)

    @classmethod
    def build(cls, run: Any, method: Any, lm: Any = None, progress: Any = None, heldout: Any = None,
              servers: Any = None) -> GiGPORun:
        gcfg, pk = cls.config(run, method)
        policy = None
        if lm is not None:
            from stable_baselines3.common.utils import ConstantSchedule

            from echorl_agent.llm_rl.policy import LLMPolicy
            from echorl_agent.llm_rl.rollout import make_choice_env

            env = make_choice_env(run.env_id, run.history, run.max_episode_steps, run.env_kwargs)
            policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(run.learning_rate), lm=lm,
                               **pk)
        trainer = cls.make_trainer(gcfg, policy, run)
        if servers is not None:  # the groups play on the servers: env i on server i mod len(env_urls)
            for env in trainer.envs:
                env.close()
            trainer.envs = [servers.choice_env(i, run.history, run.max_episode_steps) for i in range(len(trainer.envs))]
        if getattr(run, "backend", "local") == "ray":  # the groups play on Ray actors, each with an engine replica
            from echorl_agent.llm_rl.ray_workers import RayRolloutPool, worker_spec

            trainer.rollout_workers = RayRolloutPool(worker_spec(run, trainer.policy), run.rollout_workers, servers,
                                                     getattr(run, "max_policy_lag", 0))
        built = cls(run, method, trainer, progress, heldout)
        built.servers = servers
        return built

    @classmethod
    def make_trainer(cls, config: Any, policy: Any, run: Any) -> GiGPOTrainer:
        """The trainer of the run (``policy`` None: a fresh one from ``config.lm``); a subclass may set its own
        options on it (from ``run.method_kwargs``)."""
        return cls.trainer_class(config, policy)

    @property
    def num_timesteps(self) -> int:
        return int(self.model.num_timesteps)

    def finished(self) -> bool:
        return self.model.num_timesteps >= self.run.train_steps

    def load(self, checkpoint: tuple[Path, dict[str, Any]]) -> None:
        gigpo_ckpt.load_gigpo(self.model, checkpoint)  # the weights after the BC warm start are in it
        self.resumed = True

    def start(self, warm: bool, resume: bool = False) -> None:
        ev, trainer = self.heldout, self.model
        if warm:
            if ev is not None and not (resume and ev.has("before")):
                ev.run(trainer, "before")
            self.warm_start(resume)
            if ev is not None:  # the start of RL, evaluated as benchmarks/gigpo_signal.py does (its generator draws)
                ev.run(trainer, "after_bc", keep_rng=True)
        elif ev is not None:
            ev.run(trainer, "before", keep_rng=True)

    def warm_start(self, resume: bool = False) -> None:
        bc_warm_start(self.run, self.model.policy, self.out, self.progress, resume)

    def _rl_stage(self) -> None:
        self.progress.stage(f"{self.run.method} RL", total=self.run.train_steps, initial=self.model.num_timesteps,
                            unit="env step", counting="env_steps")

    def _log(self, s: dict[str, float]) -> None:
        if self.writer is None:
            return
        step = int(s["timesteps"])
        for key, tag in _TB_TAGS:
            if key in s:
                self.writer.add_scalar(tag, s[key], step)
        for n, server in enumerate(self.servers.stats.values() if self.servers is not None else ()):  # --env-url i
            self.writer.add_scalar(f"servers/{n}_env_steps_per_s", server.row()["env_steps_per_s"], step)

    def _after_iteration(self, s: dict[str, float]) -> None:
        self._log(s)
        run, trainer, ev = self.run, self.model, self.heldout
        self.progress.iteration_done(trainer.num_timesteps, run.train_steps, s)
        if ev is not None and run.eval_every and trainer.num_iterations % run.eval_every == 0:
            row = ev.point(trainer, trainer.num_timesteps)
            self.heldout_rows.append(row)
            for k, v in row.items():
                if k != "timesteps" and self.writer is not None:
                    self.writer.add_scalar(f"eval/{k.removeprefix('heldout_')}", v, trainer.num_timesteps)
            if trainer.num_timesteps < run.train_steps:
                self._rl_stage()
        every = run.checkpoint_every
        if (self.out is not None and every and trainer.num_iterations % every == 0
                and trainer.num_timesteps < self.run.train_steps):
            if self.writer is not None:
                self.writer.flush()
            self.write_rows()
            self.save()

    def train(self, env_steps: int) -> None:
        trainer = self.model
        # a resumed run hides what the interrupted one logged after its checkpoint
        self.writer = open_tensorboard(self.out, trainer.num_timesteps + 1 if self.resumed else None)
        if env_steps > trainer.num_timesteps:
            self._rl_stage()
            trainer.train(env_steps, progress=self.run.progress and not self.progress.enabled,
                          callback=self._after_iteration)
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.out is not None:
            self.write_rows()
            if trainer.policy.cfg.lora_rank > 0:
                trainer.policy.lm.save_adapter(self.out / "adapter")
            self.save()
        if self.heldout is not None:
            self.heldout.run(trainer, "after", keep_rng=True)
            self.heldout.write(trainer.num_timesteps)

    def write_rows(self) -> None:
        """``curve.csv`` and the metrics file with every row since the run's start (held-out points: this
        session's)."""
        write_gigpo_rows(self.model, self.out, self.heldout_rows, self.rows_file)

    def evaluate(self, seeds: Sequence[int], deterministic: bool = True) -> list[float]:
        return [float(e.won) for e in self.model.evaluate(list(seeds), deterministic)]

    def save(self) -> Path:
        return gigpo_ckpt.save_gigpo(self.model, self.run, self.out)

    def metrics(self) -> list[dict[str, float]]:
        return self.model.history

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.model.rollout_workers is not None:
            self.model.rollout_workers.close()


def write_gigpo_rows(trainer: Any, out: Path, heldout: Any = (), rows_file: str = "gigpo.csv") -> None:
    """curve.csv (with the held-out points ``heldout``) and gigpo.csv with every row since the run's start (a resumed
    run's trainer holds the earlier ones)."""
    write_curve(out / "curve.csv", rolling_rows(trainer.episodes_done), heldout)
    write_metrics(out / rows_file, trainer.history)
