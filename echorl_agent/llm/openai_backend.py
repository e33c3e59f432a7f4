"""Client for OpenAI-compatible servers (vLLM, SGLang, hosted APIs, or our own ``echorl serve``).

Plain HTTP with httpx: ``/v1/completions`` and ``/v1/chat/completions``, with per-token log-probabilities where
the server offers them, and the server's cached-prompt-token count (``usage.prompt_tokens_details.cached_tokens``)
so prefix reuse can be measured across backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpenAICompatibleBackend", "Completion"]


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
    raw: dict[str, Any] = field(default_factory=dict)


class OpenAICompatibleBackend:
    """Synchronous client of an OpenAI-compatible endpoint.

    Args:
        base_url: server root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        model: model name sent with each request (None = the first of ``/v1/models``).
        api_key: bearer token, if the server wants one.
        timeout: seconds per request.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 120.0):
        import httpx

        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got base_url={base_url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self.model = model or self.models()[0]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatibleBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._client.post(path, json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"{path} returned HTTP {r.status_code}: {r.text[:500]}")
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
