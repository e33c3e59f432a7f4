"""OpenAI-compatible HTTP server over :class:`~echorl_agent.llm.engine.LLMEngine` (``echorl serve``).

Routes (what vLLM/SGLang also serve): ``GET /v1/models``, ``POST /v1/completions`` (string, token-id or batched
prompts; ``echo`` with prompt log-probabilities, lm-eval-harness style), ``POST /v1/chat/completions``, both with
SSE streaming (``stream``), ``n`` samples sharing one prefill, ``logprobs``/``top_logprobs``, ``stop``, ``seed``,
vLLM's ``return_token_ids`` (completions); vLLM's ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (:mod:`echorl_agent.llm.serving.lora`); and
``GET /v1/echorl/stats`` with the prefix-cache counters (reuse rate rho).

Every request goes through a shared engine, so concurrent clients are batched and share cached prefixes;
``usage.prompt_tokens_details.cached_tokens`` reports the reuse per request, as OpenAI does. Bodies are validated
strictly (:mod:`echorl_agent.llm.serving.protocol`), errors use OpenAI's shape, a failing request fails alone, and a
client that disconnects (or a SIGTERM) aborts its requests in the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import Request

from echorl_agent.llm.engine.llm_engine import EngineConfig, GenerationResult, LLMEngine, SamplingParams
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.models.loading import load_model
from echorl_agent.llm.serving.lora import ServedModels
from echorl_agent.llm.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    LoadLoraRequest,
    OpenAIError,
    UnloadLoraRequest,
    error_body,
    validation_error_body,
)
from echorl_agent.llm.serving.render import Detokenizer, chat_logprobs, completion_logprobs, usage

__all__ = ["create_app", "main", "build_parser"]

log = logging.getLogger(__name__)


def _engine_error(e: BaseException) -> OpenAIError:
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ValueError):
        return OpenAIError(str(e))
    if isinstance(e, MemoryError):
        return OpenAIError(str(e), status=503, type="server_error", code="kv_cache_full")
    return OpenAIError(f"generation failed for this request: {e!r}", status=500, type="server_error")


def _max_tokens(engine: LLMEngine, requested: int | None, n_prompt: int, default: int | None) -> int:
    """``requested`` checked against the context left after the prompt (OpenAI: a 400, never truncated)."""
    room = engine.max_model_len - n_prompt
    if requested is None:
        return max(0, min(default, room) if default is not None else room)
    if requested > room:
        raise OpenAIError(
            f"This model's maximum context length is {engine.max_model_len} tokens. However, you requested "
            f"{n_prompt + requested} tokens ({n_prompt} in the prompt, {requested} for the completion). Please "
            "reduce the prompt or max_tokens.", param="max_tokens", code="context_length_exceeded")
    return requested


def _sampling(req: Any, max_tokens: int, logprobs: bool, top: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max(1, max_tokens),  # max_tokens == 0 never reaches the engine (see _generate)
        temperature=1.0 if req.temperature is None else req.temperature,  # OpenAI's default
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed, stop=req.stops, ignore_eos=req.ignore_eos, logprobs=logprobs, top_logprobs=top,
    )


def _submit(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, n: int, priority: float,
            on_token: Any = None) -> list[Future]:
    """One group of ``n`` per prompt; choice index = prompt index * n + sample index (OpenAI's order)."""
    futs: list[Future] = []
    try:
        for k, ids in enumerate(prompts):
            cb = None if on_token is None else (lambda i, t, lp, top, off=k * n: on_token(off + i, t, lp, top))
            futs += engine.submit_group(ids, params, n, priority, cb)
    except ValueError as e:
        for f in futs:
            f.cancel()
        raise OpenAIError(str(e), param="prompt") from e
    return futs


async def _gather(futs: list[Future], request: Any) -> list[GenerationResult]:
    """Await the engine's futures; a client that disconnects (or a cancelled task) aborts them in the engine."""
    wrapped = asyncio.gather(*(asyncio.wrap_future(f) for f in futs))
    try:
        while True:
            done, _ = await asyncio.wait({wrapped}, timeout=0.25)
            if done:
                return wrapped.result()
            if await request.is_disconnected():
                log.info("client disconnected: aborting %d requests", len(futs))
                raise asyncio.CancelledError
    except asyncio.CancelledError:
        raise
    except Exception as e:
        raise _engine_error(e) from e
    finally:
        for f in futs:
            f.cancel()  # no-op when done; otherwise the engine aborts it (Future done-callback)
        wrapped.cancel()


async def _events(futs_and_loop: tuple[list[Future], asyncio.Queue]) -> AsyncIterator[tuple]:
    """Token and completion events of streamed requests, in engine order; cancels the rest on exit."""
    futs, q = futs_and_loop
    remaining = len(futs)
    try:
        while remaining:
            ev = await q.get()
            if ev[0] == "done":
                remaining -= 1
                f: Future = ev[2]
                if f.cancelled():
                    raise OpenAIError("the request was aborted", status=503, type="server_error")
                if f.exception() is not None:
                    raise _engine_error(f.exception())
                yield ("done", ev[1], f.result())
            else:
                yield ev
    finally:
        for f in futs:
            f.cancel()


def _stream_submit(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, n: int,
                   priority: float) -> tuple[list[Future], asyncio.Queue]:
    loop, q = asyncio.get_running_loop(), asyncio.Queue()
    futs = _submit(engine, prompts, params, n, priority,
                   lambda i, t, lp, top: loop.call_soon_threadsafe(q.put_nowait, ("token", i, t, lp, top)))
    for i, f in enumerate(futs):
        f.add_done_callback(lambda f, i=i: loop.call_soon_threadsafe(q.put_nowait, ("done", i, f)))
    return futs, q


def _sse(obj: Any) -> str:
    import json

    return f"data: {json.dumps(obj)}\n\n"


def create_app(engine: LLMEngine, model_name: str | None = None, max_loras: int = 2):
    """A FastAPI app serving ``engine`` (started by the caller) and up to ``max_loras`` LoRA adapters.

    The app's ``state.models`` is the :class:`~echorl_agent.llm.serving.lora.ServedModels` registry.
    """
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    name = model_name or engine.llm.name
    served = ServedModels(engine, name, max_loras)
    app = FastAPI(title="echorl OpenAI-compatible server")
    app.state.models = served

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, e: OpenAIError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(list(e.errors())), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(e.detail), kind), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled server error")
        return JSONResponse(error_body(f"internal server error: {e!r}", "server_error"), status_code=500)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [{"id": m, "object": "model", "owned_by": "echorl", "created": 0,
                 **({"parent": name} if m != name else {})} for m in served.names()]
        return {"object": "list", "data": data}

    @app.get("/v1/echorl/stats")
    async def stats(model: str | None = None) -> dict[str, Any]:
        s = served.engine_for(model).stats
        return {"num_requests": s.num_requests, "num_cached_tokens": s.num_cached_tokens,
                "num_computed_tokens": s.num_computed_tokens, "reuse_rate": s.reuse_rate,
                "num_evicted_blocks": s.num_evicted_blocks, "num_hash_collisions": s.num_hash_collisions}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(req: LoadLoraRequest) -> PlainTextResponse:
        replaced = await asyncio.to_thread(served.load, req.lora_name, req.lora_path)
        verb = "replaced" if replaced else "added"
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' {verb} successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(req: UnloadLoraRequest) -> PlainTextResponse:
        served.unload(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        eng = served.engine_for(req.model)
        tok = eng.llm.tokenizer
        prompts = [_check(eng, p) for p in req.prompts()]
        texts = [p if isinstance(p, str) else tok.decode(ids) for p, ids in zip(req.prompts(), prompts, strict=True)]
        max_toks = [_max_tokens(eng, req.max_tokens, len(ids), 16) for ids in prompts]
        k = req.logprobs
        params = _sampling(req, min(max_toks), k is not None, k or 0)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": req.model or name}
        if req.stream:
            if req.echo or min(max_toks) == 0:
                raise OpenAIError("stream=true with echo or max_tokens=0 is not supported; send stream=false",
                                  param="stream")
            events = _events(_stream_submit(eng, prompts, params, req.n, req.priority))
            return StreamingResponse(_stream_completion(eng, events, head, req, len(prompts), params),
                                     media_type="text/event-stream")
        echo_lp: list[Any] = [None] * len(prompts)
        if req.echo and k is not None:
            echo_lp = [await asyncio.to_thread(eng.prompt_logprobs, ids, k) for ids in prompts]
        results = (await _gather(_submit(eng, prompts, params, req.n, req.priority), request)
                   if min(max_toks) > 0 else [None] * (len(prompts) * req.n))
        choices = []
        for j, r in enumerate(results):
            pi = j // req.n
            text = (texts[pi] if req.echo else "") + (r.text if r else "")
            lp = None
            if k is not None:
                lp = completion_logprobs(tok, r, prompts[pi] if req.echo else None, echo_lp[pi], k,
                                         0 if req.echo else len(texts[pi]))
            choice = {"index": j, "text": text, "logprobs": lp, "finish_reason": r.finish_reason if r else "length"}
            if req.return_token_ids:
                choice.update(token_ids=list(r.token_ids) if r else [], prompt_token_ids=list(prompts[pi]))
            choices.append(choice)
        return {**head, "choices": choices, "usage": usage(prompts, results, req.n)}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        eng = served.engine_for(req.model)
        try:
            ids = eng.llm.chat_ids([{"role": m.role, "content": m.text()} for m in req.messages])
        except Exception as e:  # a template that rejects the conversation (e.g. role order)
            raise OpenAIError(f"the chat template rejected the messages: {e}", param="messages") from e
        ids = _check(eng, ids, "messages")
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = _sampling(req, _max_tokens(eng, requested, len(ids), None), req.logprobs, req.top_logprobs or 0)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model or name}
        if req.stream:
            events = _events(_stream_submit(eng, [ids], params, req.n, req.priority))
            return StreamingResponse(_stream_chat(eng, events, head, req, params), media_type="text/event-stream")
        results = await _gather(_submit(eng, [ids], params, req.n, req.priority), request)
        tok = eng.llm.tokenizer
        choices = [{"index": j, "message": {"role": "assistant", "content": r.text},
                    "logprobs": chat_logprobs(tok, r.token_ids, r.logprobs, r.top_logprobs) if req.logprobs else None,
                    "finish_reason": r.finish_reason} for j, r in enumerate(results)]
        return {**head, "object": "chat.completion", "choices": choices, "usage": usage([ids], results, req.n)}

    return app


