"""W8A8 projections for the engine's prefill of frozen layers (``EngineConfig.prefill_dtype="int8"``).

Prefill is compute-bound on a CPU, so int8 *weights* alone (:mod:`~echorl_agent.llm.quant.linear`) do not speed it
up; int8 *activations* do, since an int8 x int8 product has a higher arithmetic rate than float32. Rounding
SmolLM2's activations to int8 per token moves the policy (KL 0.031 over GoToLocal's admissible actions,
docs/results/engine-speed.md) because a few input channels carry outliers; SmoothQuant (Xiao et al. 2023, Eq. 4)
moves them into the weights first: input channel ``j`` is divided by

    s_j = max|X_j|^alpha / max|W_:j|^(1 - alpha)

and weight column ``j`` multiplied by it (exact in float), then activations are rounded to int8 per row and
weights per output channel (``benchmarks/int8_prefill_probe.py --mode smooth``: KL 0.0029 mean).

:class:`W8A8Linear` holds one or more projections that read the same input (q/k/v, or gate/up) as one int8 weight
with a shared smoothing vector (the input is divided and rounded once), :func:`pack_w8a8` builds one from the
float linears and the calibrated maxima ``max|X_j|``. The integer product :func:`int8_matmul` is exact, so a row's
result does not depend on the other rows or the thread count. Two backends give the same integers: ``w8a8.c``
(AVX2 ``vpmaddwd`` on a weight packed once by :func:`pack_weight`; it also fuses the quantization and the scales
around the product, with the same float32 operations in the same order as the torch path) and ``torch._int_mm``
(oneDNN). Which is faster depends on the CPU: on an AVX2 host without VNNI ``_int_mm`` was ~50x slower than float32
and the kernel ~1.6-2x faster (docs/results/engine-speed.md); on an AVX-512 VNNI host ``_int_mm`` ran a
[512, 576] x [576, 1536] product 7.7x faster than float32 (docs/results/engine-speed.md). So the first product
times both once on a fixed shape and keeps the faster (:func:`int8_backend`); the choice never changes a result.
"""

from __future__ import annotations

import ctypes
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from echorl_agent.kernels.cbuild import build_shared_library

__all__ = ["W8A8Linear", "pack_w8a8", "pack_weight", "smoothing", "int8_matmul", "int8_backend", "quantize_rows",
           "DEFAULT_ALPHA"]

DEFAULT_ALPHA = 0.5
"""SmoothQuant's migration strength: the probe's setting (0.5 halves each outlier's log-magnitude between the
activation and the weight)."""
_S_RANGE = (1e-5, 1e5)
"""Smoothing factors are clamped to this range (a channel never seen in calibration keeps s = 1, see
:func:`smoothing`)."""
_MM_MIN_ROWS = 17
"""``torch._int_mm`` needs more than 16 rows; fewer are zero-padded (padding rows do not change the others)."""
_SRC = Path(__file__).with_name("w8a8.c")
_lib: ctypes.CDLL | None = None
_tried = False
_backend: str | None = None


