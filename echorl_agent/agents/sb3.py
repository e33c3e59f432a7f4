"""SB3-trained agents for the runner: PPO, MaskablePPO, DQN and EchoPPO on the encoded text env.

Each agent trains for ``train_steps`` env steps on ``make_sb3_env(task, seed=seed)`` (the same wrappers a user
would build), writes a learning curve (``curve.csv``: timesteps, rolling success rate) under ``log_dir``, then acts
in the runner's env. To act, it mirrors the runner's observations through the *same* wrapper chain (a
:class:`_Mirror` env feeds the runner's obs/info into the wrappers), so encodings, action slots and the history
window are exactly those seen in training. ``load_path`` evaluates a saved model instead of training.
"""

from __future__ import annotations

import csv
import os
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import echorl_envs
from echorl_agent.agents.base import Agent
from echorl_envs.core import text_space

__all__ = ["SB3Agent", "make_ppo", "make_maskable_ppo", "make_dqn", "make_echoppo"]


class _Mirror(gym.Env):
    """The wrappers' input adapter: returns the transition the runner fed it (the runner owns the real env)."""

    def __init__(self) -> None:
        self.observation_space = text_space()
        self.action_space = text_space()
        self.pending: tuple[str, float, bool, bool, dict] = ("", 0.0, False, False, {})

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.pending[0], self.pending[4]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self.pending


class _CurveCallback:
    """Collects (timesteps, rolling success) at every finished training episode and writes curve.csv."""

    def __init__(self, path: Path, window: int = 20) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self
        self.path, self.rows, self.recent = path, [], deque(maxlen=window)

        class CB(BaseCallback):
            def _on_step(self) -> bool:
                for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                    if done:
                        outer.recent.append(float(info.get("won", False)))
                        outer.rows.append((self.num_timesteps, float(np.mean(outer.recent))))
                return True

        self.callback = CB()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["timesteps", "success_rate"])
            w.writerows(self.rows)


class SB3Agent(Agent):
    """An SB3 model acting in a text env through the encoding wrappers it was trained with."""

    def __init__(self, name: str, env_id: str, algo: str, train_steps: int = 2048, seed: int = 0,
                 log_dir: str | None = None, load_path: str | None = None, history: int | None = None,
                 algo_kwargs: dict[str, Any] | None = None, deterministic: bool = True) -> None:
        from echorl_envs.wrappers import make_sb3_env, wrap_text_env

        e = echorl_envs.entry(env_id)
        if e.action_type != "choice":
            raise ValueError(f"agent {name!r} needs admissible actions; {env_id} takes free text")
        self.name, self.deterministic = name, deterministic
        self.masked = algo in ("maskable-ppo", "echoppo")
        wrap: dict[str, Any] = {"max_actions": e.max_actions}  # the registry's slots (EnvEntry.max_actions)
        if history is not None:
            wrap["history"] = history
        cls, policy = _algo(algo)
        if load_path is not None:
            self.model = cls.load(load_path)
        else:
            vec = make_sb3_env(env_id, n_envs=1, seed=seed, **wrap)
            self.model = cls(policy, vec, seed=seed, verbose=0, **(algo_kwargs or {}))
            curve = _CurveCallback(Path(log_dir or os.devnull) / "curve.csv")
            self.model.learn(total_timesteps=int(train_steps), callback=curve.callback)
            if log_dir:
                curve.write()
                self.model.save(Path(log_dir) / "model.zip")
            vec.close()
        if int(self.model.action_space.n) != e.max_actions:
            raise ValueError(f"the model at load_path={load_path!r} has {self.model.action_space.n} action slots; "
                             f"{env_id} has max_actions={e.max_actions} (EnvEntry); retrain it on this registry")
        self.mirror = _Mirror()
        self.env = wrap_text_env(self.mirror, **wrap)
        self.obs: Any = None
        self.index = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.mirror.pending = (obs, 0.0, False, False, info)
        self.obs, _ = self.env.reset()

    def act(self, obs: str, info: dict[str, Any]) -> str:
        kwargs = {"action_masks": self.env.get_wrapper_attr("action_masks")()} if self.masked else {}
        index, _ = self.model.predict(self.obs, deterministic=self.deterministic, **kwargs)
        self.index = int(np.asarray(index).reshape(-1)[0])
        return self.env.get_wrapper_attr("action_text")(self.index)

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        self.mirror.pending = (obs, reward, done, False, info)
        self.obs, *_ = self.env.step(self.index)


def _algo(name: str):
    if name == "ppo":
        from stable_baselines3 import PPO

        return PPO, "MlpPolicy"
    if name == "dqn":
        from stable_baselines3 import DQN

        return DQN, "MlpPolicy"
    if name == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO, "MlpPolicy"
    from echorl_agent.algorithms.echo_ppo import EchoPPO

    return EchoPPO, "EchoPolicy"


def make_ppo(env_id: str, **kw: Any) -> SB3Agent:
    return SB3Agent("ppo", env_id, "ppo", **kw)


def make_maskable_ppo(env_id: str, **kw: Any) -> SB3Agent:
    return SB3Agent("maskable-ppo", env_id, "maskable-ppo", **kw)


def make_dqn(env_id: str, **kw: Any) -> SB3Agent:
    kw.setdefault("algo_kwargs", {"learning_starts": 200, "exploration_fraction": 0.3})
    return SB3Agent("dqn", env_id, "dqn", **kw)


def make_echoppo(env_id: str, **kw: Any) -> SB3Agent:
    kw.setdefault("history", 2)
    return SB3Agent("echoppo", env_id, "echoppo", **kw)
