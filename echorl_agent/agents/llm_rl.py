"""The trained-LLM agents of the runner: ``llm-bc``, ``llm-ppo``, ``llm-echoppo``, ``llm-gigpo``, ``llm-echorl`` (choice envs),
``llm-grpo``, and their untrained start ``llm-frozen``.

Each trains SmolLM2 (LoRA on the top layers) for the run's ``train_steps`` with
:func:`echorl_agent.llm_rl.train.train_llm` -- writing ``curve.csv``, ``model.zip``, the peft adapter and TensorBoard
logs under ``log_dir`` -- then acts in the runner's env like every other agent. Choice agents see the runner's
observations through the same :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper` they trained with (a mirror
env, as the SB3 agents do). ``deterministic`` picks greedy (argmax) or sampled actions / answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import echorl_envs
from echorl_agent.agents.base import Agent
from echorl_agent.agents.sb3 import _Mirror

__all__ = ["LLMChoiceAgent", "LLMGRPOAgent", "make_llm_frozen", "make_llm_bc", "make_llm_ppo", "make_llm_echoppo", "make_llm_gigpo",
           "make_llm_echorl", "make_llm_grpo"]


class LLMChoiceAgent(Agent):
    """An :class:`~echorl_agent.llm_rl.algorithms.ppo.LLMPPO` model (BC, PPO or EchoPPO-trained) acting over admissible actions."""

    def __init__(self, name: str, env_id: str, method: str, train_steps: int = 256, seed: int = 0,
                 log_dir: str | None = None, deterministic: bool = True, history: int = 0,
                 **train_kwargs: Any) -> None:
        from echorl_agent.llm_rl.train import LLMTrainConfig, make_llm_env, train_llm
        from echorl_envs.wrappers.llm import LLMObservationWrapper

        if echorl_envs.entry(env_id).action_type != "choice":
            raise ValueError(f"agent {name!r} ranks admissible actions; {env_id} takes free text (use llm-grpo)")
        self.name, self.deterministic = name, deterministic
        cfg = LLMTrainConfig(env_id=env_id, method=method, train_steps=int(train_steps), seed=seed,
                             history=history, out=log_dir, **train_kwargs)
        self.model = train_llm(cfg)
        self.mirror = _Mirror()
        self.env = LLMObservationWrapper(self.mirror, history=history,
                                         max_actions=make_llm_env(env_id, history).max_actions)
        self.obs: Any = None
        self.index = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        import torch

        torch.manual_seed(seed)  # sampled actions are reproducible per episode
        self.mirror.pending = (obs, 0.0, False, False, info)
        self.obs, _ = self.env.reset()

    def act(self, obs: str, info: dict[str, Any]) -> str:
        index, _ = self.model.policy.predict(self.obs, deterministic=self.deterministic)
        self.index = int(np.asarray(index).reshape(-1)[0])
        return self.env.action_text(self.index)

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        self.mirror.pending = (obs, reward, done, False, info)
        if not done:
            self.obs, *_ = self.env.step(self.index)

    def stats(self) -> dict[str, float]:
        s = self.model.policy.lm.engine.stats
        return {"prompt_tokens": float(s.num_cached_tokens + s.num_computed_tokens),
                "cached_tokens": float(s.num_cached_tokens)}


class LLMGRPOAgent(Agent):
    """A GRPO-trained LM answering free-text envs (one completion per step)."""

    name = "llm-grpo"

    def __init__(self, env_id: str, train_steps: int = 64, seed: int = 0, log_dir: str | None = None,
                 deterministic: bool = True, **train_kwargs: Any) -> None:
        from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

        cfg = LLMTrainConfig(env_id=env_id, method="grpo", train_steps=int(train_steps), seed=seed, out=log_dir,
                             **train_kwargs)
        self.trainer = train_llm(cfg)
        self.deterministic = deterministic
        self.seed = seed

    def act(self, obs: str, info: dict[str, Any]) -> str:
        from echorl_agent.llm.engine.config import SamplingParams

        tr = self.trainer
        msgs = [{"role": "system", "content": tr.cfg.system_prompt}, {"role": "user", "content": obs}]
        params = SamplingParams(max_tokens=tr.cfg.max_tokens, temperature=0.0 if self.deterministic else 1.0,
                                seed=self.seed)
        return tr.lm.engine.generate([tr.lm.llm.chat_ids(msgs)], params)[0].text

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.seed = seed


def make_llm_frozen(env_id: str, **kw: Any) -> LLMChoiceAgent:
    """The pretrained LM in the same :class:`~echorl_agent.llm_rl.policy.LLMPolicy` as ``llm-bc`` / ``llm-gigpo``
    (same prompt, scoring and ``policy_kwargs``), never updated: the start those agents train from."""
    if kw.get("train_steps", 0):
        raise ValueError(f"llm-frozen is never trained, got train_steps={kw['train_steps']!r} (use llm-bc, llm-ppo "
                         "or llm-gigpo to train)")
    kw["train_steps"] = 0
    return LLMChoiceAgent("llm-frozen", env_id, "ppo", **kw)


def make_llm_bc(env_id: str, **kw: Any) -> LLMChoiceAgent:
    return LLMChoiceAgent("llm-bc", env_id, "bc", **kw)


def make_llm_ppo(env_id: str, **kw: Any) -> LLMChoiceAgent:
    return LLMChoiceAgent("llm-ppo", env_id, "bc+ppo" if kw.pop("bc_warm_start", False) else "ppo", **kw)


def make_llm_echoppo(env_id: str, **kw: Any) -> LLMChoiceAgent:
    return LLMChoiceAgent("llm-echoppo", env_id, "echoppo", **kw)


def make_llm_gigpo(env_id: str, **kw: Any) -> LLMChoiceAgent:
    kw.setdefault("n_envs", 8)
    return LLMChoiceAgent("llm-gigpo", env_id, "bc+gigpo" if kw.pop("bc_warm_start", False) else "gigpo", **kw)


def make_llm_echorl(env_id: str, **kw: Any) -> LLMChoiceAgent:
    """EchoRL on the LM; ``echorl_learner="ppo"`` (an agent option) trains it with PPO instead of GiGPO."""
    if kw.get("echorl_learner", "gigpo") == "gigpo":
        kw.setdefault("n_envs", 8)  # groups of K episodes
    return LLMChoiceAgent("llm-echorl", env_id, "echorl", **kw)


def make_llm_grpo(env_id: str, **kw: Any) -> LLMGRPOAgent:
    return LLMGRPOAgent(env_id, **kw)
