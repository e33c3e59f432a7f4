"""The low-precision prefill of the frozen layers: W8A8 (``EngineConfig.prefill_dtype="int8"``,
echorl_agent.llm.quant.w8a8) and bfloat16 (``"bfloat16"``, echorl_agent.llm.quant.bf16).

Projection-level tests use random and real SmolLM2 activations; engine-level tests score real BabyAI-GoToLocal
prompts with int8 and float32 prefill (the KL between the two candidate distributions), check that a pure decode
step takes the unchanged float path, and that a learner starting from the captured activations reproduces the
low-precision rollout's log-probabilities.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from echorl_agent.llm.engine.config import EngineConfig
from echorl_agent.llm.quant.w8a8 import (
    W8A8Linear,
    _load,
    int8_backend,
    int8_matmul,
    pack_weight,
    quantize_rows,
    smoothing,
)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


# ------------------------------------------------------------------ projection level (no model)
@pytest.mark.parametrize(("m", "k", "n"), [(512, 576, 1536), (5, 576, 960), (33, 1536, 576), (17, 64, 3), (1, 32, 8)])
def test_int8_kernel_equals_torch_int_mm_exactly(m, k, n):
    g = torch.Generator().manual_seed(m + n)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ref = a.long() @ w.long().T
    assert torch.equal(int8_matmul(a, w, use_kernel=False).long(), ref)  # torch._int_mm (padded below 17 rows)
    assert torch.equal(int8_matmul(a, w).long(), ref)  # the faster backend on this CPU
    if _load() is not None:
        assert torch.equal(int8_matmul(a, w, use_kernel=True).long(), ref)  # the C kernel


def test_pack_weight_layout():
    w = torch.arange(3 * 4, dtype=torch.int8).reshape(3, 4)  # 3 outputs, 4 inputs -> one panel of 16 (13 zero rows)
    p = pack_weight(w)
    assert p.shape == (1, 2, 16, 2)  # [panels, K/2, 16 outputs, 2 inputs]
    assert p[0, 1, 2].tolist() == [w[2, 2].item(), w[2, 3].item()]  # output 2, inputs 2 and 3
    assert p[0, :, 3:].abs().sum() == 0  # padding outputs are zero
    with pytest.raises(ValueError, match="K=3"):
        pack_weight(torch.zeros(2, 3, dtype=torch.int8))


@pytest.mark.skipif(_load() is None, reason="no C compiler: the kernel is not built")
@pytest.mark.parametrize("m", [1, 5, 6, 7, 97, 200])
@pytest.mark.parametrize(("k", "n", "bias"), [(576, 960, True), (1536, 576, False), (64, 3, True), (32, 40, False)])
def test_fused_kernel_forward_equals_the_torch_path_bit_for_bit(m, k, n, bias):
    """The kernel fuses quantization, product and scales (w8a8.c's w8a8_linear): the same floats as quantize_rows +
    torch._int_mm + the scales, for row counts around its 6-row tiles and output counts around its 16-wide panels."""
    g = torch.Generator().manual_seed(m * 7 + n)
    w = torch.randn(n, k, generator=g) / 24
    x = torch.randn(m, k, generator=g) * 3
    x[:, 3] *= 40  # an outlier channel, as SmolLM2's
    x[0] = 0.0  # an all-zero row: scale 0, exactly the bias
    lin = W8A8Linear([w], [torch.randn(n, generator=g)] if bias else None, act_max=x.abs().amax(0))
    y = lin(x, use_kernel=True)
    assert torch.equal(y, lin(x, use_kernel=False))
    assert torch.equal(y[0], lin.bias if bias else torch.zeros(n))
    torch.set_num_threads(2)
    try:  # outputs split between threads: the same floats
        assert torch.equal(lin(x.repeat(30, 1), use_kernel=True)[:m], y)
    finally:
        torch.set_num_threads(1)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    assert torch.equal(int8_matmul(a, lin.w_q, True, packed=lin.w_packed), int8_matmul(a, lin.w_q, False))
    assert lin(x[:0], use_kernel=True).shape == (0, n)  # no rows: an empty result, not an error


def test_int8_backend_is_chosen_once_and_named():
    assert int8_backend() in ("kernel", "int_mm")
    assert int8_backend() == int8_backend()  # timed once per process, then kept
    if _load() is None:
        assert int8_backend() == "int_mm"


def test_w8a8_linear_error_on_random_inputs_and_below_17_rows():
    torch.manual_seed(0)
    w, b = torch.randn(960, 576) / 24, torch.randn(960)
    x = torch.randn(40, 576)
    lin = W8A8Linear([w[:576], w[576:]], [b[:576], None], act_max=x.abs().amax(0))
    ref = torch.cat([x @ w[:576].T + b[:576], x @ w[576:].T], dim=-1)
    y = lin(x)
    assert y.shape == (40, 960) and lin.splits == [576, 384]
    assert rel_err(y, ref) < 0.01  # measured 0.0061 (two 8-bit roundings)
    torch.testing.assert_close(lin(x[:3]), y[:3], atol=0, rtol=0)  # rows are independent, at any row count
    torch.testing.assert_close(lin(x, use_kernel=False), y, atol=0, rtol=0)  # torch._int_mm == the chosen backend
    # the dequantized weight is what the module multiplies (up to the activation rounding)
    assert rel_err(lin.dequantized_weight(), w) < 0.01


def test_smoothing_edge_cases():
    w = torch.tensor([[1.0, 0.0, 2.0, 4.0], [-3.0, 0.0, 1.0, 0.5]])
    torch.testing.assert_close(smoothing(None, w), torch.ones(4))
    s = smoothing(torch.tensor([4.0, 9.0, 0.0, float("inf")]), w, alpha=0.5)
    # channel 0: sqrt(4) / sqrt(3); channel 1: zero weight column -> 1; channel 2: never active -> 1; inf -> 1
    torch.testing.assert_close(s, torch.tensor([2.0 / 3.0**0.5, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="alpha"):
        smoothing(torch.ones(4), w, alpha=1.5)
    with pytest.raises(ValueError, match="act_max"):
        smoothing(torch.ones(3), w)
    # an all-zero input row gives exactly the bias; all-zero calibration maxima are plain per-token W8A8
    lin = W8A8Linear([w], [torch.tensor([0.5, -1.0])], act_max=torch.zeros(4))
    torch.testing.assert_close(lin.inv_s, torch.ones(4))
    torch.testing.assert_close(lin(torch.zeros(2, 4)), torch.tensor([[0.5, -1.0], [0.5, -1.0]]), atol=0, rtol=0)
    q, scale = quantize_rows(torch.tensor([[0.0, 0.0], [1.0, -0.5]]))
    assert q.tolist() == [[0, 0], [127, -64]] and scale[0].item() == 0.0


# ------------------------------------------------------------------ real model
@pytest.fixture(scope="module")
def llm():
    torch.set_num_threads(1)
    from echorl_agent.llm import load_model

    try:
        return load_model()
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))


def test_bad_prefill_dtype_names_the_field():
    with pytest.raises(ValueError, match="prefill_dtype='int4'"):
        EngineConfig(prefill_dtype="int4")
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    with pytest.raises(ValueError, match="engine_prefill_dtype='bf16'"):
        LLMPolicyConfig(engine_prefill_dtype="bf16")


def test_smoothing_cuts_the_error_on_real_activations(llm):
    """down_proj of layer 3 on a real prompt: the MLP input with SmolLM2's outlier channels."""
    from echorl_agent.llm.engine.calibration import activation_maxima, calibration_token_ids

    ids = calibration_token_ids(llm)
    maxima = activation_maxima(llm.model, [3], ids[:4])[3]
    seen = {}
    down = llm.model.model.layers[3].mlp.down_proj
    hook = down.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0][0].detach().clone()))
    with torch.no_grad():
        llm.model(torch.tensor([ids[5]]))
    hook.remove()
    x = seen["x"]  # [T, 1536], a prompt calibration did not see
    ref = x @ down.weight.T
    plain = rel_err(W8A8Linear([down.weight], act_max=None)(x), ref)
    smooth = rel_err(W8A8Linear([down.weight], act_max=maxima.down)(x), ref)
    assert smooth < 0.05 and smooth < plain  # measured 0.0291 smoothed vs 0.0301 plain (deterministic)


