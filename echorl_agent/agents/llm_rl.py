"""The trained-LLM agents of the bench, generated from the method registry: ``llm-<method>`` for every method with
an ``agent`` name in :data:`~echorl_agent.llm_rl.algorithms.registry.METHODS` (``llm-bc``, ``llm-ppo``,
``llm-echoppo``, ``llm-gigpo``, ``llm-echorl``, ``llm-grpo`` and any registered later), and their untrained start
``llm-frozen``.

Each trains SmolLM2 (LoRA on the top layers) for the run's ``train_steps`` with
:func:`echorl_agent.llm_rl.train.train_llm` -- writing ``curve.csv``, the peft adapter, TensorBoard logs and the
method's files under ``log_dir`` -- then acts in the runner's env like every other agent. Choice agents see the
runner's observations through the same :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper` they trained with
(a mirror env, as the SB3 agents do). ``deterministic`` picks greedy (argmax) or sampled actions / answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import echorl_envs
from echorl_agent.agents.base import Agent

__all__ = ["LLMChoiceAgent", "LLMGRPOAgent", "agent_entries", "make_llm_agent", "make_llm_frozen"]


class LLMChoiceAgent(Agent):
    """An :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` model (BC, PPO or EchoPPO-trained) acting over admissible actions."""

    def __init__(self, name: str, env_id: str, method: str, train_steps: int = 256, seed: int = 0,
                 log_dir: str | None = None, deterministic: bool = True, history: int = 0,
                 **train_kwargs: Any) -> None:
        from echorl_agent.agents.sb3 import _Mirror
        from echorl_agent.llm_rl.rollout import make_choice_env
        from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm
        from echorl_envs.wrappers.llm import LLMObservationWrapper

        if echorl_envs.entry(env_id).action_type != "choice":
            raise ValueError(f"agent {name!r} ranks admissible actions; {env_id} takes free text (use llm-grpo)")
        self.name, self.deterministic = name, deterministic
        cfg = LLMTrainConfig(env_id=env_id, method=method, train_steps=int(train_steps), seed=seed,
                             history=history, out=log_dir, **train_kwargs)
        self.model = train_llm(cfg)
        self.mirror = _Mirror()
        self.env = LLMObservationWrapper(self.mirror, history=history,
                                         max_actions=make_choice_env(env_id, history).max_actions)
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

    def __init__(self, env_id: str, train_steps: int = 64, seed: int = 0, log_dir: str | None = None,
                 deterministic: bool = True, name: str = "llm-grpo", method: str = "grpo",
                 **train_kwargs: Any) -> None:
        from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

        self.name = name
        cfg = LLMTrainConfig(env_id=env_id, method=method, train_steps=int(train_steps), seed=seed, out=log_dir,
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


def make_llm_agent(method: str, env_id: str, **kw: Any) -> Agent:
    """The bench agent of registered method ``method``: trains it on ``env_id`` with the agent options ``kw``
    (:class:`~echorl_agent.llm_rl.train.LLMTrainConfig` fields; ``bc_warm_start=True`` trains the method's
    ``bc_variant`` where it has one, e.g. ``llm-ppo`` -> ``bc+ppo``), then acts."""
    from echorl_agent.llm_rl.algorithms.registry import get_method

    spec = get_method(method)
    name = spec.agent or f"llm-{method}"
    learner = spec.learner_for(_Fields(kw))
    for key, value in learner.bench_options.items():
        kw.setdefault(key, value)
    if spec.bc_variant is not None and kw.pop("bc_warm_start", False):
        method = spec.bc_variant
    if spec.action_type == "text":
        return LLMGRPOAgent(env_id, name=name, method=method, **kw)
    return LLMChoiceAgent(name, env_id, method, **kw)


class _Fields:
    """Agent options read as run fields, with the run's defaults for the ones not given."""

    def __init__(self, kw: dict[str, Any]) -> None:
        self.kw = kw

    def __getattr__(self, name: str) -> Any:
        if name in self.kw:
            return self.kw[name]
        import dataclasses

        from echorl_agent.llm_rl.train import LLMTrainConfig

        return next(f.default for f in dataclasses.fields(LLMTrainConfig) if f.name == name)


def agent_entries() -> list[dict[str, Any]]:
    """The trained-LLM bench agents: ``llm-frozen`` and one per registered method with an ``agent`` name, each a
    dict of ``name``, ``description``, ``factory`` (``factory(env_id, **options)``), ``requires`` (modules that
    must import), ``kind`` and ``free_text`` (answers free-text envs instead of ranking admissible actions)."""
    import functools

    from echorl_agent.llm_rl.algorithms.registry import METHODS

    out = [{"name": "llm-frozen", "description": "SmolLM2 in LLMPolicy as pretrained, no update: the start of llm-bc "
            "and llm-gigpo (same prompt and scoring; greedy or sampled)",
            "factory": "echorl_agent.agents.llm_rl:make_llm_frozen", "requires": ("peft", "echorl_agent.llm_rl.policy"),
            "kind": "llm", "free_text": False}]
    for spec in METHODS.values():
        if spec.agent is None:
            continue
        modules = []
        for learner in spec.learners():
            ref = learner.trainer
            modules.append(ref.partition(":")[0] if isinstance(ref, str) else ref.__module__)
        out.append({"name": spec.agent, "description": spec.agent_description or spec.description,
                    "factory": functools.partial(make_llm_agent, spec.name),
                    "requires": ("peft", *dict.fromkeys(modules)), "kind": "sb3",
                    "free_text": spec.action_type == "text"})
    return out
