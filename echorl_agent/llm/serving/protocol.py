"""Request bodies and errors of the OpenAI-compatible server (strict pydantic models, OpenAI's error shape).

Every field is validated strictly (``"n": "two"``, ``"seed": 1.5``, ``"temperature": NaN``, ``"stop": 5``,
``"max_tokens": [4]``, ``"top_p": {}``, ``"content": null`` are all rejected), so a malformed body is a 400 for its
sender and never reaches the engine. Errors use OpenAI's JSON shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

__all__ = ["OpenAIError", "CompletionRequest", "ChatCompletionRequest", "ChatMessage", "LoadLoraRequest",
           "UnloadLoraRequest", "error_body", "validation_error_body"]

INT64 = 2**63
MAX_N = 64
MAX_LOGPROBS = 20

_Float01 = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
_Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
_Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
_Seed = Annotated[int, Field(ge=-INT64, lt=INT64)]


class OpenAIError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status`` (4xx for the client's mistakes)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:  # noqa: A002
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,  # noqa: A002
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI-shaped body for pydantic/FastAPI validation errors (``param`` = the first bad field's path)."""

    def path(e: dict[str, Any]) -> str:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        return ".".join(loc)

    parts = []
    for e in errors[:3]:
        msg = str(e.get("msg", "invalid value"))
        if e.get("type") == "json_invalid":
            msg = "the body is not valid JSON: " + str((e.get("ctx") or {}).get("error", msg))
        p = path(e)
        parts.append(f"{p}: {msg}" if p else msg)
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    first = path(errors[0]) if errors else None
    return error_body("; ".join(parts) + more, param=(first.split(".")[0] if first else None))


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _SamplingRequest(_Strict):
    """Fields shared by ``/v1/completions`` and ``/v1/chat/completions``."""

    model: StrictStr | None = None
    temperature: _Temperature | None = None
    top_p: _Float01 | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: _Seed | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: _Penalty = 0.0
    frequency_penalty: _Penalty = 0.0
    logit_bias: dict[StrictStr, float] | None = None
    user: StrictStr | None = None
    ignore_eos: StrictBool = False
    """vLLM's extension: keep generating past EOS."""
    priority: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """echorl's extension: the request's reward signal r_i for the EchoRL Eq. 5 scheduler."""

    @field_validator("stop")
    @classmethod
    def _stop_nonempty(cls, v: str | list[str] | None) -> tuple[str, ...]:
        stops = (v,) if isinstance(v, str) else tuple(v or ())
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> _SamplingRequest:
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported by this server; send 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        return self

    @property
    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop or ())


def _check_prompt(v: Any) -> Any:
    ok_ids = isinstance(v, list) and v and all(type(t) is int for t in v)
    ok_strs = isinstance(v, list) and v and all(type(t) is str for t in v)
    ok_id_lists = isinstance(v, list) and v and all(
        isinstance(x, list) and x and all(type(t) is int for t in x) for x in v)
    if not (isinstance(v, str) or ok_ids or ok_strs or ok_id_lists):
        raise ValueError("prompt must be a string, a list of strings, a non-empty list of token ids (ints) or a "
                         f"list of such lists; got {type(v).__name__} {str(v)[:60]}")
    if isinstance(v, str) and not v or ok_strs and not all(v):
        raise ValueError("prompt strings must be non-empty")
    return v


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    echo: StrictBool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    suffix: StrictStr | None = None
    return_token_ids: StrictBool = False
    """vLLM's extension: each choice also carries ``token_ids`` (generated) and ``prompt_token_ids``, so a client
    that keeps its dialogue in token ids stays token-exact."""

    _prompt_shape = field_validator("prompt", mode="before")(classmethod(lambda cls, v: _check_prompt(v)))

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of != n is not supported (best_of={self.best_of}, n={self.n})")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported by this server")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts (one element unless ``prompt`` is a list of strings or of token lists)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class _TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | Annotated[list[_TextPart], Field(min_length=1)]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.tools:
            raise ValueError("tools are not supported by this server")
        return self


class LoadLoraRequest(_Strict):
    """``POST /v1/load_lora_adapter`` (vLLM's route)."""

    lora_name: Annotated[str, Field(min_length=1)]
    lora_path: Annotated[str, Field(min_length=1)]


class UnloadLoraRequest(_Strict):
    """``POST /v1/unload_lora_adapter`` (vLLM's route)."""

    lora_name: Annotated[str, Field(min_length=1)]
