"""Shared test configuration: one torch thread, offline HF, the ../shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:  # 2 threads were measured 10-30x slower for small models on the 2-core CI machine
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass

#: ../shared/data beside the repository (present in CI, may be absent elsewhere).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GSM8K_FILE = SHARED_DATA / "gsm8k" / "test.jsonl"
CRUXEVAL_FILE = SHARED_DATA / "cruxeval" / "cruxeval.jsonl"

#: Extra ``gym.make`` kwargs the registry-driven suite needs for data-backed ids (None = skip when absent).
REGISTRY_MAKE_KWARGS: dict[str, dict | None] = {
    "EchoRL/GSM8K-v0": {"data_path": str(GSM8K_FILE)} if GSM8K_FILE.exists() else None,
}


def _miniwob_kwargs() -> dict[str, dict | None]:
    """MiniWoB ids run with a 120 s MiniWoB episode timer (its 10 s default can expire on a busy machine while a
    pickled clone's browser starts); ``None`` (skip) when Chromium or the extra is missing."""
    import echorl_envs
    from echorl_envs.miniwob import chromium_missing_reason

    ok = chromium_missing_reason() is None
    return {i: ({"episode_seconds": 120.0} if ok else None) for i in echorl_envs.env_ids("miniwob")}


REGISTRY_MAKE_KWARGS.update(_miniwob_kwargs())

#: MiniWoB ids the default suite runs through the registry tests (one click task, one typing form); every
#: registry test starts one to three real Chromium browsers (~4 s each here), so the other MiniWoB ids run
#: under ``make test-slow``.
MINIWOB_FAST_IDS = ("EchoRL/MiniWoB-click-button-v0", "EchoRL/MiniWoB-login-user-v0")


def registry_skip_reason(env_id: str) -> str | None:
    """Why the registry suite cannot run ``env_id`` here (None when it can)."""
    if REGISTRY_MAKE_KWARGS.get(env_id, {}) is not None:
        return None
    if env_id.startswith("EchoRL/MiniWoB-"):
        from echorl_envs.miniwob import chromium_missing_reason

        return f"{env_id}: {chromium_missing_reason()}"
    return f"data for {env_id} is not available here"