def _check(eng: LLMEngine, prompt: str | list[int], param: str = "prompt") -> list[int]:
    try:
        return eng.validate_prompt(prompt)
    except ValueError as e:
        raise OpenAIError(str(e), param=param) from e


async def _stream_completion(eng: LLMEngine, events: AsyncIterator[tuple], head: dict[str, Any],
                             req: CompletionRequest, n_prompts: int, params: SamplingParams) -> AsyncIterator[str]:
    tok = eng.llm.tokenizer
    detok = [Detokenizer(tok, params.stop) for _ in range(n_prompts * req.n)]
    results: dict[int, GenerationResult] = {}
    k = req.logprobs
    try:
        async for ev in events:
            i = ev[1]
            if ev[0] == "token":
                delta = detok[i].push(ev[2])
                lp = completion_logprobs(tok, _One(ev), None, None, k, 0) if k is not None else None
                if delta or lp:
                    yield _sse({**head, "choices": [{"index": i, "text": delta, "logprobs": lp,
                                                     "finish_reason": None}]})
            else:
                results[i] = ev[2]
                yield _sse({**head, "choices": [{"index": i, "text": detok[i].finish(ev[2].text), "logprobs": None,
                                                 "finish_reason": ev[2].finish_reason}]})
    except OpenAIError as e:
        yield _sse(error_body(e.message, e.type, e.param, e.code))
    if req.stream_options and req.stream_options.include_usage and len(results) == len(detok):
        ordered = [results[j] for j in range(len(detok))]
        yield _sse({**head, "choices": [], "usage": usage([r.prompt_token_ids for r in ordered[:: req.n]],
                                                          ordered, req.n)})
    yield "data: [DONE]\n\n"


