"""The PPO methods' trainer (``bc``, ``ppo``, ``bc+ppo``, ``echoppo``, ``echorl`` with ``echorl_learner="ppo"``) on
the :class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer` protocol: an :class:`LLMPPO` on ``n_envs`` wrapped
envs, SB3's ``learn`` with the curve and checkpoint callbacks.

Outputs: ``curve.csv``, ``model.zip`` (SB3 format; adapters inside), ``adapter/`` (peft), ``tb/`` (SB3's keys),
``bc.json`` (the BC warm start), ``checkpoint/``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_agent.llm_rl.algorithms.base import EpisodeCurve
from echorl_agent.llm_rl.algorithms.bc.warm_start import bc_warm_start
from echorl_agent.llm_rl.algorithms.echorl.config import PLAN_DEFAULTS
from echorl_agent.llm_rl.algorithms.ppo import checkpoint as ppo_ckpt
from echorl_agent.llm_rl.algorithms.ppo.config import PPOConfig
from echorl_agent.llm_rl.progress import RunProgress

__all__ = ["PPORun", "ppo_budget"]


class PPORun:
    """An :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` run (see the module docstring)."""

    def __init__(self, run: Any, method: Any, model: Any, vec: Any, curve: EpisodeCurve, progress: Any = None,
                 heldout: Any = None) -> None:
        self.run, self.method, self.model, self.vec, self.curve = run, method, model, vec, curve
        self.out = Path(run.out) if run.out else None
        self.resumed = False
        self.progress = progress if progress is not None else RunProgress(False)
        self.heldout = heldout

    @classmethod
    def build(cls, run: Any, method: Any, lm: Any = None, progress: Any = None, heldout: Any = None,
              servers: Any = None) -> PPORun:
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv

        from echorl_agent.llm_rl.algorithms.ppo.llm_ppo import LLMPPO
        from echorl_agent.llm_rl.rollout import make_choice_env

        pk = dict(run.policy_kwargs)
        if method.plan:  # echoppo, echorl with the PPO learner: the latent plan and its KL term
            for k, v in PLAN_DEFAULTS.items():
                pk.setdefault(k, v)
        if lm is not None:
            pk["lm"] = lm

        def env_fn(i: int):
            if servers is not None:  # env i on server i mod len(env_urls), wrapped as the in-process one
                return lambda: Monitor(servers.choice_env(i, run.history, run.max_episode_steps))
            return lambda: Monitor(make_choice_env(run.env_id, run.history, run.max_episode_steps, run.env_kwargs))

        vec = DummyVecEnv([env_fn(i) for i in range(run.n_envs)])
        vec.seed(run.seed)
        out = Path(run.out) if run.out else None
        ppo = PPOConfig.from_run(run)
        model = LLMPPO("LLMPolicy", vec, learning_rate=run.learning_rate, seed=run.seed, verbose=0,
                       tensorboard_log=str(out / "tb") if out is not None else None, policy_kwargs=pk,
                       replay=run.replay_kwargs() if method.replay else None, replay_ratio=run.replay_ratio,
                       **ppo.sb3_kwargs())
        if progress is not None:
            progress.attach(model.policy)
        return cls(run, method, model, vec, EpisodeCurve(out / "curve.csv" if out is not None else None), progress,
                   heldout)

    @property
    def num_timesteps(self) -> int:
        return int(self.model.num_timesteps)

    def _todo(self) -> int:
        return 0 if not self.method.rl else self.run.train_steps - self.model.num_timesteps

    def finished(self) -> bool:
        return self._todo() <= 0

    def load(self, checkpoint: tuple[Path, dict[str, Any]]) -> None:
        ppo_ckpt.load_ppo(self.model, self.curve, checkpoint)
        self.resumed = True
        self.vec.seed(self.run.seed + self.model.num_timesteps)  # new episodes, not a replay of the run's first ones

    def start(self, warm: bool, resume: bool = False) -> None:
        ev = self.heldout
        if ev is not None and not (resume and ev.has("before")):
            ev.run(self.model, "before")
        if warm:
            self.warm_start(resume)
            if ev is not None and self.method.rl:
                ev.run(self.model, "after_bc")

    def warm_start(self, resume: bool = False) -> None:
        # PPO's own schedule sets the learning rate again at every update
        bc_warm_start(self.run, self.model.policy, self.out, self.progress, resume)

    def train(self, env_steps: int) -> None:
        run, model, out = self.run, self.model, self.out
        todo = 0 if not self.method.rl else env_steps - model.num_timesteps
        if todo > 0:
            rollout = run.n_steps * run.n_envs
            if env_steps % rollout:
                warnings.warn(f"train_steps={env_steps} is not a multiple of n_steps * n_envs = {rollout}: PPO "
                              f"collects whole rollouts, so {-(-env_steps // rollout) * rollout} env steps run",
                              stacklevel=3)
            callbacks = [self.curve.callback, _progress_callback(self.progress, self.curve, run, model.num_timesteps)]
            if self.heldout is not None and run.eval_every:
                callbacks.append(_heldout_callback(self.heldout, self.curve, run.eval_every))
            if out is not None and run.checkpoint_every:
                callbacks.append(ppo_ckpt.ppo_checkpoint_callback(run, self.curve, out, rollout))
            model.learn(todo, callback=callbacks, progress_bar=False, tb_log_name="llm",
                        reset_num_timesteps=not self.resumed)
            if not self.curve.rows:
                warnings.warn("no training episode finished: curve.csv has only its header (raise train_steps or "
                              "lower max_episode_steps)", stacklevel=3)
        self.curve.write()
        if out is not None:
            model.save(out / "model.zip")
            if model.policy.cfg.lora_rank > 0:
                model.policy.lm.save_adapter(out / "adapter")
            self.save()
        if self.heldout is not None:
            self.heldout.run(model, "after", keep_rng=True)
            self.heldout.write(model.num_timesteps)

    def evaluate(self, seeds: Sequence[int], deterministic: bool = True) -> list[float]:
        from echorl_agent.llm_rl.rollout import make_choice_env

        run = self.run
        env = make_choice_env(run.env_id, run.history, run.max_episode_steps, run.env_kwargs)
        won = []
        for seed in seeds:
            obs, _ = env.reset(seed=int(seed))
            done, info = False, {}
            while not done:
                action, _ = self.model.policy.predict(obs, deterministic=deterministic)
                obs, _, terminated, truncated, info = env.step(int(action))
                done = terminated or truncated
            won.append(float(info.get("won", False)))
        env.close()
        return won

    def save(self) -> Path:
        return ppo_ckpt.save_ppo(self.model, self.curve, self.run, self.out)

    def metrics(self) -> list[dict[str, float]]:
        return [{"timesteps": float(s), "success_rate": w, "return": r} for s, w, r in self.curve.rows]

    def close(self) -> None:
        self.vec.close()



def _progress_callback(prog: RunProgress, curve: EpisodeCurve, run: Any, start: int) -> Any:
    """SB3 callback moving the run's RL bar: env steps as they happen, rollout / update phases, success (last 20
    episodes) and the last update's loss."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    desc = f"{run.method} RL"

    class ProgressCallback(BaseCallback):
        def _on_training_start(self) -> None:
            prog.stage(desc, total=ppo_budget(run), initial=start, unit="env step")

        def _on_rollout_start(self) -> None:
            loss = self.model.logger.name_to_value.get("train/loss")
            stats = {"success_rate": float(np.mean(curve.recent))} if curve.recent else {}
            if loss is not None and self.model.num_timesteps > start:
                prog.iteration_done(self.model.num_timesteps, ppo_budget(run), {**stats, "loss": float(loss)})
            prog.set_phase("rollout")

        def _on_step(self) -> bool:
            if prog.enabled and prog.desc != desc:  # back from a held-out point
                prog.stage(desc, total=ppo_budget(run), initial=self.model.num_timesteps, unit="env step")
            prog.update(self.training_env.num_envs)
            return True

        def _on_rollout_end(self) -> None:
            prog.set_phase("update")

    return ProgressCallback()


def ppo_budget(run: Any) -> int:
    """The env steps a PPO run takes: ``train_steps`` rounded up to whole rollouts of ``n_steps * n_envs``."""
    rollout = run.n_steps * run.n_envs
    return -(-run.train_steps // rollout) * rollout


def _heldout_callback(ev: Any, curve: EpisodeCurve, every: int) -> Any:
    """SB3 callback: a held-out point (:meth:`HeldOutEval.point`) after every ``every``-th update (the last update's
    is the final evaluation), in curve.csv and TensorBoard ``eval/*``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class HeldOutCallback(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:  # after the previous rollout's update
            done = getattr(self, "rollouts", 0)
            self.rollouts = done + 1
            if done and done % every == 0:
                policy = self.model.policy
                policy.recording = False  # held-out states stay out of the rollout's record store
                try:
                    row = ev.point(self.model, self.model.num_timesteps)
                finally:
                    policy.recording = True
                curve.heldout.append(row)
                for k, v in row.items():
                    if k != "timesteps":
                        self.logger.record(f"eval/{k.removeprefix('heldout_')}", v)

    return HeldOutCallback()