def _load() -> ctypes.CDLL | None:
    """The compiled ``w8a8.c``, or None (one warning) without a C compiler."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    simd = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    flags = ["-O3", "-shared", "-fPIC", "-std=gnu99", "-pthread", "-ffp-contract=off"] + (["-mavx2"] if simd else [])
    try:
        lib = ctypes.CDLL(str(build_shared_library(_SRC, flags, ["-lm"])))
    except OSError as exc:
        warnings.warn(f"W8A8 kernel unavailable ({exc}); using torch._int_mm", RuntimeWarning, stacklevel=2)
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.w8a8_gemm_packed.argtypes = [p, i, i, p, i, p, i]
    lib.w8a8_gemm_packed.restype = i
    lib.w8a8_linear.argtypes = [p, i, i, p, p, i, p, p, p, i]
    lib.w8a8_linear.restype = i
    lib.w8a8_simd.restype = i
    _lib = lib
    return lib


def int8_backend() -> str:
    """``"kernel"`` (``w8a8.c``) or ``"int_mm"`` (``torch._int_mm``): whichever ran a [128, 576] x [576, 1536]
    product faster on this CPU (best of 3 each, timed once per process); ``"int_mm"`` when the kernel does not build.
    """
    global _backend
    if _backend is None:
        if _load() is None:
            _backend = "int_mm"
            return _backend
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (128, 576), dtype=torch.int8, generator=g)
        w = torch.randint(-127, 128, (1536, 576), dtype=torch.int8, generator=g)
        wp = pack_weight(w)  # packed once, as W8A8Linear keeps it: the timing is the product alone
        best = {}
        for name, use in (("kernel", True), ("int_mm", False)):
            int8_matmul(a, w, use, wp)  # warm-up (oneDNN builds its primitive on the first call)
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                int8_matmul(a, w, use, wp)
                ts.append(time.perf_counter() - t)
            best[name] = min(ts)
        _backend = min(best, key=best.get)
    return _backend


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """int8 ``w [N, K]`` (K even) in ``w8a8.c``'s layout: panels of 16 outputs (N zero-padded to a multiple of 16),
    each ``[K/2, 16, 2]`` -- for every pair of inputs, the 16 outputs' two weights side by side."""
    N, K = w.shape
    if K % 2:
        raise ValueError(f"pack_weight needs an even number of inputs, got K={K}")
    n_pad = -N % 16
    if n_pad:
        w = torch.cat([w, w.new_zeros(n_pad, K)])
    return w.reshape(-1, 16, K // 2, 2).permute(0, 2, 1, 3).contiguous()


def _threads(M: int, K: int, N: int) -> int:
    return torch.get_num_threads() if M * N * K >= 1 << 22 else 1


def _use_kernel(a: torch.Tensor, K: int, use_kernel: bool | None) -> ctypes.CDLL | None:
    """The kernel library when it should run this product (see :func:`int8_matmul`'s ``use_kernel``), else None."""
    fits = a.device.type == "cpu" and K % 32 == 0  # what the kernel handles
    if use_kernel is None and fits:
        use_kernel = int8_backend() == "kernel"
    lib = _load() if use_kernel and fits else None
    if use_kernel and lib is None:
        raise RuntimeError("the W8A8 kernel is unavailable (no C compiler, a non-CPU tensor or K % 32 != 0)")
    return lib


def int8_matmul(a: torch.Tensor, w: torch.Tensor, use_kernel: bool | None = None,
                packed: torch.Tensor | None = None) -> torch.Tensor:
    """Exact ``a @ w.T`` in int32 for int8 ``a [M, K]`` and ``w [N, K]`` with values in -127..127.

    Args:
        use_kernel: True = ``w8a8.c`` (error when it is unavailable), False = ``torch._int_mm`` (the reference),
            None = the faster of the two on this CPU (:func:`int8_backend`) for CPU tensors with K a multiple of 32,
            else ``torch._int_mm``.
        packed: ``pack_weight(w)``, if the caller keeps it (else the kernel packs ``w`` for this call; ignored by
            ``torch._int_mm``).
    """
    M, K = a.shape
    N = w.shape[0]
    lib = _use_kernel(a, K, use_kernel)
    if lib is not None:
        wp = pack_weight(w) if packed is None else packed
        a = a.contiguous()
        y = torch.empty(M, N, dtype=torch.int32)
        rc = lib.w8a8_gemm_packed(a.data_ptr(), M, K, wp.data_ptr(), N, y.data_ptr(), _threads(M, K, N))
        if rc != 0:
            raise MemoryError(f"w8a8_gemm_packed failed ({rc}) for a [{M}, {K}] x [{K}, {N}] product")
        return y
    if M < _MM_MIN_ROWS:
        a = torch.cat([a, a.new_zeros(_MM_MIN_ROWS - M, K)])
    return torch._int_mm(a, w.t())[:M]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of float ``x [M, K]``: codes in -127..127 and scales ``[M, 1]`` (``x ~ codes * scale``).

    An all-zero row gets scale 0 (its codes are 0, so its products are exactly 0).
    """
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(x * inv).clamp_(-127, 127).to(torch.int8), scale


def smoothing(act_max: torch.Tensor | None, weight: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """SmoothQuant's ``s_j = max|X_j|^alpha / max|W_:j|^(1 - alpha)`` for float ``weight [out, in]``.

    ``act_max`` None (no calibration) gives s = 1 everywhere (plain per-token W8A8). A channel whose calibrated
    maximum or weight column is zero (or not finite) keeps s = 1: dividing by a tiny s would blow up any
    activation the calibration never saw there and flatten every other channel of its row to zero.
    """
    if act_max is None:
        return torch.ones(weight.shape[1], dtype=torch.float32, device=weight.device)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got alpha={alpha}")
    a = act_max.detach().float().to(weight.device)
    wmax = weight.detach().float().abs().amax(dim=0)
    if a.shape != wmax.shape:
        raise ValueError(f"act_max must have one entry per input channel ({wmax.shape[0]}), got {tuple(a.shape)}")
    ok = (a > 0) & (wmax > 0) & torch.isfinite(a) & torch.isfinite(wmax)
    s = a.clamp_min(1e-30).pow(alpha) / wmax.clamp_min(1e-30).pow(1.0 - alpha)
    return torch.where(ok, s, torch.ones_like(s)).clamp_(*_S_RANGE)


class W8A8Linear(torch.nn.Module):
    """``[x W_1^T + b_1, x W_2^T + b_2, ...]`` with ``x / s`` rounded to int8 per row and ``W_i * s`` per output.

    Args:
        weights: float weights ``[out_i, in]`` of the projections that read the same input (q/k/v, gate/up).
        biases: their biases (None entries allowed; kept float32 and added after the product).
        act_max: calibrated ``max|X_j|`` ``[in]`` of the shared input (None: no smoothing).
        alpha: smoothing strength (:func:`smoothing`).

    ``forward`` returns one float32 tensor ``[M, sum out_i]``; :attr:`splits` gives each projection's width.
    """

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None = None,
                 act_max: torch.Tensor | None = None, alpha: float = DEFAULT_ALPHA) -> None:
        super().__init__()
        ws = [w.detach().float() for w in weights]
        if not ws or len({w.shape[1] for w in ws}) != 1:
            raise ValueError(f"weights must share in_features, got shapes {[tuple(w.shape) for w in ws]}")
        w = torch.cat(ws)  # [sum out, in]
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.splits = [x.shape[0] for x in ws]
        self.alpha = alpha
        s = smoothing(act_max, w, alpha)
        self.inv_s = (1.0 / s).contiguous()  # [in]
        ws_ = w * s
        wmax = ws_.abs().amax(dim=1)
        self.w_scale = (wmax / 127.0).contiguous()  # [out]
        inv = torch.where(wmax > 0, 127.0 / wmax, torch.zeros_like(wmax))
        self.w_q = torch.round(ws_ * inv[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # [out, in]
        self._w_packed: torch.Tensor | None = None
        bs = list(biases) if biases is not None else [None] * len(ws)
        if len(bs) != len(ws):
            raise ValueError(f"biases must have one entry per weight: {len(bs)} for {len(ws)}")
        if all(b is None for b in bs):
            self.bias = None
        else:
            self.bias = torch.cat([torch.zeros(n) if b is None else b.detach().float()
                                   for n, b in zip(self.splits, bs, strict=True)])

    def dequantized_weight(self) -> torch.Tensor:
        """float32 ``[out, in]``: the weight this module multiplies the un-smoothed input by (``w_q * scale / s``)."""
        return self.w_q.float() * self.w_scale[:, None] * self.inv_s

    @property
    def w_packed(self) -> torch.Tensor:
        """:attr:`w_q` in the kernel's layout (:func:`pack_weight`), built on first use."""
        if self._w_packed is None:
            self._w_packed = pack_weight(self.w_q)
        return self._w_packed

    def forward(self, x: torch.Tensor, use_kernel: bool | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        M, K, N = x2.shape[0], self.in_features, self.out_features
        lib = _use_kernel(x2, K, use_kernel)
        if lib is not None:  # quantization, product and scales in one call (the same floats as below)
            x2 = x2.contiguous()
            y = torch.empty(M, N, dtype=torch.float32)
            bias = self.bias.data_ptr() if self.bias is not None else None
            rc = lib.w8a8_linear(x2.data_ptr(), M, K, self.inv_s.data_ptr(), self.w_packed.data_ptr(), N,
                                 self.w_scale.data_ptr(), bias, y.data_ptr(), _threads(M, K, N))
            if rc != 0:
                raise MemoryError(f"w8a8_linear failed ({rc}) for {M} rows")
        else:
            xq, xs = quantize_rows(x2 * self.inv_s)
            y = int8_matmul(xq, self.w_q, False).float().mul_(xs).mul_(self.w_scale)
            if self.bias is not None:
                y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, splits={self.splits}, alpha={self.alpha}"


def pack_w8a8(linears: Sequence[torch.nn.Module], act_max: torch.Tensor | None,
              alpha: float = DEFAULT_ALPHA) -> W8A8Linear:
    """A :class:`W8A8Linear` of ``linears`` (``nn.Linear``-like: ``.weight``, ``.bias``) reading one input whose
    per-channel maxima are ``act_max``."""
    return W8A8Linear([lin.weight for lin in linears], [lin.bias for lin in linears], act_max, alpha)
