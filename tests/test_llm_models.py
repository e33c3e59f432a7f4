"""One layout per architecture (echorl_agent.llm.models): the engine and the learner's forward run tiny random-weight
Llama, Qwen2 and Mistral models and give HF transformers' own logits; no module name is written outside the layouts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

transformers = pytest.importorskip("transformers")

from echorl_agent.llm import (  # noqa: E402  # noqa: E402
    SUPPORTED_MODEL_TYPES,
    EngineConfig,
    LLMEngine,
    LoadedModel,
    PrefixCacheConfig,
    SamplingParams,
    layout_for,
)
from echorl_agent.llm.engine.runner import SeqChunk  # noqa: E402
from echorl_agent.llm_rl.forward import DecoderParts, candidate_token_logprobs, pack, run_layers  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[1] / "echorl_agent"
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = ("llama", "qwen2", "mistral")
ATOL = 1e-5


def _tiny(family: str) -> torch.nn.Module:
    """A random-weight model of ``family``: weights large enough that logits are far from uniform, norm weights
    away from 1, and (Qwen2) non-zero q/k/v biases."""
    configs = {
        "llama": lambda: transformers.LlamaConfig(**TINY, tie_word_embeddings=True),  # SmolLM2 ties its head
        "qwen2": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=False),
        "mistral": lambda: transformers.MistralConfig(**TINY, sliding_window=None, tie_word_embeddings=False),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[family](), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3 if name.endswith(".bias") else 0.12)
    return model.eval().requires_grad_(False)


def _tokenizer():
    """A real (word-level) tokenizer over the tiny vocabulary: the engine reads its EOS id and decodes with it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(TINY["vocab_size"])}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                                eos_token="t1", unk_token="t0")


def _engine(model, **kw) -> LLMEngine:
    pc = PrefixCacheConfig(block_size=4, max_tokens=512)
    return LLMEngine(LoadedModel(model, _tokenizer(), "tiny"), EngineConfig(prefix_cache=pc, **kw))


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


PROMPT = [5, 17, 200, 3, 99, 42, 7, 128, 64, 250, 11]  # 11 tokens: three blocks of 4, the last partial


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    return request.param, _tiny(request.param)


def test_layout_names_each_family_and_its_facts(tiny):
    family, model = tiny
    layout = layout_for(model)
    assert layout.model_type == family
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (2, 4, 2, 16)
    assert layout.bias_projections == (("q", "k", "v") if family == "qwen2" else ())
    for role, lin in zip(("q", "k", "v", "o", "gate", "up", "down"), layout.projections(layout.decoder_layers(model)[1]),
                         strict=True):
        assert lin is model.get_submodule(layout.projection_name(1, role))
        assert (lin.bias is not None) == (role in layout.bias_projections)
        if lin.bias is not None:
            assert lin.bias.abs().min() > 0  # Qwen2's biases really take part in every comparison below
    assert layout.tied(model) == (family == "llama") == layout.tie_word_embeddings
    assert layout.layer_of(layout.projection_name(1, "up") + ".weight") == 1
    assert layout.layer_of(layout.names.lm_head + ".weight") is None


def test_engine_prefill_and_decode_logits_equal_hf(tiny):
    family, model = tiny
    eng = _engine(model)
    seq = list(PROMPT)
    table = list(range(8))  # 32 slots: the prompt and the decode steps below
    (prefill,) = eng.runner.forward([SeqChunk(seq, 0, table, all_logits=True)])
    ref = _hf_logits(model, seq)
    torch.testing.assert_close(prefill, ref, atol=ATOL, rtol=0)
    assert prefill.std() > 0.5  # far from uniform: the comparison sees the weights
    for _ in range(4):  # decode steps: one new token each, attending to the paged KV
        nxt = int(ref[-1].argmax())
        (step,) = eng.runner.forward([SeqChunk([nxt], len(seq), table)])
        seq.append(nxt)
        ref = _hf_logits(model, seq)
        torch.testing.assert_close(step, ref[-1], atol=ATOL, rtol=0)


def test_engine_greedy_generation_and_logprobs_equal_hf(tiny):
    family, model = tiny
    eng = _engine(model)
    (res,) = eng.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True))
    with torch.inference_mode():
        hf = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, min_new_tokens=6, do_sample=False)[0].tolist()
    assert res.token_ids == hf[len(PROMPT):]
    ref = torch.log_softmax(_hf_logits(model, hf)[len(PROMPT) - 1 : -1], dim=-1)
    expected = ref[torch.arange(6), torch.tensor(res.token_ids)]
    torch.testing.assert_close(torch.tensor(res.logprobs), expected, atol=ATOL, rtol=0)
    # scoring candidates after the cached prompt: summed log-probs equal HF's
    cands = [[3, 4, 5], [3, 4, 9], [77]]
    score = eng.score(PROMPT, cands)
    for c, got in zip(cands, score.logprobs, strict=True):
        lp = torch.log_softmax(_hf_logits(model, PROMPT + c), dim=-1)
        want = sum(float(lp[len(PROMPT) - 1 + j, t]) for j, t in enumerate(c))
        assert abs(got - want) < 1e-4


