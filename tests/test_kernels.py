"""Kernels of echorl_agent.kernels: torch references against plain formulas, and Triton kernels against the
references under TRITON_INTERPRET=1.

The interpreter must be selected before ``@triton.jit`` runs, i.e. before echorl_agent.kernels is first imported;
other test modules import it without the interpreter, so the kernel comparisons run in a subprocess
(``test_kernels_match_reference_under_interpreter``) that re-runs this file with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from echorl_agent.kernels import ema_plan_update, plan_surprise
from echorl_agent.kernels._dispatch import HAS_TRITON, use_kernel

torch.set_num_threads(1)
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
interp_only = pytest.mark.skipif(not (INTERP and HAS_TRITON), reason="runs in the TRITON_INTERPRET=1 subprocess")


# ------------------------------------------------------------------ references (in-process, no interpreter)
def test_dispatch_defaults_to_reference_on_cpu():
    x = torch.zeros(3)
    assert use_kernel(False, x) is False
    if not INTERP and os.environ.get("ECHORL_USE_TRITON") != "1":
        assert use_kernel(None, x) is False


def test_ema_plan_update_reference_values():
    tau = torch.tensor([1.0, -2.0])
    plans = torch.tensor([[3.0, 0.0], [5.0, 2.0]])
    out = ema_plan_update(tau, plans, 0.25, use_triton=False)
    # mean plan = [4, 1]; 0.75*[1,-2] + 0.25*[4,1] = [1.75, -1.25]
    assert torch.equal(out, torch.tensor([1.75, -1.25]))
    with pytest.raises(ValueError, match="decay"):
        ema_plan_update(tau, plans, 0.0)


def test_plan_surprise_reference_values():
    plans = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    tau = torch.tensor([1.0, 0.0])
    r = torch.tensor([-2.0, 0.5])
    out = plan_surprise(plans, tau, r, alpha=0.5, use_triton=False)
    assert torch.allclose(out, torch.tensor([1.0 + 1.0, 1.0 + 9.0 + 0.25]))


# ------------------------------------------------------------------ kernels vs references (interpreter)
@interp_only
@pytest.mark.parametrize("b,d", [(1, 3), (5, 17), (3, 1100)])
def test_ema_plan_update_kernel(b, d):
    g = torch.Generator().manual_seed(b * 100 + d)
    tau, plans = torch.randn(d, generator=g), torch.randn(b, d, generator=g)
    ref = ema_plan_update(tau, plans, 0.1, use_triton=False)
    out = ema_plan_update(tau, plans, 0.1, use_triton=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@interp_only
@pytest.mark.parametrize("n,d", [(1, 1), (70, 5), (130, 200)])
def test_plan_surprise_kernel(n, d):
    g = torch.Generator().manual_seed(n + d)
    plans, tau, r = torch.randn(n, d, generator=g), torch.randn(d, generator=g), torch.randn(n, generator=g)
    ref = plan_surprise(plans, tau, r, 0.3, use_triton=False)
    out = plan_surprise(plans, tau, r, 0.3, use_triton=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ driver
@pytest.mark.skipif(INTERP or not HAS_TRITON, reason="driver only runs outside the interpreter, with triton")
def test_kernels_match_reference_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not interpreter", __file__],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    # every kernel comparison ran (none skipped) and passed: 6 kernel cases + 3 reference checks
    assert "9 passed" in summary and "skipped" not in summary, proc.stdout[-2000:]
