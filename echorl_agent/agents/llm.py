"""The LLM agents of the side-by-side runner: ``react``, ``llm-score``, ``tot`` and ``echorl``.

Each adapts an LLM agent of :mod:`echorl_agent.llm` to the runner's :class:`~echorl_agent.eval.agents.Agent`
protocol and counts its LLM usage in a :class:`~echorl_agent.llm.usage.TokenMeter` (prompt / cached / generated
tokens, effective bandwidth, eta_bw). The model is loaded once per process: :func:`shared_engine` keeps one
:class:`~echorl_agent.llm.engine.LLMEngine` per model name (prefix cache on), so every job a worker runs reuses the
weights and the KV of the shared system prompts.

* ``react`` -- :class:`~echorl_agent.agents.chat.ReActAgent`; on free-text envs (math, CRUXEval, ARC) the action line
  is the answer itself (no admissible list to match).
* ``llm-score`` -- :class:`~echorl_agent.agents.chat.ScoringAgent` (greedy by default) on choice envs.
* ``tot`` -- tree-of-thought BFS for Game24, propose-and-vote for other math (:mod:`echorl_agent.agents.tot`).
* ``echorl`` -- :class:`EchoRLLLMAgent`: scoring (choice envs) or ReAct (free text) + a latent plan that decides when
  the LLM re-plans, on the KV-aware engine (see :mod:`echorl_agent.agents.echorl`).
"""

from __future__ import annotations

import threading
from typing import Any

from echorl_agent.agent import Agent
from echorl_agent.agents.chat import ReActAgent, ScoringAgent
from echorl_agent.agents.tot import SearchResult, ToTConfig, game24_bfs, parse_game24, propose_and_vote
from echorl_agent.llm.engine import EngineConfig, LLMEngine
from echorl_agent.llm.models import DEFAULT_MODEL
from echorl_agent.llm.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.usage import TokenMeter

__all__ = ["shared_engine", "LLMAgent", "ReActEvalAgent", "ScoringEvalAgent", "ToTAgent", "FREE_TEXT_SYSTEM",
           "make_react", "make_scoring", "make_tot", "make_echorl"]

FREE_TEXT_SYSTEM = (
    "You are solving a problem. Reply with exactly two lines:\n"
    "Thought: <one short sentence of reasoning>\n"
    "Action: <your final answer only, in the form the problem asks for>"
)