def test_learner_forward_logprobs_equal_hf(tiny):
    family, model = tiny
    parts = DecoderParts.of(model)
    cands = [[3, 4, 5], [3, 4, 9], [77, 1]]  # the first two share rows
    batch = pack(len(PROMPT), cands)
    x = parts.embed(torch.tensor(batch.row_ids(PROMPT)))
    x = run_layers(parts, x, batch, 0, len(parts.layers))
    got = candidate_token_logprobs(parts, x, batch)
    for c, lp in zip(cands, got, strict=True):
        ref = torch.log_softmax(_hf_logits(model, PROMPT + c), dim=-1)
        want = ref[torch.arange(len(PROMPT) - 1, len(PROMPT) - 1 + len(c)), torch.tensor(c)]
        torch.testing.assert_close(lp.detach(), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen2"])
def test_learner_forward_through_a_peft_lora_wrapper_equals_peft(family):
    peft = pytest.importorskip("peft")
    model = _tiny(family)
    layout = layout_for(model)
    torch.manual_seed(1)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=list(layout.names.projection_leaves),
                                                         init_lora_weights=False)).eval()
    parts = DecoderParts.of(wrapped)
    batch = pack(len(PROMPT), [[3, 4, 5]])
    x = run_layers(parts, parts.embed(torch.tensor(batch.row_ids(PROMPT))), batch, 0, len(parts.layers))
    (lp,) = candidate_token_logprobs(parts, x, batch)
    with torch.no_grad():
        ref = torch.log_softmax(wrapped(torch.tensor([PROMPT + [3, 4, 5]])).logits[0].float(), dim=-1)
    rows = torch.arange(len(PROMPT) - 1, len(PROMPT) + 2)
    torch.testing.assert_close(lp.detach(), ref[rows, torch.tensor([3, 4, 5])], atol=ATOL, rtol=0)
    with wrapped.disable_adapter(), torch.no_grad():
        base = torch.log_softmax(wrapped(torch.tensor([PROMPT + [3, 4, 5]])).logits[0].float(), dim=-1)
    assert (base - ref).abs().max() > 1e-3  # the adapters changed the result the learner reproduced


def test_int8_engine_adds_qwen2_biases_in_the_fused_and_per_op_decode():
    model = _tiny("qwen2")
    eng = _engine(model, weight_dtype="int8")
    runner = eng.runner
    if runner.fused is None:
        pytest.skip("the fused C decode is not available on this machine")
    table = list(range(8))
    runner.forward([SeqChunk(PROMPT, 0, table)])
    (fused,) = runner.forward([SeqChunk([9], len(PROMPT), table)])
    runner.use_fused_decode = False
    (per_op,) = runner.forward([SeqChunk([9], len(PROMPT), table)])
    torch.testing.assert_close(fused, per_op, atol=ATOL, rtol=0)
    ref = _hf_logits(model, PROMPT + [9])[-1]
    err = (fused - ref).abs().max().item()
    assert err < 0.03 * ref.abs().max().item()  # int8 weights: close to float32 (measured 1.7 %) ...
    with torch.no_grad():  # ... and only with the biases: without them the logits move far more than that
        for layer in layout_for(model).decoder_layers(model):
            for lin in layout_for(model).attention_projections(layer)[:3]:
                lin.bias.zero_()
    assert (_hf_logits(model, PROMPT + [9])[-1] - ref).abs().max().item() > 10 * err


def test_layout_for_an_unknown_model_type_names_it_and_the_supported_ones():
    cfg = transformers.GPT2Config()
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*'llama', 'qwen2', 'mistral'"):
        layout_for(cfg)
    assert SUPPORTED_MODEL_TYPES == ("llama", "qwen2", "mistral")
    with pytest.raises(ValueError, match="did you mean 'qwen2'"):
        layout_for(type("Cfg", (), {"model_type": "qwen3"})())


def test_mistral_sliding_window_is_refused_by_the_engine():
    cfg = transformers.MistralConfig(**TINY, sliding_window=64)
    assert layout_for(cfg).sliding_window == 64
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="sliding_window=64"):
        _engine(transformers.AutoModelForCausalLM.from_config(cfg))


#: Module names and per-architecture config keys that only echorl_agent/llm/models/ may spell out.
ARCHITECTURE_NAMES = re.compile(
    r"\b(?:q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|input_layernorm|post_attention_layernorm"
    r"|embed_tokens|rotary_emb|self_attn|act_fn|variance_epsilon|apply_rotary_pos_emb|num_key_value_heads"
    r"|rms_norm_eps|rope_theta|rope_scaling|LlamaForCausalLM|Qwen2ForCausalLM|MistralForCausalLM)\b"
    r"|\bmodel\.(?:layers|norm)\b|[\"']lm_head[\"']|\.model\.model\b"
)


def test_no_architecture_name_is_written_outside_the_layouts():
    models = PACKAGE / "llm" / "models"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if models in path.parents:
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if ARCHITECTURE_NAMES.search(line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{no}: {line.strip()}")
    assert not found, "read these through echorl_agent.llm.models.layout_for(config):\n" + "\n".join(found)