async def _stream_chat(eng: LLMEngine, events: AsyncIterator[tuple], head: dict[str, Any],
                       req: ChatCompletionRequest, params: SamplingParams) -> AsyncIterator[str]:
    tok = eng.llm.tokenizer
    head = {**head, "object": "chat.completion.chunk"}
    detok = [Detokenizer(tok, params.stop) for _ in range(req.n)]
    results: dict[int, GenerationResult] = {}
    for i in range(req.n):
        yield _sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
    try:
        async for ev in events:
            i = ev[1]
            if ev[0] == "token":
                delta = detok[i].push(ev[2])
                lp = chat_logprobs(tok, [ev[2]], [ev[3]], [ev[4]] if ev[4] else None) if req.logprobs else None
                if delta or lp:
                    yield _sse({**head, "choices": [{"index": i, "delta": {"content": delta}, "logprobs": lp,
                                                     "finish_reason": None}]})
            else:
                results[i] = ev[2]
                rest = detok[i].finish(ev[2].text)
                yield _sse({**head, "choices": [{"index": i, "delta": {"content": rest} if rest else {},
                                                 "logprobs": None, "finish_reason": ev[2].finish_reason}]})
    except OpenAIError as e:
        yield _sse(error_body(e.message, e.type, e.param, e.code))
    if req.stream_options and req.stream_options.include_usage and len(results) == req.n:
        ordered = [results[j] for j in range(req.n)]
        yield _sse({**head, "choices": [], "usage": usage([ordered[0].prompt_token_ids], ordered, req.n)})
    yield "data: [DONE]\n\n"