_ENGINES: dict[tuple[str, int, bool], LLMEngine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(model: str = DEFAULT_MODEL, max_kv_tokens: int = 8192, prefix_caching: bool = True) -> LLMEngine:
    """The process-wide engine for ``model`` (loaded on first use, then reused by every agent of this process).

    Args:
        model: ``"smollm2-135m"`` (embedded default), an HF model id or a local folder.
        max_kv_tokens: KV pool size in tokens (the prefix cache's budget).
        prefix_caching: False builds the cache-off baseline engine.
    """
    if max_kv_tokens < 16:
        raise ValueError(f"max_kv_tokens must be >= 16 (one KV block), got max_kv_tokens={max_kv_tokens}")
    key = (model, int(max_kv_tokens), bool(prefix_caching))
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            cfg = EngineConfig(prefix_cache=PrefixCacheConfig(max_tokens=max_kv_tokens,
                                                              enable_prefix_caching=prefix_caching))
            _ENGINES[key] = LLMEngine(model, cfg)
        return _ENGINES[key]


def _is_free_text(info: dict[str, Any]) -> bool:
    return not info.get("admissible_actions")


class LLMAgent(Agent):
    """Shared plumbing: the engine, the token meter, and reward bookkeeping for eta_bw."""

    def __init__(self, engine: LLMEngine, bandwidth_scale: float = 1e-6) -> None:
        self.engine = engine
        self.meter = TokenMeter(bandwidth_scale)
        self.turns = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        self.meter.start_episode()
        self.turns = 0

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        self.meter.reward(reward, done)

    def stats(self) -> dict[str, float]:
        return self.meter.stats()

    def close(self) -> None:
        """Nothing to free: the engine is shared by the process (see :func:`shared_engine`)."""


class _ChatEvalAgent(LLMAgent):
    """Drives an append-only chat agent (ReAct or scoring) and charges each of its requests to the meter."""

    def __init__(self, engine: LLMEngine, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(engine, bandwidth_scale)
        self.inner: ReActAgent | ScoringAgent | None = None

    def _build(self, info: dict[str, Any], seed: int) -> ReActAgent | ScoringAgent:
        raise TypeError(f"{type(self).__name__} must implement _build()")

    def _context(self, obs: str, info: dict[str, Any]) -> str:
        """The text shown to the model for ``obs`` (subclasses add context, e.g. a plan)."""
        return obs

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        super().reset(env_id, obs, info, seed)
        self._start_dialogue(obs, info, seed)

    def _start_dialogue(self, obs: str, info: dict[str, Any], seed: int) -> None:
        self.inner = self._build(info, seed)
        self.inner.reset(self._context(obs, info), info)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        assert self.inner is not None, "reset() builds the inner agent"
        gen_before = self.engine.num_generated_tokens
        action = self.inner.act(info)
        last = self.inner.last
        self.meter.add(last.num_cached_tokens, last.num_computed_tokens, self.engine.num_generated_tokens - gen_before)
        self.turns += 1
        return action

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        super().observe(action, obs, reward, done, info)
        if not done and self.inner is not None:
            self.inner.observe(self._context(obs, info), info)


class ReActEvalAgent(_ChatEvalAgent):
    """``react``: generative ReAct; free-text envs get :data:`FREE_TEXT_SYSTEM` and take the action line as is."""

    name = "react"

    def __init__(self, engine: LLMEngine, max_tokens: int = 48, temperature: float = 0.0,
                 bandwidth_scale: float = 1e-6) -> None:
        super().__init__(engine, bandwidth_scale)
        self.max_tokens, self.temperature = max_tokens, temperature

    def _build(self, info: dict[str, Any], seed: int) -> ReActAgent:
        system = FREE_TEXT_SYSTEM if _is_free_text(info) else None
        return ReActAgent(self.engine, max_tokens=self.max_tokens, temperature=self.temperature, seed=seed,
                          system_prompt=system)


class ScoringEvalAgent(_ChatEvalAgent):
    """``llm-score``: pi(a|s) from the log-likelihood of each admissible action (choice envs only)."""

    name = "llm-score"

    def __init__(self, engine: LLMEngine, temperature: float = 0.0, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(engine, bandwidth_scale)
        self.temperature = temperature

    def _build(self, info: dict[str, Any], seed: int) -> ScoringAgent:
        if _is_free_text(info):
            raise ValueError("llm-score ranks admissible actions; this env takes free text (use react or tot)")
        return ScoringAgent(self.engine, temperature=self.temperature, seed=seed)


class ToTAgent(LLMAgent):
    """``tot``: searches once per episode, then submits the ranked answers one attempt at a time.

    Game24 observations ("Use the numbers ... to make 24") get :func:`~echorl_agent.agents.tot.game24_bfs`; other math
    problems get :func:`~echorl_agent.agents.tot.propose_and_vote`. After a wrong answer the next-ranked answer is
    tried; when the ranking is used up the search runs again with the next seed.
    """

    name = "tot"

    def __init__(self, engine: LLMEngine, config: ToTConfig | None = None, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(engine, bandwidth_scale)
        self.config = config or ToTConfig()
        self.searches: list[SearchResult] = []
        self._answers: list[str] = []
        self._problem = ""
        self._seed = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        super().reset(env_id, obs, info, seed)
        self.searches, self._answers, self._problem, self._seed = [], [], obs, seed

    def _search(self) -> SearchResult:
        puzzle = parse_game24(self._problem)
        seed = self._seed + len(self.searches)
        if puzzle is not None:
            numbers, target = puzzle
            return game24_bfs(self.engine, numbers, target, self.config, self.meter, seed)
        return propose_and_vote(self.engine, self._problem, self.config, self.meter, seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        if not self._answers:
            result = self._search()
            self.searches.append(result)
            self._answers = list(result.answers)
        self.turns += 1
        return self._answers.pop(0)


def _engine_from(options: dict[str, Any]) -> tuple[LLMEngine, float]:
    engine = shared_engine(options.pop("model", DEFAULT_MODEL), options.pop("max_kv_tokens", 8192),
                           options.pop("prefix_caching", True))
    return engine, float(options.pop("bandwidth_scale", 1e-6))


def _check_empty(name: str, options: dict[str, Any], known: list[str]) -> None:
    if options:
        import difflib

        bad = next(iter(options))
        hint = difflib.get_close_matches(bad, known, n=1)
        raise ValueError(f"unknown option {bad!r} for agent {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                         + f" (options: {', '.join(known)})")


_COMMON = ["model", "max_kv_tokens", "prefix_caching", "bandwidth_scale"]


def make_react(env_id: str, **options: Any) -> ReActEvalAgent:
    """Runner factory of ``react`` (options: model, max_tokens, temperature, max_kv_tokens, prefix_caching)."""
    engine, scale = _engine_from(options)
    kw = {k: options.pop(k) for k in ("max_tokens", "temperature") if k in options}
    _check_empty("react", options, _COMMON + ["max_tokens", "temperature"])
    return ReActEvalAgent(engine, bandwidth_scale=scale, **kw)


def make_scoring(env_id: str, **options: Any) -> ScoringEvalAgent:
    """Runner factory of ``llm-score`` (options: model, temperature, max_kv_tokens, prefix_caching)."""
    engine, scale = _engine_from(options)
    kw = {k: options.pop(k) for k in ("temperature",) if k in options}
    _check_empty("llm-score", options, _COMMON + ["temperature"])
    return ScoringEvalAgent(engine, bandwidth_scale=scale, **kw)


def make_tot(env_id: str, **options: Any) -> ToTAgent:
    """Runner factory of ``tot``; options are ToTConfig fields plus model / max_kv_tokens / prefix_caching."""
    import dataclasses

    engine, scale = _engine_from(options)
    fields = [f.name for f in dataclasses.fields(ToTConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    if "value_weights" in kw:
        kw["value_weights"] = tuple(kw["value_weights"])
    _check_empty("tot", options, _COMMON + fields)
    return ToTAgent(engine, ToTConfig(**kw), bandwidth_scale=scale)


def make_echorl(env_id: str, **options: Any) -> Agent:
    """Runner factory of ``echorl`` (see :class:`echorl_agent.agents.echorl.EchoRLLLMAgent` for the options)."""
    import dataclasses

    from echorl_agent.agents.echorl import EchoRLConfig, EchoRLLLMAgent

    engine, scale = _engine_from(options)
    fields = [f.name for f in dataclasses.fields(EchoRLConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    _check_empty("echorl", options, _COMMON + fields)
    return EchoRLLLMAgent(engine, EchoRLConfig(**kw), bandwidth_scale=scale)
