"""The ``echorl`` LLM agent: LLM scoring (choice envs) or ReAct (free text) + a latent plan on the KV-aware engine.

The latent plan follows EchoRL's plan surprise (Eq. 6): each observation is embedded as a plan vector ``tau_t``
(the MiniLM sentence encoder by default), an EMA ``tau_bar`` tracks the episode's running plan
(:class:`~echorl_agent.replay.EMAPlanTracker`, Eq. 7), and the surprise ``s_t = ||tau_t - tau_bar||^2 + alpha |r_t|``
(:func:`echorl_agent.kernels.plan_surprise`) decides when the LLM writes a new plan: at the start of an episode,
after an invalid action, and whenever ``s_t`` exceeds ``replan_threshold``. The plan is one line the LLM writes from
the current observation; it is appended to the dialogue ("Plan: ...") and, the history being append-only, stays in
the frozen prefix whose KV every later turn reuses from the prefix cache (EchoRL's KV_frozen).

Experience (``experience=True``): an :class:`~echorl_agent.experience.ExperienceBank` that grows online over the
episodes this agent plays (one bank per agent, i.e. per runner job); before each turn one step retrieved for the
current (instruction, observation) is appended to the observation as a "Past experience ..." line
(:func:`echorl_agent.agents.experience.guidance_text`), so later episodes are guided by earlier ones without any
gradient step. The model's weights never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from echorl_agent.agents.chat import FREE_TEXT_SYSTEM, MeteredAgent, ReActAgent, ScoringAgent, is_free_text
from echorl_agent.agents.experience import guidance_text
from echorl_agent.experience.bank import ExperienceBank
from echorl_agent.kernels.plan import plan_surprise
from echorl_agent.llm import LLMEngine, SamplingParams
from echorl_agent.replay import EMAPlanTracker

__all__ = ["EchoRLConfig", "EchoRLLLMAgent", "PLAN_SYSTEM"]

PLAN_SYSTEM = (
    "You plan for an agent in a text task. Read the observation and write a one-sentence plan of what to do next."
)


@dataclass
class EchoRLConfig:
    """Options of the ``echorl`` LLM agent."""

    plan_encoder: str = "minilm"
    """Encoder of the plan vectors tau_t: 'minilm' (sentence encoder) or 'hash' (hashed n-grams, no model)."""
    plan_decay: float = 0.3
    """EMA rate of tau_bar per step (EchoRL Eq. 7)."""
    surprise_alpha: float = 1.0
    """alpha of the reward term in the plan surprise (EchoRL Eq. 6)."""
    replan_threshold: float = 0.5
    """Re-plan when the surprise exceeds this (unit-norm plans: ||tau - tau_bar||^2 is in [0, 4])."""
    max_plan_tokens: int = 32
    """Generation budget of one plan."""
    max_tokens: int = 48
    """Generation budget of one ReAct turn (free-text envs)."""
    temperature: float = 0.0
    """Sampling temperature of actions (0 = greedy / argmax)."""
    experience: bool = True
    """Retrieve steps from an online-grown experience bank into the prompt."""
    experience_encoder: str = "hash"
    """Key encoder of the experience bank ('hash' or 'minilm')."""

    def __post_init__(self) -> None:
        if self.plan_encoder not in ("minilm", "hash"):
            raise ValueError(f"plan_encoder must be 'minilm' or 'hash', got plan_encoder={self.plan_encoder!r}")
        if not 0 < self.plan_decay <= 1:
            raise ValueError(f"plan_decay must be in (0, 1], got plan_decay={self.plan_decay}")
        if self.replan_threshold < 0:
            raise ValueError(f"replan_threshold must be >= 0, got replan_threshold={self.replan_threshold}")
        for name in ("max_plan_tokens", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature}")


_ENCODERS: dict[str, Any] = {}


def _encoder(name: str):
    if name not in _ENCODERS:  # one encoder per process, like the engine
        from echorl_envs.wrappers.encoders import make_encoder

        _ENCODERS[name] = make_encoder(name)
    return _ENCODERS[name]


class EchoRLLLMAgent(MeteredAgent):
    """``echorl``: see the module docstring. Each episode it drives a chat agent (scoring on choice envs, ReAct on
    free text) that shares its token meter, and shows it the observation with the plan and the retrieved step.

    Attributes:
        inner: this episode's chat agent.
        plans: the plans written this episode, oldest first.
        surprises: the plan surprise of every step this episode.
    """

    name = "echorl"

    def __init__(self, engine: LLMEngine, config: EchoRLConfig | None = None, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(bandwidth_scale=bandwidth_scale)
        self.engine = engine
        self.inner: ReActAgent | ScoringAgent | None = None
        self.config = config or EchoRLConfig()
        self.encoder = _encoder(self.config.plan_encoder)
        self.tracker = EMAPlanTracker(self.encoder.dim, self.config.plan_decay)
        self.plans: list[str] = []
        self.surprises: list[float] = []
        self.num_plans = 0
        self._new_plan: str | None = None
        self._seed = 0
        self.bank = ExperienceBank(self.config.experience_encoder) if self.config.experience else None
        self.num_guided_turns = 0
        self._instruction = ""
        self._prev_obs = ""
        self._rng = np.random.default_rng(0)

    # --------------------------------------------------------------------------------------- plan
    def _write_plan(self, obs: str, info: dict[str, Any]) -> str:
        user = obs.strip()
        if self.plans:
            user += f"\nPrevious plan (revise it): {self.plans[-1]}"
        prompt = self.engine.llm.chat_ids([{"role": "system", "content": PLAN_SYSTEM},
                                           {"role": "user", "content": user}])
        prompt += self.engine.llm.encode("Plan: I will")
        params = SamplingParams(max_tokens=self.config.max_plan_tokens, temperature=self.config.temperature,
                                seed=self._seed + len(self.plans), stop=("\n",))
        res = self.engine.generate([prompt], params)[0]
        self.meter.add(res.num_cached_tokens, res.num_computed_tokens, len(res.token_ids))
        plan = "I will " + " ".join(res.text.split())
        self.plans.append(plan)
        self.num_plans += 1
        return plan

    def _embed(self, obs: str) -> np.ndarray:
        return np.asarray(self.encoder.encode([obs]), dtype=np.float64)[0]

    def _surprise(self, obs: str, reward: float) -> float:
        tau = self._embed(obs)
        tau_bar = self.tracker.tau_bar if self.tracker.initialized else tau
        s = plan_surprise(torch.from_numpy(tau)[None].float(), torch.from_numpy(tau_bar).float(),
                          torch.tensor([float(reward)]), self.config.surprise_alpha)
        self.tracker.update(tau[None])
        return float(s[0])

    # --------------------------------------------------------------------------------------- protocol
    def _build(self, info: dict[str, Any], seed: int) -> ReActAgent | ScoringAgent:
        if is_free_text(info):
            return ReActAgent(self.engine, max_tokens=self.config.max_tokens, temperature=self.config.temperature,
                              seed=seed, system_prompt=FREE_TEXT_SYSTEM, meter=self.meter)
        return ScoringAgent(self.engine, temperature=self.config.temperature, seed=seed, meter=self.meter)

    def _context(self, obs: str, info: dict[str, Any]) -> str:
        text = obs.rstrip()
        if self.bank is not None:
            r = self.bank.sample(self._instruction, obs, self._rng)
            if r is not None:
                text += "\n" + guidance_text(r)
                self.num_guided_turns += 1
        if self._new_plan is not None:
            text += f"\nPlan: {self._new_plan}"
            self._new_plan = None
        return text

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._instruction, self._prev_obs = str(info.get("task") or ""), obs
        if self.bank is not None:
            self.bank.begin_episode(self._instruction, {"env_id": env_id, "seed": seed})
        self.plans, self.surprises = [], []
        self.tracker = EMAPlanTracker(self.encoder.dim, self.config.plan_decay)
        super().reset(env_id, obs, info, seed)  # new episode on the meter before the first plan is charged
        self.surprises.append(self._surprise(obs, 0.0))
        self._new_plan = self._write_plan(obs, info)
        self.inner = self._build(info, seed)
        self.inner.reset(env_id, self._context(obs, info), info, seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        assert self.inner is not None, "reset() builds the inner agent"
        self.turns += 1
        return self.inner.act(obs, info)

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        if self.bank is not None:
            self.bank.record(self._prev_obs, action, obs, reward)
            self._prev_obs = obs
            if done:
                self.bank.end_episode(bool(info.get("won", False)))
        if not done:
            s = self._surprise(obs, reward)
            self.surprises.append(s)
            if s > self.config.replan_threshold or info.get("invalid_action", False):
                self._new_plan = self._write_plan(obs, info)
        super().observe(action, obs, reward, done, info)
        if not done and self.inner is not None:
            self.inner.observe(action, self._context(obs, info), reward, done, info)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out["plans"] = float(self.num_plans)
        out["guided_turns"] = float(self.num_guided_turns)
        return out