class _One:
    """One streamed token as a GenerationResult-like object (for :func:`completion_logprobs`)."""

    def __init__(self, ev: tuple) -> None:
        self.token_ids, self.logprobs = [ev[2]], [ev[3]]
        self.top_logprobs = [ev[4]] if ev[4] is not None else None


def build_parser() -> argparse.ArgumentParser:
    from echorl_agent.llm.serving.args import add_serve_arguments

    return add_serve_arguments(argparse.ArgumentParser(
        prog="echorl serve", description="Serve a model with OpenAI-compatible routes."))


def serve(args: argparse.Namespace) -> int:
    """Load the model, start the engine loop, run uvicorn until SIGINT/SIGTERM (``echorl serve``)."""
    import uvicorn

    from echorl_agent.llm.engine.scheduler import SchedulerConfig

    cfg = EngineConfig(
        prefix_cache=PrefixCacheConfig(
            block_size=args.block_size, max_tokens=args.max_cached_tokens, enable_prefix_caching=not args.no_prefix_cache
        ),
        scheduler=SchedulerConfig(policy=args.policy),
        max_num_seqs=args.max_num_seqs,
        weight_dtype=args.weight_dtype,
    )
    engine = LLMEngine(load_model(args.model), cfg).start()
    app = create_app(engine, args.served_model_name or args.model, max_loras=args.max_loras)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    try:
        uvicorn.Server(config).run()
    finally:
        app.state.models.close()
        engine.abort_all()
        engine.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m echorl_agent.llm.serving.server [options]`` (the same options as ``echorl serve``)."""
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