def gotolocal_states(llm, seeds=(0, 1), per_episode=3):
    """(prompt ids, candidate ids) of real GoToLocal states (history 2, random actions), as the probe walks them."""
    import echorl_envs
    from echorl_agent.llm_rl.prompt import candidate_ids, render_prompt
    from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs

    env = LLMObservationWrapper(echorl_envs.make("EchoRL/BabyAI-GoToLocal-v0"), history=2)
    rng = np.random.default_rng(0)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        for _ in range(per_episode):
            state = decode_llm_obs(obs)
            if not state["admissible"]:
                break
            out.append((render_prompt(llm, state, "You are an agent.")[0], candidate_ids(llm, state["admissible"])))
            obs, _, term, trunc, _ = env.step(int(rng.integers(len(state["admissible"]))))
            if term or trunc:
                break
    return out


def action_distribution(engine, prompt, cands) -> torch.Tensor:
    r = engine.score(prompt, cands)
    means = torch.tensor([lp / n for lp, n in zip(r.logprobs, r.token_counts, strict=True)], dtype=torch.float64)
    return torch.log_softmax(means, 0)


def kl_to_float32(llm, f32, low) -> tuple[list[float], int, list]:
    """KL(float32 || low-precision engine) over the candidates of real GoToLocal states, how many argmaxes agree,
    and the states; asserts the low-precision path really ran (no distribution equals float32's) on >= 4 states."""
    kls, agree = [], 0
    states = gotolocal_states(llm)
    for prompt, cands in states:
        p, q = action_distribution(f32, prompt, cands), action_distribution(low, prompt, cands)
        kls.append(float((p.exp() * (p - q)).sum()))
        agree += int(p.argmax() == q.argmax())
        assert not torch.equal(p, q)
    assert len(states) >= 4
    return kls, agree, states


