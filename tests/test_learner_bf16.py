"""bfloat16 products for the learner's frozen weights (``LLMPolicyConfig.learner_matmul_dtype="bfloat16"``)."""

from __future__ import annotations

from unittest.mock import patch

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from echorl_agent.llm_rl.learner_bf16 import BF16ProductLinear, bf16_frozen_linears


def test_frozen_linears_multiply_in_bfloat16_and_keep_their_float32_parameter():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16, bias=False))
    net[0].requires_grad_(False)
    w0 = net[0].weight.detach().clone()
    keys = list(net.state_dict())
    assert bf16_frozen_linears([net, net]) == 1  # the trainable one stays, a module seen twice converts once
    assert type(net[0]) is BF16ProductLinear and type(net[1]) is torch.nn.Linear
    assert list(net.state_dict()) == keys and net[0].weight.dtype == torch.float32
    assert torch.equal(net[0].weight, w0)
    x = torch.randn(5, 64, requires_grad=True)
    y = net[0](x)
    ref = F.linear(x.detach().bfloat16(), w0.bfloat16()).float() + net[0].bias
    assert y.dtype == torch.float32 and torch.equal(y.detach(), ref)
    assert not torch.equal(y.detach(), F.linear(x.detach(), w0, net[0].bias))  # the product really is rounded
    gy = torch.randn(5, 32)
    (gx,) = torch.autograd.grad(y, x, gy)
    assert torch.equal(gx, (gy.bfloat16() @ w0.bfloat16()).float())  # the input gradient is a bfloat16 product too
    assert bf16_frozen_linears([net]) == 0
    half = torch.nn.Linear(8, 8).bfloat16().requires_grad_(False)  # already bfloat16 (the CUDA learner): unchanged
    assert bf16_frozen_linears([half]) == 0 and type(half) is torch.nn.Linear


def test_bad_learner_matmul_dtype_names_the_field():
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    with pytest.raises(ValueError, match="learner_matmul_dtype.*'float16'"):
        LLMPolicyConfig(learner_matmul_dtype="float16")


@pytest.fixture(scope="module")
def learners():
    pytest.importorskip("peft")
    torch.set_num_threads(1)
    from echorl_agent.llm_rl import lm as lm_mod
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    cfg = dict(lora_rank=4, train_layers=2, max_kv_tokens=2048)
    try:
        lm32 = lm_mod.TrainableLM(LLMPolicyConfig(**cfg))
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))
    with (patch.object(lm_mod, "cpu_has_native_bf16", lambda: False),
          pytest.warns(UserWarning, match="learner_matmul_dtype='bfloat16' on a CPU without")):
        lm16 = lm_mod.TrainableLM(LLMPolicyConfig(**cfg, learner_matmul_dtype="bfloat16"))
    torch.manual_seed(0)
    with torch.no_grad():  # non-zero adapters (peft starts B at 0), the same in both
        for p in lm32.trainable_parameters():
            p.normal_(0.0, 0.02)
    lm16.load_trainable_state(lm32.trainable_state())
    return lm32, lm16


def test_only_the_frozen_products_of_the_trained_layers_and_the_head_change(learners):
    lm32, lm16 = learners
    parts = lm16.parts
    for i, layer in enumerate(parts.layers):
        linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        frozen = [m for m in linears if not m.weight.requires_grad]
        trained = [m for m in linears if m.weight.requires_grad]
        assert len(frozen) == 7
        want = BF16ProductLinear if i >= lm16.boundary else torch.nn.Linear
        assert all(type(m) is want for m in frozen), i
        assert all(type(m) is torch.nn.Linear for m in trained)  # LoRA A and B stay float32
        assert len(trained) == (14 if i >= lm16.boundary else 0)
    assert type(parts.lm_head) is BF16ProductLinear and type(lm32.parts.lm_head) is torch.nn.Linear
    # the exact weights still reach the engine and the adapter files
    m32, m16 = lm32.merged_state(), lm16.merged_state()
    assert m32.keys() == m16.keys() and all(torch.equal(m32[k], m16[k]) for k in m32)
    assert lm16.model.state_dict().keys() == lm32.model.state_dict().keys()


def test_bfloat16_learner_stays_near_the_float32_policy_and_gradient(learners):
    """On real MiniGrid states the bfloat16 learner's policy over the admissible actions differs from float32 by a
    small KL (but does differ: the products really run in bfloat16), and its adapter gradient points the same way."""
    from stable_baselines3.common.utils import ConstantSchedule

    import echorl_envs  # noqa: F401
    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_envs.wrappers.llm import LLMObservationWrapper

    lm32, lm16 = learners
    env = LLMObservationWrapper(gym.make("EchoRL/MiniGrid-Empty-5x5-v0", max_episode_steps=12), history=1,
                                max_actions=8)
    pols = [LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lm=lm) for lm in learners]
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=3)
    recs = []
    for _ in range(6):
        recs.append(pols[0].record(obs))
        obs, _, term, trunc, _ = env.step(int(rng.integers(len(recs[-1].cands))))
        if term or trunc:
            obs, _ = env.reset(seed=4)
    out = []
    for pol, lm in zip(pols, learners, strict=True):
        lm.model.zero_grad()
        logps, values, _ = pol.learner_scores_many(recs)
        loss = sum(lp[0] - 0.5 * lp[-1] for lp in logps)
        grads = torch.autograd.grad(loss, lm.trainable_parameters())
        out.append(([lp.detach().double() for lp in logps], torch.cat([g.flatten() for g in grads])))
    (lp32, g32), (lp16, g16) = out
    kl = [float((a.exp() * (a - b)).sum()) for a, b in zip(lp32, lp16, strict=True)]
    diff = max(float((a - b).abs().max()) for a, b in zip(lp32, lp16, strict=True))
    assert 0 < diff and max(kl) < 0.01, (diff, kl)
    assert float(F.cosine_similarity(g32, g16, dim=0)) > 0.995
