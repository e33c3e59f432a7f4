"""OpenAI-compatible HTTP server over :class:`~echorl_agent.llm.engine.LLMEngine` (``echorl serve``).

Routes (the subset of the OpenAI API that vLLM/SGLang also serve): ``GET /v1/models``, ``POST /v1/completions``
(string or token-id prompts, ``logprobs``), ``POST /v1/chat/completions`` (chat template, ``logprobs``), plus
``GET /v1/echorl/stats`` with the prefix-cache counters (cached vs computed prompt tokens, reuse rate rho).
Every request goes through the shared engine, so concurrent clients are batched and share cached prefixes;
``usage.prompt_tokens_details.cached_tokens`` reports the reuse per request, as OpenAI does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from echorl_agent.llm.engine import EngineConfig, GenerationResult, LLMEngine, SamplingParams
from echorl_agent.llm.models import DEFAULT_MODEL, load_model
from echorl_agent.llm.prefix_cache import PrefixCacheConfig

__all__ = ["create_app", "main", "build_parser"]


def _params(body: dict[str, Any], chat: bool) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens") if chat else None
    max_tokens = max_tokens or body.get("max_tokens") or 16
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    want_lp = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=1.0 if body.get("temperature") is None else float(body["temperature"]),  # OpenAI's default
        top_p=float(body.get("top_p") or 1.0),
        seed=body.get("seed"),
        stop=tuple(stop),
        logprobs=want_lp,
    )


def _usage(r: GenerationResult) -> dict[str, Any]:
    n_prompt, n_gen = len(r.prompt_token_ids), len(r.token_ids)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_gen,
        "total_tokens": n_prompt + n_gen,
        "prompt_tokens_details": {"cached_tokens": r.num_cached_tokens},
    }


def create_app(engine: LLMEngine, model_name: str | None = None):
    """A FastAPI app serving ``engine`` (start the engine's loop with ``engine.start()`` first)."""
    from fastapi import FastAPI, HTTPException

    name = model_name or engine.llm.name
    app = FastAPI(title="echorl OpenAI-compatible server")
    tok = engine.llm.tokenizer

    async def run(prompt: Any, params: SamplingParams) -> GenerationResult:
        try:
            fut = engine.submit(prompt, params)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        return await asyncio.wrap_future(fut)

    def check(body: dict[str, Any]) -> None:
        m = body.get("model")
        if m is not None and m != name:
            raise HTTPException(status_code=404, detail=f"model {m!r} is not served here; available: [{name!r}]")
        if int(body.get("n") or 1) != 1:
            raise HTTPException(status_code=400, detail="only n=1 is supported")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "echorl"}]}

    @app.get("/v1/echorl/stats")
    async def stats() -> dict[str, Any]:
        s = engine.stats
        return {
            "num_requests": s.num_requests,
            "num_cached_tokens": s.num_cached_tokens,
            "num_computed_tokens": s.num_computed_tokens,
            "reuse_rate": s.reuse_rate,
            "num_evicted_blocks": s.num_evicted_blocks,
            "num_hash_collisions": s.num_hash_collisions,
        }

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any]) -> dict[str, Any]:
        check(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise HTTPException(status_code=400, detail="send one prompt per request (batching is server-side)")
            prompt = prompt[0]
        if not prompt:
            raise HTTPException(status_code=400, detail="prompt must be a non-empty string or list of token ids")
        try:
            params = _params(body, chat=False)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        r = await run(prompt, params)
        lp = None
        if params.logprobs:
            toks = [tok.decode([t]) for t in r.token_ids]
            lp = {"tokens": toks, "token_logprobs": r.logprobs, "top_logprobs": None, "text_offset": None}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": [{"index": 0, "text": r.text, "finish_reason": r.finish_reason, "logprobs": lp}],
            "usage": _usage(r),
        }

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        check(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(status_code=400, detail="messages must be a non-empty list of {role, content}")
        try:
            params = _params(body, chat=True)
            ids = engine.llm.chat_ids([{"role": m["role"], "content": m["content"]} for m in messages])
        except (ValueError, KeyError, TypeError) as e:
            raise HTTPException(status_code=400, detail=f"bad request: {e}") from e
        r = await run(ids, params)
        lp = None
        if params.logprobs:
            lp = {"content": [{"token": tok.decode([t]), "logprob": v, "bytes": None, "top_logprobs": []}
                              for t, v in zip(r.token_ids, r.logprobs or [], strict=True)]}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                         "finish_reason": r.finish_reason, "logprobs": lp}],
            "usage": _usage(r),
        }

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echorl serve", description="Serve a model with OpenAI-compatible routes.")
    p.add_argument("--model", default=DEFAULT_MODEL, help="embedded name, HF id or local folder")
    p.add_argument("--served-model-name", default=None, help="name reported by /v1/models (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=16, help="sequences decoded together")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-cached-tokens", type=int, default=16384, help="KV pool budget in tokens")
    p.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching (baseline)")
    p.add_argument("--policy", default="priority", choices=["priority", "bandwidth", "fcfs"])
    p.add_argument("--weight-dtype", default="float32", choices=["float32", "int8", "int4"],
                   help="decode weights: float32 (exact), int8 (fast on CPU) or int4 (smallest)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``echorl serve``: load the model, start the engine loop, run uvicorn."""
    import uvicorn

    from echorl_agent.llm.scheduler import SchedulerConfig

    args = build_parser().parse_args(argv)
    cfg = EngineConfig(
        prefix_cache=PrefixCacheConfig(
            block_size=args.block_size, max_tokens=args.max_cached_tokens, enable_prefix_caching=not args.no_prefix_cache
        ),
        scheduler=SchedulerConfig(policy=args.policy),
        max_num_seqs=args.max_num_seqs,
        weight_dtype=args.weight_dtype,
    )
    engine = LLMEngine(load_model(args.model), cfg).start()
    try:
        uvicorn.run(create_app(engine, args.served_model_name or args.model), host=args.host, port=args.port)
    finally:
        engine.stop()
    return 0
