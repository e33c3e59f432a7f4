"""Client for OpenAI-compatible servers (vLLM, SGLang, hosted APIs, or our own ``echorl serve``).

Plain HTTP with httpx: ``/v1/completions`` and ``/v1/chat/completions``, with per-token log-probabilities where
the server offers them, and the server's cached-prompt-token count (``usage.prompt_tokens_details.cached_tokens``)
so prefix reuse can be measured across backends.

:meth:`OpenAICompatibleBackend.score` computes log-likelihoods of candidate continuations from the server's prompt
log-probabilities (``echo=True, logprobs=0, max_tokens=0``, the lm-eval-harness recipe vLLM and SGLang serve), with
the same signature and result as :meth:`LLMEngine.score`; given a ``tokenizer``, the backend also exposes ``llm``,
so :class:`~echorl_agent.agents.chat.ScoringAgent` runs against a remote server unchanged. A server that refuses
``max_tokens=0`` (vLLM before it mapped echo-without-generation to one internal token; its issue #9336) is asked
again with ``max_tokens=1`` and the one generated token is dropped; a server that returns no prompt log-probs at
all (hosted chat APIs) is refused with a :class:`PromptLogprobsUnavailable` naming the endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpenAICompatibleBackend", "Completion", "PromptLogprobsUnavailable"]


class PromptLogprobsUnavailable(RuntimeError):
    """The endpoint gives no prompt log-probabilities (``/v1/completions`` with ``echo=true`` and ``logprobs``)."""


@dataclass
class Completion:
    """One completion returned by the server."""

    text: str
    finish_reason: str | None
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    token_ids: list[int] | None = None
    """Generated token ids, where the server returns them (``return_token_ids``: vLLM, ``echorl serve``)."""
    raw: dict[str, Any] = field(default_factory=dict)


class OpenAICompatibleBackend:
    """Synchronous client of an OpenAI-compatible endpoint.

    Args:
        base_url: server root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        model: model name sent with each request (None = the first of ``/v1/models``).
        api_key: bearer token, if the server wants one.
        timeout: seconds per request.
        tokenizer: the served model's tokenizer (a ``transformers`` tokenizer or a
            :class:`~echorl_agent.llm.models.loading.LoadedModel`); needed only by agents that build token prompts
            themselves (:class:`~echorl_agent.agents.chat.ScoringAgent`), exposed as :attr:`llm`.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 120.0,
                 tokenizer: Any = None):
        import httpx

        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got base_url={base_url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        #: ``max_tokens`` of scoring requests: 0, or 1 (the generated token dropped) once the server refused 0
        self.score_max_tokens = 0
        self.model = model or self.models()[0]
        self.llm = None
        if tokenizer is not None:
            from echorl_agent.llm.models.loading import LoadedModel

            self.llm = tokenizer if isinstance(tokenizer, LoadedModel) else LoadedModel(None, tokenizer, self.model)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatibleBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._client.post(path, json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"{self.base_url}{path} returned HTTP {r.status_code}: {r.text[:500]}")
        return r.json()

    def models(self) -> list[str]:
        """Model ids the server lists at ``/v1/models``."""
        r = self._client.get("/models")
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]

    @staticmethod
    def _usage(c: Completion, data: dict[str, Any]) -> Completion:
        u = data.get("usage") or {}
        c.prompt_tokens = int(u.get("prompt_tokens") or 0)
        c.completion_tokens = int(u.get("completion_tokens") or 0)
        c.cached_tokens = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        c.raw = data
        return c

    def _body(self, payload: dict[str, Any], max_tokens: int, temperature: float, stop: list[str] | None,
              logprobs: Any, seed: int | None, extra: dict[str, Any]) -> dict[str, Any]:
        """The JSON body shared by both routes (``logprobs``: the route's own spelling, or None to omit it)."""
        body: dict[str, Any] = {"model": self.model, **payload, "max_tokens": max_tokens,
                                "temperature": temperature, **extra}
        if stop:
            body["stop"] = stop
        if logprobs is not None:
            body["logprobs"] = logprobs
        if seed is not None:
            body["seed"] = seed
        return body

    def complete(
        self,
        prompt: str | list[int],
        max_tokens: int = 64,
        temperature: float = 0.0,
        stop: list[str] | None = None,
        logprobs: bool = False,
        seed: int | None = None,
        **extra: Any,
    ) -> Completion:
        """``POST /v1/completions`` for one prompt (text or token ids)."""
        body = self._body({"prompt": prompt}, max_tokens, temperature, stop, 0 if logprobs else None, seed, extra)
        data = self._post("/completions", body)
        ch = data["choices"][0]
        c = Completion(ch.get("text", ""), ch.get("finish_reason"))
        lp = ch.get("logprobs") or {}
        c.tokens = list(lp.get("tokens") or [])
        c.token_logprobs = [float(x) for x in (lp.get("token_logprobs") or []) if x is not None]
        if ch.get("token_ids") is not None:
            c.token_ids = [int(t) for t in ch["token_ids"]]
        return self._usage(c, data)

    def chat(
        self,
        messages: list[dict[str, str]],
        max_tokens: int = 64,
        temperature: float = 0.0,
        stop: list[str] | None = None,
        logprobs: bool = False,
        seed: int | None = None,
        **extra: Any,
    ) -> Completion:
        """``POST /v1/chat/completions``."""
        body = self._body({"messages": messages}, max_tokens, temperature, stop, True if logprobs else None, seed,
                          extra)
        data = self._post("/chat/completions", body)
        ch = data["choices"][0]
        c = Completion((ch.get("message") or {}).get("content") or "", ch.get("finish_reason"))
        content = (ch.get("logprobs") or {}).get("content") or []
        c.tokens = [t["token"] for t in content]
        c.token_logprobs = [float(t["logprob"]) for t in content]
        return self._usage(c, data)

    def prompt_logprobs(self, prompts: list[str] | list[list[int]]) -> list[tuple[list[str], list[float | None]]]:
        """Per prompt, its tokens and ``log p(token | tokens before)`` (None for the first), as the server reports
        them for ``echo=True, logprobs=0, max_tokens=0``."""
        data = self._echo(prompts)
        out = []
        for ch in sorted(data["choices"], key=lambda c: c["index"]):
            lp = ch.get("logprobs") or {}
            out.append((list(lp.get("tokens") or []), list(lp.get("token_logprobs") or [])))
        return out

    def _echo(self, prompts: list[Any]) -> dict[str, Any]:
        """``/v1/completions`` with ``echo=true, logprobs=0`` for a batch of prompts, with the generated token (if
        the server insisted on one) removed from every choice's log-probs; raises
        :class:`PromptLogprobsUnavailable` when the server gives none."""
        body = {"model": self.model, "prompt": prompts, "max_tokens": self.score_max_tokens, "echo": True,
                "logprobs": 0, "temperature": 0.0}
        what = (f"{self.base_url}/completions (model {self.model!r}) returns no prompt log-probabilities "
                "(echo=true, logprobs=0)")
        try:
            data = self._post("/completions", body)
        except RuntimeError as e:
            if self.score_max_tokens == 0 and "max_tokens" in str(e):
                self.score_max_tokens = 1  # the server wants a generated token: ask again, drop it below
                return self._echo(prompts)
            raise PromptLogprobsUnavailable(f"{what}: {e}") from e
        for ch in data.get("choices") or []:
            lp = ch.get("logprobs")
            if not lp or not lp.get("token_logprobs") or not lp.get("tokens"):
                raise PromptLogprobsUnavailable(f"{what}: the reply has no per-token logprobs for the prompt")
            p = prompts[int(ch.get("index", 0))]
            if isinstance(p, str):  # the prompt's entries are those that start inside its text
                offs = lp.get("text_offset")
                keep = sum(1 for o in offs if o < len(p)) if offs else len(lp["tokens"]) - self.score_max_tokens
            else:
                keep = len(p)
            for key in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
                if lp.get(key) is not None:
                    lp[key] = lp[key][:keep]
        return data

    def score(self, prompt: str | list[int], candidates: list[str] | list[list[int]], share_prefix: bool = True):
        """Log-likelihood of each candidate continuation given ``prompt`` (one batched request).

        Token-id prompts and candidates are split exactly by count; text ones by ``text_offset`` (a candidate's
        tokens are those starting at or after ``len(prompt)``, which assumes the tokenizer does not merge across
        the boundary: pass token ids when it might). ``share_prefix`` is accepted for signature compatibility with
        :meth:`LLMEngine.score`; the server decides how it reuses the prompt.

        Returns:
            :class:`~echorl_agent.llm.engine.config.ScoreResult` (``num_cached_tokens`` from the server's usage).
        """
        from echorl_agent.llm.engine.config import ScoreResult

        if not candidates:
            raise ValueError("candidates must be a non-empty list")
        as_ids = not isinstance(prompt, str)
        if as_ids:
            p = [int(t) for t in prompt]
            batch: list[Any] = [p + [int(t) for t in c] for c in candidates]
        else:
            batch = [prompt + c for c in candidates]
        data = self._echo(batch)
        choices = sorted(data["choices"], key=lambda c: c["index"])
        out, counts = [], []
        for c, ch in zip(candidates, choices, strict=True):
            lp = ch["logprobs"]
            if as_ids:
                start = len(prompt)
            else:
                start = next((i for i, o in enumerate(lp["text_offset"]) if o >= len(prompt)), len(lp["tokens"]))
            vals = lp["token_logprobs"][start:]
            if not vals or any(v is None for v in vals):
                raise PromptLogprobsUnavailable(f"{self.base_url}/completions (model {self.model!r}) returned no "
                                                f"log-probabilities for candidate {c!r}")
            out.append(float(sum(vals)))
            counts.append(len(vals))
        u = data.get("usage") or {}
        cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return ScoreResult(out, counts, cached, int(u.get("prompt_tokens") or 0) - cached)
