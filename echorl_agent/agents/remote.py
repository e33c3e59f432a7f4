"""The frozen LLM agents on any OpenAI-compatible endpoint: vLLM, SGLang, hosted APIs, or ``echorl serve``.

:class:`RemoteEngine` is the part of :class:`~echorl_agent.llm.engine.LLMEngine` that ``react``, ``llm-score``,
``tot`` and ``echorl`` use (``llm`` for the tokenizer, ``submit``/``wait``/``generate``, ``score``), spoken over
HTTP with :class:`~echorl_agent.llm.serving.openai_backend.OpenAICompatibleBackend`. The agents build the very
token-id prompts they build for the local engine and send them as token ids, so the local engine and the same
model behind a server see the same tokens and act the same:

* generation -- ``POST /v1/completions {"prompt": [ids], "max_tokens", "temperature", "top_p", "seed", "stop",
  "return_token_ids": true}``; the reply's ``token_ids`` (vLLM's and ``echorl serve``'s extension) keep the
  dialogue token-exact, and where a server leaves them out the reply text is encoded again;
* scoring -- ``POST /v1/completions {"prompt": [prompt + candidate ids, ...], "echo": true, "logprobs": 0,
  "max_tokens": 0}``: the summed prompt log-probabilities of each candidate's tokens (the lm-eval-harness recipe;
  ``max_tokens=1`` with the generated token dropped where a server refuses 0). A server that gives no prompt
  log-probabilities is refused with :class:`~echorl_agent.llm.serving.openai_backend.PromptLogprobsUnavailable`
  naming the endpoint, when the agent is built (:meth:`RemoteEngine.check_prompt_logprobs`).

Token counts come from each reply's ``usage`` (``prompt_tokens``, ``prompt_tokens_details.cached_tokens``,
``completion_tokens``); the agent's meter prices them with :class:`~echorl_agent.llm.engine.usage.TokenPrices`.

Endpoints without a tokenizer we can load (hosted chat models such as GPT-4o or Claude) run ``react`` over
``/v1/chat/completions`` (:class:`~echorl_agent.agents.chat.ChatReActAgent`); the agents that need token prompts
or log-probabilities refuse them with a ValueError naming the endpoint.

The API key is read from the environment: ``ECHORL_API_KEY``, else ``OPENAI_API_KEY`` (or the variable named by the
``api_key_env`` agent option); servers without authentication need neither.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from echorl_agent.llm.engine.config import GenerationResult, SamplingParams, ScoreResult
from echorl_agent.llm.models.loading import EMBEDDED_MODELS, LoadedModel
from echorl_agent.llm.serving.openai_backend import OpenAICompatibleBackend, PromptLogprobsUnavailable

__all__ = ["API_KEY_ENV", "RemoteEngine", "api_key_from_env", "load_tokenizer", "shared_remote_engine"]

log = logging.getLogger(__name__)

#: environment variables the API key is read from, first set wins
API_KEY_ENV = ("ECHORL_API_KEY", "OPENAI_API_KEY")


def api_key_from_env(names: Sequence[str] = API_KEY_ENV) -> str | None:
    """The first non-empty of the environment variables ``names``, or None (servers without authentication)."""
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


def load_tokenizer(name_or_path: str) -> LoadedModel:
    """The tokenizer of ``name_or_path`` (embedded name, Hugging Face id or local folder) without its weights, as a
    :class:`LoadedModel` with ``model=None`` (what the agents read: ``encode``, ``chat_ids``, ``eos_token_ids``).

    Raises:
        OSError/ValueError: the tokenizer cannot be found (e.g. a hosted model such as ``gpt-4o``).
    """
    from transformers import AutoTokenizer

    if name_or_path in EMBEDDED_MODELS:
        from echorl_agent.llm.models.loading import cache_dir, embedded_gguf

        folder = cache_dir() / "models" / name_or_path
        if (folder / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(str(folder))
        else:
            gguf = embedded_gguf(name_or_path)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    else:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    return LoadedModel(None, tok, name_or_path)


class RemoteEngine:
    """The engine protocol of the frozen LLM agents, over an OpenAI-compatible ``/v1/completions`` route.

    Args:
        backend: the endpoint's client.
        llm: the served model's tokenizer (:func:`load_tokenizer`).
    """

    def __init__(self, backend: OpenAICompatibleBackend, llm: LoadedModel) -> None:
        self.backend = backend
        self.llm = llm
        self._logprobs_checked = False

    @property
    def endpoint(self) -> str:
        return f"{self.backend.base_url} (model {self.backend.model!r})"

    def _request(self, prompt: str | Sequence[int], params: SamplingParams) -> GenerationResult:
        ids = self.llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        extra: dict[str, Any] = {"return_token_ids": True}
        if params.top_p != 1.0:
            extra["top_p"] = params.top_p
        if params.ignore_eos:
            extra["ignore_eos"] = True
        if params.stop_token_ids is not None:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        c = self.backend.complete(ids, max_tokens=params.max_tokens, temperature=params.temperature,
                                  stop=list(params.stop) or None, seed=params.seed, **extra)
        token_ids = c.token_ids if c.token_ids is not None else self.llm.encode(c.text)
        return GenerationResult(request_id=0, prompt_token_ids=ids, token_ids=token_ids, text=c.text,
                                finish_reason=c.finish_reason or "stop", num_cached_tokens=c.cached_tokens,
                                num_computed_tokens=max(c.prompt_tokens - c.cached_tokens, 0))

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None, priority: float = 1.0,
               on_token: Any = None) -> Future:
        """Send one generation request (blocking) and return its finished future; ``priority`` is the local
        engine's scheduler weight and is not sent (vLLM reads ``priority`` differently)."""
        fut: Future = Future()
        try:
            fut.set_result(self._request(prompt, params or SamplingParams()))
        except Exception as e:  # noqa: BLE001 - re-raised by wait(), as the local engine's future would
            fut.set_exception(e)
        return fut

    def wait(self, fut: Future) -> GenerationResult:
        return fut.result()

    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | None = None
                 ) -> list[GenerationResult]:
        """One request per prompt, so each result carries its own ``usage``."""
        return [self._request(p, params or SamplingParams()) for p in prompts]

    def score(self, prompt: str | Sequence[int], candidates: Sequence[str | Sequence[int]],
              share_prefix: bool = True) -> ScoreResult:
        """:meth:`LLMEngine.score` over the server's prompt log-probabilities; text is tokenized here exactly as
        the local engine does (prompt and each candidate on their own)."""
        p = self.llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        cands = [self.llm.encode(c) if isinstance(c, str) else [int(t) for t in c] for c in candidates]
        return self.backend.score(p, cands)

    def check_prompt_logprobs(self, agent: str) -> None:
        """Raise :class:`PromptLogprobsUnavailable` (a RuntimeError) naming the endpoint and ``agent`` unless the
        server returns prompt log-probabilities (one tiny scoring request, once per engine)."""
        if self._logprobs_checked:
            return
        probe = self.llm.encode("Hello")
        try:
            self.backend.score(probe, [self.llm.encode(" world")])
        except PromptLogprobsUnavailable as e:
            raise PromptLogprobsUnavailable(
                f"agent {agent!r} scores candidates with prompt log-probabilities, and {e}; serve the model with "
                "vLLM, SGLang or `echorl serve`, or use agent 'react' (generation only)") from e
        self._logprobs_checked = True

    def close(self) -> None:
        self.backend.close()


