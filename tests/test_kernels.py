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

from echorl_agent.kernels import (
    attention_bandwidth_cost,
    bandwidth_efficiency,
    bandwidth_priority,
    effective_bandwidth_cost,
    ema_plan_update,
    longest_common_prefix,
    plan_surprise,
    priority_sample,
)
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


def test_longest_common_prefix_reference_values():
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 9, 9], [5, 5, 5, 5], [1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 3, 4, 7]])
    out = longest_common_prefix(a, torch.tensor([4, 4, 4, 2]), b, torch.tensor([5]), use_triton=False)
    assert out.tolist() == [4, 2, 0, 2]
    # b shorter than a: capped by b_len
    out = longest_common_prefix(a[:1], None, b, torch.tensor([3]), use_triton=False)
    assert out.tolist() == [3]
    with pytest.raises(ValueError, match="batch size"):
        longest_common_prefix(a, None, torch.zeros(2, 4, dtype=torch.long), None, use_triton=False)


def test_priority_sample_reference_distribution_and_weights():
    scores = torch.tensor([0.0, 1.0, 2.0])
    u = torch.tensor([0.0, 0.5, 0.999])
    res = priority_sample(scores, u, beta=1.0, beta_is=1.0, use_triton=False)
    p = torch.softmax(scores, 0)
    cdf = torch.cumsum(p, 0)
    expected = [int((cdf <= x * cdf[-1]).sum()) for x in u.tolist()]
    assert res.indices.tolist() == expected
    w = (3 * p[res.indices]) ** -1.0
    assert torch.allclose(res.weights, w / w.max())
    assert torch.allclose(res.probs, p)


def test_bandwidth_reference_values():
    t = torch.tensor([0, 1, 4, 10])
    assert attention_bandwidth_cost(t, 2.0, use_triton=False).tolist() == [0.0, 2.0, 20.0, 110.0]
    tp = torch.tensor([0, 0, 3, 10])
    assert effective_bandwidth_cost(t, tp, use_triton=False).tolist() == [0.0, 1.0, 4.0, 0.0]
    with pytest.raises(ValueError, match="t_prefix"):
        effective_bandwidth_cost(tp, t)
    pri = bandwidth_priority(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0]), 0.5)
    assert pri.tolist() == [1.0 / 2.5, 2.0 / 4.5]
    eta = bandwidth_efficiency(
        torch.tensor([2.0, 4.0]), torch.tensor([10.0, 20.0]), torch.tensor([1.0, 0.5]), torch.tensor([-2.0, 4.0])
    )
    assert eta.item() == pytest.approx(3.0 / (15.0 + 2.0))


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


@interp_only
def test_longest_common_prefix_kernel():
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 50, (300,), generator=g)
    a = base.repeat(6, 1).clone()
    cuts = [0, 1, 7, 255, 256, 299]
    for row, c in enumerate(cuts):
        a[row, c] = 999  # first mismatch at c
    a_len = torch.tensor([300, 300, 300, 300, 300, 100])
    for b, b_len in [(base[None], torch.tensor([300])), (base.repeat(6, 1), torch.tensor([300, 5, 300, 300, 300, 300]))]:
        ref = longest_common_prefix(a, a_len, b, b_len, use_triton=False)
        out = longest_common_prefix(a, a_len, b, b_len, use_triton=True)
        assert out.tolist() == ref.tolist()
    assert longest_common_prefix(a, a_len, base[None], None, use_triton=True).tolist() == [0, 1, 7, 255, 256, 100]


@interp_only
@pytest.mark.parametrize("n", [1, 7, 1500])
def test_priority_sample_kernel(n):
    g = torch.Generator().manual_seed(n)
    scores, u = torch.randn(n, generator=g) * 2, torch.rand(64, generator=g)
    ref = priority_sample(scores, u, 0.7, 0.4, use_triton=False)
    out = priority_sample(scores, u, 0.7, 0.4, use_triton=True)
    assert out.indices.tolist() == ref.indices.tolist()
    torch.testing.assert_close(out.probs, ref.probs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.weights, ref.weights, rtol=1e-5, atol=1e-6)


@interp_only
def test_bandwidth_kernels():
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, 100_000, (300,), generator=g)
    tp = (t.double() * torch.rand(300, generator=g, dtype=torch.float64)).long()
    for scale in (1.0, 0.37):
        assert torch.equal(attention_bandwidth_cost(t, scale, use_triton=True), attention_bandwidth_cost(t, scale, use_triton=False))
        assert torch.equal(
            effective_bandwidth_cost(t, tp, scale, use_triton=True), effective_bandwidth_cost(t, tp, scale, use_triton=False)
        )
    r, b, q = torch.rand(300, generator=g), torch.rand(300, generator=g) * 10, torch.rand(300, generator=g)
    torch.testing.assert_close(bandwidth_priority(r, b, q, use_triton=True), bandwidth_priority(r, b, q, use_triton=False))
    ret, be = torch.rand(300, generator=g), torch.rand(300, generator=g) * 100
    w, lpg = torch.rand(40, generator=g), torch.randn(40, generator=g)
    torch.testing.assert_close(
        bandwidth_efficiency(ret, be, w, lpg, use_triton=True), bandwidth_efficiency(ret, be, w, lpg, use_triton=False)
    )
    torch.testing.assert_close(
        bandwidth_efficiency(ret, be, use_triton=True), bandwidth_efficiency(ret, be, use_triton=False)
    )


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
    # every kernel comparison ran (none skipped) and passed: 11 kernel cases + 6 reference checks
    assert "17 passed" in summary and "skipped" not in summary, proc.stdout[-2000:]
