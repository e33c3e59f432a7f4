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

Every one of them also runs on an OpenAI-compatible endpoint (vLLM, SGLang, a hosted API, ``echorl serve``): the
agent options ``base_url`` (the server's ``.../v1``) and ``model`` (the served name) replace the local engine by a
:class:`~echorl_agent.agents.remote.RemoteEngine` (:mod:`echorl_agent.agents.remote`; API key from
``ECHORL_API_KEY``/``OPENAI_API_KEY`` or the variable named by ``api_key_env``). ``prompt_price``,
``cached_price`` and ``completion_price`` (USD per million tokens) make the agent report ``cost_usd`` per episode,
from which the report computes cost per success.
"""

from __future__ import annotations

import dataclasses
import difflib
import threading
from typing import Any

from echorl_agent.agents.base import Agent
from echorl_agent.agents.chat import ChatReActAgent, MeteredAgent, ReActAgent, ScoringAgent
from echorl_agent.agents.echorl import EchoRLConfig, EchoRLLLMAgent
from echorl_agent.agents.tot import SearchResult, ToTConfig, game24_bfs, parse_game24, propose_and_vote
from echorl_agent.llm import EngineConfig, LLMEngine
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.engine.usage import TokenPrices
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


_LOCAL = ["max_kv_tokens", "prefix_caching"]
_REMOTE = ["base_url", "tokenizer", "api", "api_key_env", "timeout"]
_PRICES = ["prompt_price", "cached_price", "completion_price"]
_COMMON = ["model", "bandwidth_scale", *_LOCAL, *_REMOTE, *_PRICES]
_APIS = ("auto", "completions", "chat")


@dataclasses.dataclass
class _Backbone:
    """What an LLM agent runs on: the local engine or an endpoint (its engine, or its chat route only)."""

    engine: Any  # LLMEngine | RemoteEngine | None (chat-only endpoint)
    backend: Any = None  # OpenAICompatibleBackend of an endpoint
    scale: float = 1e-6
    prices: TokenPrices | None = None

    def meter(self, agent: MeteredAgent) -> MeteredAgent:
        """Give ``agent``'s meter the prices (so it reports ``cost_usd``) and return the agent."""
        agent.meter.prices = self.prices
        return agent


def _backbone(name: str, options: dict[str, Any], scoring: bool) -> _Backbone:
    """Pop the backbone options of agent ``name``: the local engine, or the endpoint ``base_url`` serves.

    ``scoring`` agents need the engine route and prompt log-probabilities, and refuse an endpoint without them.
    """
    prices = {k: options.pop(k) for k in _PRICES if k in options}
    priced = TokenPrices(prices.get("prompt_price", 0.0), prices.get("cached_price"),
                         prices.get("completion_price", 0.0)) if prices else None
    scale = float(options.pop("bandwidth_scale", 1e-6))
    base_url = options.pop("base_url", None)
    if base_url is None:
        stray = [k for k in _REMOTE if k in options]
        if stray:
            raise ValueError(f"option {stray[0]!r} of agent {name!r} needs base_url (an OpenAI-compatible "
                             f"endpoint, e.g. base_url='http://127.0.0.1:8000/v1'), got {stray[0]}="
                             f"{options[stray[0]]!r} without it")
        engine = shared_engine(options.pop("model", DEFAULT_MODEL), options.pop("max_kv_tokens", 8192),
                               options.pop("prefix_caching", True))
        return _Backbone(engine, None, scale, priced)
    stray = [k for k in _LOCAL if k in options]
    if stray:
        raise ValueError(f"option {stray[0]!r} of agent {name!r} configures the local engine; with "
                         f"base_url={base_url!r} the server manages its own KV cache: remove {stray[0]}")
    from echorl_agent.agents.remote import _DEFAULT, shared_remote_engine

    api = options.pop("api", "auto")
    if api not in _APIS:
        raise ValueError(f"api must be one of {_APIS}, got api={api!r}")
    if scoring and api == "chat":
        raise ValueError(f"agent {name!r} needs /v1/completions (token prompts, prompt log-probabilities); "
                         "api='chat' serves only agent 'react'")
    backend, engine = shared_remote_engine(str(base_url), options.pop("model", None),
                                           options.pop("tokenizer", _DEFAULT), options.pop("api_key_env", None),
                                           float(options.pop("timeout", 120.0)))
    if api == "chat":
        engine = None
    elif engine is None and (scoring or api == "completions"):
        raise ValueError(f"agent {name!r} on {base_url} (model {backend.model!r}) needs the served model's "
                         "tokenizer to build token prompts, and none loads here: set the agent option tokenizer "
                         "(a Hugging Face id or local folder)" + ("" if scoring else ", or api='chat'"))
    return _Backbone(engine, backend, scale, priced)


def _check_empty(name: str, options: dict[str, Any], known: list[str]) -> None:
    if options:
        bad = next(iter(options))
        hint = difflib.get_close_matches(bad, known, n=1)
        raise ValueError(f"unknown option {bad!r} for agent {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                         + f" (options: {', '.join(known)})")


def make_react(env_id: str, **options: Any) -> MeteredAgent:
    """Runner factory of ``react`` (options: model, max_tokens, temperature, max_kv_tokens, prefix_caching, or an
    endpoint: base_url, tokenizer, api, api_key_env, timeout; prices); the sampling seed is each episode's seed.

    On an endpoint without a loadable tokenizer (or ``api="chat"``) the agent is
    :class:`~echorl_agent.agents.chat.ChatReActAgent` over ``/v1/chat/completions``."""
    bb = _backbone("react", options, scoring=False)
    kw = {k: options.pop(k) for k in ("max_tokens", "temperature") if k in options}
    _check_empty("react", options, _COMMON + ["max_tokens", "temperature"])
    if bb.engine is None:
        return bb.meter(ChatReActAgent(bb.backend, bandwidth_scale=bb.scale, **kw))
    return bb.meter(ReActAgent(bb.engine, bandwidth_scale=bb.scale, **kw))


def make_scoring(env_id: str, **options: Any) -> ScoringAgent:
    """Runner factory of ``llm-score`` (options: model, temperature (default 0: greedy), max_kv_tokens,
    prefix_caching, or an endpoint with prompt log-probabilities; prices); the sampling seed is each episode's
    seed."""
    bb = _backbone("llm-score", options, scoring=True)
    temperature = options.pop("temperature", 0.0)
    _check_empty("llm-score", options, _COMMON + ["temperature"])
    _check_logprobs(bb, "llm-score")
    return bb.meter(ScoringAgent(bb.engine, temperature=temperature, bandwidth_scale=bb.scale))


def make_tot(env_id: str, **options: Any) -> ToTAgent:
    """Runner factory of ``tot``; options are ToTConfig fields plus model / max_kv_tokens / prefix_caching."""
    bb = _backbone("tot", options, scoring=True)
    fields = [f.name for f in dataclasses.fields(ToTConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    if "value_weights" in kw:
        kw["value_weights"] = tuple(kw["value_weights"])
    _check_empty("tot", options, _COMMON + fields)
    _check_logprobs(bb, "tot")
    return bb.meter(ToTAgent(bb.engine, ToTConfig(**kw), bandwidth_scale=bb.scale))


def make_echorl(env_id: str, **options: Any) -> Agent:
    """Runner factory of ``echorl`` (see :class:`echorl_agent.agents.echorl.EchoRLLLMAgent` for the options)."""
    bb = _backbone("echorl", options, scoring=True)
    fields = [f.name for f in dataclasses.fields(EchoRLConfig)]
    kw = {k: options.pop(k) for k in fields if k in options}
    _check_empty("echorl", options, _COMMON + fields)
    import echorl_envs

    if echorl_envs.entry(env_id).action_type == "choice":  # it scores admissible actions there
        _check_logprobs(bb, "echorl")
    return bb.meter(EchoRLLLMAgent(bb.engine, EchoRLConfig(**kw), bandwidth_scale=bb.scale))


def _check_logprobs(bb: _Backbone, agent: str) -> None:
    """Refuse an endpoint that gives no prompt log-probabilities (RuntimeError naming it), before any episode."""
    if bb.backend is not None:
        bb.engine.check_prompt_logprobs(agent)
