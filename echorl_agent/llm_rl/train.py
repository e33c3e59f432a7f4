"""One entry point that trains an LLM policy on an echorl env and writes curves, checkpoints and TensorBoard logs.

Methods (choice envs): ``bc`` (behaviour cloning on the expert), ``ppo`` (LLM-PPO from the pretrained LM),
``bc+ppo`` (BC warm start, then PPO), ``echoppo`` (BC warm start, then PPO with the latent plan and its KL term;
``plan_tokens`` > 0). Free-text envs: ``grpo`` (oracle-answer warm start, then GRPO). Used by ``echorl train-llm``
and by the bench agents ``llm-bc``, ``llm-ppo``, ``llm-echoppo``, ``llm-grpo``.

Output folder: ``curve.csv`` (env steps, rolling training success, episode return), ``model.zip`` (SB3 format;
adapters inside), ``adapter/`` (peft format), ``tb/`` (TensorBoard: SB3's ``train/*`` and ``rollout/*`` keys),
``config.json``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["LLMTrainConfig", "METHODS", "train_llm", "make_llm_env"]

log = logging.getLogger(__name__)

METHODS = ("bc", "ppo", "bc+ppo", "echoppo", "grpo")


@dataclass
class LLMTrainConfig:
    """What ``echorl train-llm`` runs."""

    env_id: str = "EchoRL/MiniGrid-Empty-5x5-v0"
    method: str = "bc+ppo"
    """One of :data:`METHODS`."""
    train_steps: int = 512
    """PPO env steps (choice envs) or GRPO sampled completions (free text)."""
    bc_episodes: int = 8
    """Expert episodes for the BC warm start (``bc``, ``bc+ppo``, ``echoppo``); oracle answers for ``grpo``."""
    bc_epochs: int = 3
    bc_learning_rate: float | None = None
    """Learning rate of the BC warm start (None: ``learning_rate``)."""
    bc_batch_size: int | None = None
    """Minibatch of the BC warm start (None: ``batch_size``)."""
    seed: int = 0
    history: int = 0
    """History window k of the prompts."""
    max_episode_steps: int | None = None
    """Per-episode step cap for training (None: the env's)."""
    n_envs: int = 1
    n_steps: int = 64
    batch_size: int = 16
    n_epochs: int = 2
    learning_rate: float = 1e-4
    ent_coef: float = 0.01
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.config.LLMPolicyConfig` / PlanningConfig fields."""
    grpo_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.grpo.GRPOConfig` fields (``grpo``)."""
    out: str | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            import difflib

            hint = difflib.get_close_matches(self.method, METHODS, n=1)
            raise ValueError(f"method must be one of {METHODS}, got method={self.method!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else ""))
        for name in ("train_steps", "bc_episodes", "n_envs", "n_steps", "batch_size", "n_epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "train_steps" else 1):
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")


def make_llm_env(env_id: str, history: int, max_episode_steps: int | None = None, seed: int | None = None):
    from echorl_envs.wrappers.llm import LLMObservationWrapper

    kw = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    return LLMObservationWrapper(gym.make(env_id, **kw), history=history, max_actions=_max_actions(env_id))


def _max_actions(env_id: str) -> int:
    import echorl_envs

    return {"alfworld": 64, "textworld": 64, "webshop": 16}.get(echorl_envs.entry(env_id).family, 16)


class _Curve:
    """SB3 callback writing (env steps, rolling success over 20 episodes, return) at every finished episode."""

    def __init__(self, path: Path | None) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self
        self.path, self.rows, self.recent = path, [], deque(maxlen=20)

        class CB(BaseCallback):
            def _on_step(self) -> bool:
                for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                    if done:
                        outer.recent.append(float(info.get("won", False)))
                        ret = float(info.get("episode", {}).get("r", np.nan))
                        outer.rows.append((self.num_timesteps, float(np.mean(outer.recent)), ret))
                        self.logger.record("rollout/success_rate_20", float(np.mean(outer.recent)))
                return True

        self.callback = CB()

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["timesteps", "success_rate", "return"])
            w.writerows(self.rows)


def train_llm(cfg: LLMTrainConfig, lm: Any = None):
    """Train as ``cfg`` says; returns the trained model (an :class:`LLMPPO`) or a :class:`GRPOTrainer`."""
    import torch

    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    torch.manual_seed(cfg.seed)
    if cfg.method == "grpo":
        return _train_grpo(cfg, out, lm)
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from echorl_agent.algorithms.echo_ppo import EchoPPO
    from echorl_agent.llm_rl.bc import behaviour_clone, collect_expert_states

    pk = dict(cfg.policy_kwargs)
    if cfg.method == "echoppo":
        pk.setdefault("plan_tokens", 2)
        pk.setdefault("kl_coef", 0.01)
    if lm is not None:
        pk["lm"] = lm

    def env_fn(i: int):
        return lambda: Monitor(make_llm_env(cfg.env_id, cfg.history, cfg.max_episode_steps))

    vec = DummyVecEnv([env_fn(i) for i in range(cfg.n_envs)])
    vec.seed(cfg.seed)
    tb = str(out / "tb") if out is not None else None
    model = EchoPPO("LLMPolicy", vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                    learning_rate=cfg.learning_rate, ent_coef=cfg.ent_coef, seed=cfg.seed, verbose=0,
                    tensorboard_log=tb, policy_kwargs=pk)
    if cfg.method in ("bc", "bc+ppo", "echoppo"):
        data = collect_expert_states(lambda: make_llm_env(cfg.env_id, cfg.history, cfg.max_episode_steps),
                                     cfg.bc_episodes, seed=10_000 + cfg.seed)
        groups = model.policy.optimizer.param_groups
        for g in groups:
            g["lr"] = cfg.bc_learning_rate or cfg.learning_rate
        losses = behaviour_clone(model.policy, data, epochs=cfg.bc_epochs, batch_size=cfg.bc_batch_size or cfg.batch_size,
                                 seed=cfg.seed, progress=cfg.progress)
        for g in groups:  # PPO's own schedule sets it again at every update
            g["lr"] = cfg.learning_rate
        if out is not None:
            (out / "bc.json").write_text(json.dumps({"losses": losses, "transitions": len(data.actions),
                                                     "episodes": data.episodes, "expert_wins": data.successes}))
    curve = _Curve(out / "curve.csv" if out is not None else None)
    if cfg.method != "bc" and cfg.train_steps > 0:
        model.learn(cfg.train_steps, callback=curve.callback, progress_bar=cfg.progress, tb_log_name="llm")
    curve.write()
    if out is not None:
        model.save(out / "model.zip")
        if model.policy.cfg.lora_rank > 0:
            model.policy.lm.save_adapter(out / "adapter")
    vec.close()
    return model


def _train_grpo(cfg: LLMTrainConfig, out: Path | None, lm: Any):
    from echorl_agent.llm_rl.config import LLMPolicyConfig
    from echorl_agent.llm_rl.grpo import GRPOConfig, GRPOTrainer

    gk = dict(cfg.grpo_kwargs)
    gk.setdefault("env_id", cfg.env_id)
    gk.setdefault("seed", cfg.seed)
    gk["lm"] = LLMPolicyConfig.from_kwargs(**cfg.policy_kwargs)
    trainer = GRPOTrainer(GRPOConfig(**gk), lm=lm)
    warm = trainer.warm_start(list(range(20_000 + 1000 * cfg.seed, 20_000 + 1000 * cfg.seed + cfg.bc_episodes)),
                              epochs=cfg.bc_epochs) if cfg.bc_episodes else []
    per_step = trainer.cfg.group_size * trainer.cfg.prompts_per_step
    steps = max(1, cfg.train_steps // per_step) if cfg.train_steps else 0
    hist = trainer.train(steps, progress=cfg.progress)
    if out is not None:
        with open(out / "curve.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["completions", "reward_mean", "frac_zero_std", "loss"])
            for h in hist:
                w.writerow([int(h["step"]) * per_step, h["reward_mean"], h["frac_zero_std"], h["loss"]])
        (out / "warm_start.json").write_text(json.dumps({"losses": warm}))
        if trainer.lm.cfg.lora_rank > 0:
            trainer.lm.save_adapter(out / "adapter")
    return trainer
