"""The runner's LLM agents: ``react``, ``llm-score``, ``tot`` and ``echorl``, on one engine per process.

The model is loaded once per process: :func:`shared_engine` keeps one :class:`~echorl_agent.llm.engine.LLMEngine` per
model name (prefix cache on), so every job a worker runs reuses the weights and the KV of the shared system prompts.
Every agent counts its LLM usage in a :class:`~echorl_agent.llm.engine.usage.TokenMeter` (prompt / cached / generated
tokens, effective bandwidth, eta_bw).

* ``react`` -- :class:`~echorl_agent.agents.chat.ReActAgent`; on free-text envs (math, CRUXEval, ARC) the action line
  is the answer itself (no admissible list to match).
* ``llm-score`` -- :class:`~echorl_agent.agents.chat.ScoringAgent` (greedy by default) on choice envs.
* ``tot`` -- :class:`ToTAgent`: tree-of-thought BFS for Game24, propose-and-vote for other math
  (:mod:`echorl_agent.agents.tot`).
* ``echorl`` -- :class:`~echorl_agent.agents.echorl.EchoRLLLMAgent`: scoring (choice envs) or ReAct (free text) + a
  latent plan that decides when the LLM re-plans, on the KV-aware engine.
"""

from __future__ import annotations

import dataclasses
import difflib
import threading
from typing import Any

from echorl_agent.agents.base import Agent
from echorl_agent.agents.chat import MeteredAgent, ReActAgent, ScoringAgent
from echorl_agent.agents.echorl import EchoRLConfig, EchoRLLLMAgent
from echorl_agent.agents.tot import SearchResult, ToTConfig, game24_bfs, parse_game24, propose_and_vote
from echorl_agent.llm import EngineConfig, LLMEngine
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.models.loading import DEFAULT_MODEL

__all__ = ["shared_engine", "ToTAgent", "make_react", "make_scoring", "make_tot", "make_echorl"]

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


class ToTAgent(MeteredAgent):
    """``tot``: searches once per episode, then submits the ranked answers one attempt at a time.

    Game24 observations ("Use the numbers ... to make 24") get :func:`~echorl_agent.agents.tot.game24_bfs`; other math
    problems get :func:`~echorl_agent.agents.tot.propose_and_vote`. After a wrong answer the next-ranked answer is
    tried; when the ranking is used up the search runs again with the next seed.
    """

    name = "tot"

    def __init__(self, engine: LLMEngine, config: ToTConfig | None = None, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(bandwidth_scale=bandwidth_scale)
        self.engine = engine
        self.config = config or ToTConfig()
        self.searches: list[SearchResult] = []
        self._answers: list[str] = []
        self._problem = ""
        self._seed = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        super().reset(env_id, obs, info, seed)
        self.searches, self._answers, self._problem, self._seed = [], [], obs, seed

    def search(self) -> SearchResult:
        """One search for the episode's problem (seeded by the episode seed + the number of searches so far)."""
        puzzle = parse_game24(self._problem)
        seed = self._seed + len(self.searches)
        if puzzle is not None:
            numbers, target = puzzle
            return game24_bfs(self.engine, numbers, target, self.config, self.meter, seed)
        return propose_and_vote(self.engine, self._problem, self.config, self.meter, seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        if not self._answers:
            result = self.search()
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
        bad = next(iter(options))
        hint = difflib.get_close_matches(bad, known, n=1)
        raise ValueError(f"unknown option {bad!r} for agent {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                         + f" (options: {', '.join(known)})")


_COMMON = ["model", "max_kv_tokens", "prefix_caching", "bandwidth_scale"]


def make_react(env_id: str, **options: Any) -> ReActAgent:
    """Runner factory of ``react`` (options: model, max_tokens, temperature, max_kv_tokens, prefix_caching); the
    sampling seed is each episode's seed."""
    engine, scale = _engine_from(options)
    kw = {k: options.pop(k) for k in ("max_tokens", "temperature") if k in options}
    _check_empty("react", options, _COMMON + ["max_tokens", "temperature"])
    return ReActAgent(engine, bandwidth_scale=scale, **kw)


def make_scoring(env_id: str, **options: Any) -> ScoringAgent:
    """Runner factory of ``llm-score`` (options: model, temperature (default 0: greedy), max_kv_tokens,
    prefix_caching); the sampling seed is each episode's seed."""
    engine, scale = _engine_from(options)
    temperature = options.pop("temperature", 0.0)
    _check_empty("llm-score", options, _COMMON + ["temperature"])
    return ScoringAgent(engine, temperature=temperature, bandwidth_scale=scale)


def make_tot(env_id: str, **options: Any) -> ToTAgent:
    """Runner factory of ``tot``; options are ToTConfig fields plus model / max_kv_tokens / prefix_caching."""
    engine, scale = _engine_from(options)
    fields = [f.name for f in dataclasses.fields(ToTConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    if "value_weights" in kw:
        kw["value_weights"] = tuple(kw["value_weights"])
    _check_empty("tot", options, _COMMON + fields)
    return ToTAgent(engine, ToTConfig(**kw), bandwidth_scale=scale)


def make_echorl(env_id: str, **options: Any) -> Agent:
    """Runner factory of ``echorl`` (see :class:`echorl_agent.agents.echorl.EchoRLLLMAgent` for the options)."""
    engine, scale = _engine_from(options)
    fields = [f.name for f in dataclasses.fields(EchoRLConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    _check_empty("echorl", options, _COMMON + fields)
    return EchoRLLLMAgent(engine, EchoRLConfig(**kw), bandwidth_scale=scale)
