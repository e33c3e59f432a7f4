"""Command-line options of ``echorl serve``."""

from __future__ import annotations

import argparse

from echorl_agent.llm.engine.config import WEIGHT_DTYPES

__all__ = ["add_serve_arguments"]


def add_serve_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the server's options to ``p`` (used by ``echorl serve`` and ``python -m echorl_agent.llm.serving.server``)."""
    p.add_argument("--model", default="smollm2-135m",
                   help="embedded name (smollm2-135m), Hugging Face id or local folder (default: %(default)s)")
    p.add_argument("--served-model-name", default=None, help="name reported by /v1/models (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="sequences decoded together (default: %(default)s)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)")
    p.add_argument("--max-cached-tokens", type=int, default=16384,
                   help="KV pool budget in tokens, per engine (default: %(default)s)")
    p.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching (baseline)")
    p.add_argument("--policy", default="priority", choices=["priority", "bandwidth", "fcfs"],
                   help="request ordering (default: %(default)s, EchoRL Eq. 5)")
    p.add_argument("--weight-dtype", default="float32", choices=WEIGHT_DTYPES,
                   help="decode weights: float32 (exact), int8 (fast on CPU, best batched) or int4 (smallest, fastest single stream)")
    p.add_argument("--max-loras", type=int, default=2,
                   help="LoRA adapters loaded at once via /v1/load_lora_adapter (default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=3.0,
                   help="seconds in-flight requests get after SIGTERM before they are aborted (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (default: %(default)s)")
    return p
