"""benchmarks/gpu_check.py --dry-run: the GPU check's code paths on CPU (Triton kernels in the interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_passes_every_row_on_random_weights_in_smollm2_shape(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("peft")
    from echorl_agent.llm import load_model

    try:
        folder = load_model().extra["folder"]  # config + tokenizer of the embedded model (weights unused)
    except ValueError as e:
        pytest.skip(str(e))
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--model-dir",
                           folder, "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["part"] for r in rows] == ["kernel"] * 3 + ["engine"] * 2 + ["gigpo"]
    assert all(r["ok"] is True for r in rows), rows
    assert "greedy tokens equal HF's: 2/2" in rows[3]["check"]
    assert "adapter changed: True" in rows[5]["check"]
    assert "part" in proc.stdout and "total" in proc.stdout  # the one table was printed


def test_gpu_check_refuses_to_run_without_cuda_unless_dry_run():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--skip", "kernels", "engine",
                           "gigpo"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
