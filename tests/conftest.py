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