@pytest.mark.slow  # ~10-20 s of real GoToLocal scoring: an opt-in path
def test_int8_prefill_scoring_stays_close_to_float32_on_gotolocal(llm):
    from echorl_agent.llm import LLMEngine

    f32 = LLMEngine(llm, EngineConfig())
    i8 = LLMEngine(llm, EngineConfig(prefill_dtype="int8", float32_top_layers=2))
    assert sorted(i8.runner.w8a8) == list(range(28)) and not f32.runner.w8a8
    kls, agree, states = kl_to_float32(llm, f32, i8)
    assert np.mean(kls) < 0.01 and max(kls) < 0.05, kls
    assert agree >= len(states) - 1


def test_pure_decode_step_takes_the_float_path_and_refresh_repacks(llm):
    """After an int8 prefill, a decode step of the int8 runner gives bit-for-bit the logits of a float32 runner
    holding the same KV; a changed frozen weight re-packs its layer's W8A8 copy."""
    from echorl_agent.llm.engine.calibration import calibration_token_ids
    from echorl_agent.llm.engine.runner import ModelRunner, SeqChunk

    i8 = ModelRunner(llm.model, 8, 16, prefill_dtype="int8", float32_top_layers=2)
    i8.calibrate_prefill(calibration_token_ids(llm)[:3])
    f32 = ModelRunner(llm.model, 8, 16)
    prompt = calibration_token_ids(llm)[4][:40]
    table = [0, 1, 2, 3]
    lg_prefill = i8.forward([SeqChunk(prompt, 0, table)])[0]
    f32.k_pool.copy_(i8.k_pool)
    f32.v_pool.copy_(i8.v_pool)
    tok = int(lg_prefill.argmax())
    a = i8.forward([SeqChunk([tok], len(prompt), table)])[0]
    b = f32.forward([SeqChunk([tok], len(prompt), table)])[0]
    assert torch.equal(a, b)
    # refresh_weights: layer 0's up_proj changes -> layer 0 re-packed (its 7 projections listed), nothing else
    up = llm.model.model.layers[0].mlp.up_proj.weight
    old, before = up.detach().clone(), i8.w8a8[1]
    try:
        with torch.no_grad():
            up.mul_(2.0)
        names = i8.refresh_weights(["model.layers.0.mlp.up_proj.weight", "model.layers.29.mlp.up_proj.weight"])  # 29: float32 top layer
        assert names == [f"model.layers.0.{p}" for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                         "mlp.down_proj")]
        assert i8.w8a8[1] is before
        deq = i8.w8a8[0].gate_up.dequantized_weight()[i8.w8a8[0].gate_up.splits[0]:]
        assert rel_err(deq, up.detach()) < 0.01
    finally:
        with torch.no_grad():
            up.copy_(old)
        i8.refresh_weights(["model.layers.0.mlp.up_proj.weight"])
    assert f32.refresh_weights(None) == []  # float32 prefill: nothing packed


def test_bf16_linear_is_the_product_of_bfloat16_rounded_inputs():
    from echorl_agent.llm.quant.bf16 import BF16Linear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 64, generator=g)
    w1, w2, b2 = torch.randn(32, 64, generator=g), torch.randn(16, 64, generator=g), torch.randn(16, generator=g)
    lin = BF16Linear([w1, w2], [None, b2])
    assert lin.splits == [32, 16] and lin.weight.dtype == torch.bfloat16
    y = lin(x)
    r = lambda t: t.bfloat16().double()  # noqa: E731
    # the products of rounded inputs, accumulated in float32, the sum rounded to bfloat16 (a CPU GEMM's bfloat16
    # output), then the float32 bias: within one bfloat16 rounding step (2^-8 relative) of the exact value
    want = torch.cat([r(x) @ r(w1).T, r(x) @ r(w2).T], dim=1)
    assert y.dtype == torch.float32
    bias = torch.cat([torch.zeros(32), b2])
    torch.testing.assert_close((y - bias).double(), want, atol=1e-4, rtol=2 ** -8)
    assert float((y.double() - torch.cat([x @ w1.T, x @ w2.T + b2], 1).double()).abs().max()) > 1e-3  # rounded