_REMOTE: dict[tuple, tuple[OpenAICompatibleBackend, RemoteEngine | None]] = {}
_REMOTE_LOCK = threading.Lock()
_DEFAULT = object()


def shared_remote_engine(base_url: str, model: str | None = None, tokenizer: Any = _DEFAULT,
                         api_key_env: str | None = None, timeout: float = 120.0
                         ) -> tuple[OpenAICompatibleBackend, RemoteEngine | None]:
    """The process-wide client of ``base_url`` and, where the served model's tokenizer loads, its engine.

    Args:
        base_url: the server's ``.../v1`` address.
        model: the served model's name (None = the first of ``/v1/models``).
        tokenizer: the tokenizer to load (embedded name, Hugging Face id or folder); by default the model name,
            and an endpoint whose model has no loadable tokenizer (hosted chat models) gets no engine (None):
            chat-only. A tokenizer named explicitly must load (ValueError otherwise); ``None`` = chat-only.
        api_key_env: the environment variable holding the API key (default: :data:`API_KEY_ENV`).
        timeout: seconds per request.
    """
    key = (base_url, model, "<model's>" if tokenizer is _DEFAULT else tokenizer, api_key_env, float(timeout))
    with _REMOTE_LOCK:
        if key in _REMOTE:
            return _REMOTE[key]
        api_key = api_key_from_env((api_key_env,) if api_key_env else API_KEY_ENV)
        if api_key_env and api_key is None:
            raise ValueError(f"api_key_env={api_key_env!r} names an environment variable that is not set")
        backend = OpenAICompatibleBackend(base_url, model=model or "-", api_key=api_key, timeout=timeout)
        try:
            listed = backend.models()
        except Exception as e:  # httpx errors: refused connection, DNS, an HTTP error status of /v1/models
            backend.close()
            raise ValueError(f"cannot reach the OpenAI-compatible endpoint base_url={base_url!r} "
                             f"(GET /models: {type(e).__name__}: {e}); start the server or fix base_url") from e
        if model is None:
            if not listed:
                raise ValueError(f"base_url={base_url!r} lists no models at /models; pass the agent option model")
            backend.model = listed[0]
        elif model not in listed:
            hint = difflib.get_close_matches(model, listed, n=1)
            log.warning("model %r is not among the %d models %s lists%s", model, len(listed), base_url,
                        f" (did you mean {hint[0]!r}?)" if hint else "")
        engine = None
        if tokenizer is not None:
            name = backend.model if tokenizer is _DEFAULT else str(tokenizer)
            try:
                engine = RemoteEngine(backend, load_tokenizer(name))
            except (OSError, ValueError) as e:
                if tokenizer is not _DEFAULT:
                    raise ValueError(f"tokenizer={tokenizer!r} does not load ({type(e).__name__}: {e})") from e
                log.info("no tokenizer for %r (%s): %s serves chat only", name, e, base_url)
        _REMOTE[key] = (backend, engine)
        return _REMOTE[key]