def test_bfloat16_prefill_refreshes_its_copies_and_warns_without_native_bf16(llm, monkeypatch):
    from echorl_agent.llm.engine import runner as runner_mod
    from echorl_agent.llm.engine.calibration import calibration_token_ids
    from echorl_agent.llm.engine.runner import ModelRunner, SeqChunk
    from echorl_agent.llm.quant.bf16 import BF16Linear

    bf = ModelRunner(llm.model, 8, 16, prefill_dtype="bfloat16", float32_top_layers=2)
    assert sorted(bf.w8a8) == list(range(28)) and isinstance(bf.w8a8[0].qkv, BF16Linear)
    f32 = ModelRunner(llm.model, 8, 16)
    prompt = calibration_token_ids(llm)[4][:40]
    a = bf.forward([SeqChunk(prompt, 0, [0, 1, 2, 3])])[0]
    b = f32.forward([SeqChunk(prompt, 0, [0, 1, 2, 3])])[0]
    assert not torch.equal(a, b) and int(a.argmax()) == int(b.argmax())  # bfloat16 ran, same next token
    up = llm.model.model.layers[0].mlp.up_proj.weight
    old = up.detach().clone()
    try:
        with torch.no_grad():
            up.mul_(2.0)
        names = bf.refresh_weights(["model.layers.0.mlp.up_proj.weight"])
        assert "model.layers.0.mlp.up_proj" in names and len(names) == 7
        assert torch.equal(bf.w8a8[0].gate_up.weight[bf.w8a8[0].gate_up.splits[0]:], up.detach().bfloat16())
    finally:
        with torch.no_grad():
            up.copy_(old)
        bf.refresh_weights(["model.layers.0.mlp.up_proj.weight"])
    monkeypatch.setattr(runner_mod, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="without AMX or AVX-512 BF16"):
        ModelRunner(llm.model, 8, 16, prefill_dtype="bfloat16", float32_top_layers=2)


@pytest.mark.slow  # ~10-20 s of real GoToLocal scoring: an opt-in path
def test_bfloat16_prefill_scoring_stays_close_to_float32_on_gotolocal(llm):
    from echorl_agent.llm import LLMEngine

    f32 = LLMEngine(llm, EngineConfig())
    bf = LLMEngine(llm, EngineConfig(prefill_dtype="bfloat16", float32_top_layers=2))
    kls, agree, states = kl_to_float32(llm, f32, bf)
    assert np.mean(kls) < 0.002 and max(kls) < 0.01, kls  # 0.00032 mean, 0.00089 max (bfloat16 attention too)
    assert agree >= len(states) - 1  # a near-tie may flip (13/14 on 14 states)


@pytest.mark.slow  # ~10-20 s of real GoToLocal scoring: an opt-in path
@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_learner_from_captured_low_precision_activations_matches_the_rollout(dtype):
    """With int8 or bfloat16 prefill the learner starts from the activations those frozen layers captured: its
    log-probs equal the rollout's (as the float32 capture test in test_llm_rl asserts)."""
    import gymnasium as gym
    from stable_baselines3.common.utils import ConstantSchedule

    pytest.importorskip("peft")
    import echorl_envs  # noqa: F401
    from echorl_agent.llm_rl.config import LLMPolicyConfig
    from echorl_agent.llm_rl.lm import TrainableLM
    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_envs.wrappers.llm import LLMObservationWrapper

    torch.set_num_threads(1)
    try:
        lm = TrainableLM(LLMPolicyConfig(lora_rank=4, train_layers=2, max_kv_tokens=4096,
                                         engine_prefill_dtype=dtype))
    except ValueError as e:
        pytest.skip(str(e))
    assert lm.capture and sorted(lm.engine.runner.w8a8) == list(range(lm.boundary)) and lm.boundary == 28
    env = LLMObservationWrapper(gym.make("EchoRL/MiniGrid-Empty-5x5-v0", max_episode_steps=12), history=1,
                                max_actions=8)
    policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lm=lm)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(2)
    rec = policy.record(obs)
    assert rec.context_states is not None
    learner = policy.learner_scores(rec)[0]
    torch.testing.assert_close(learner.double(), rec.rollout_logp.double(), atol=1e-4, rtol=0)
    # recomputing the frozen layers in float32 instead gives the float32 policy, measurably different
    rec2 = type(rec)(**{**rec.__dict__, "context_states": None, "cand_states": None})
    assert float((policy.learner_scores(rec2)[0].detach() - learner.detach()).abs().max()) > 1e-4
