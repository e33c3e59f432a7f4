"""bfloat16 products for the learner's frozen matmuls (``LLMPolicyConfig.learner_matmul_dtype="bfloat16"``).

With LoRA on the top k layers, almost all of the learner's time is dense products with *frozen* weights: the base
projections of the trained layers (forward, and the input gradient in the backward) and the LM head. On a CPU that
multiplies bfloat16 natively (AVX-512 BF16 or AMX) those products run several times faster in bfloat16 than in
float32 (``[200, 576] x [576, 1536]`` on a 2-core AMD EPYC with AVX-512 BF16: 0.88 ms vs 3.49 ms, 1 thread;
docs/results/loop-speed.md); on an AVX2-only CPU they are emulated and slower (:func:`~echorl_agent.llm.quant.bf16.cpu_has_native_bf16` says which).

:func:`bf16_frozen_linears` makes each frozen ``nn.Linear`` of the given modules multiply a bfloat16 copy of its
weight by its input rounded to bfloat16 (float32 accumulation; the result is widened back, as
:class:`~echorl_agent.llm.quant.bf16.BF16Linear` does in the engine's prefill). The float32 weight stays the module's
parameter, so state dicts, peft's merge (:meth:`TrainableLM.merged_state`), adapters and the rollout engine see the
exact weights. Trainable linears (LoRA's A and B, fully trained layers) are left in float32, and so are norms,
attention and the residual stream. The learner's log-probabilities then differ slightly from float32 ones; the
learner computes pi_old with the same products, so PPO ratios start at 1, and the truncated IS weight
``min(pi_old / pi_rollout, C)`` corrects the rollout/learner difference as it does for int8 prefill.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

__all__ = ["LEARNER_MATMUL_DTYPES", "BF16ProductLinear", "bf16_frozen_linears"]

LEARNER_MATMUL_DTYPES = ("float32", "bfloat16")


class BF16ProductLinear(torch.nn.Linear):
    """A frozen ``nn.Linear`` whose product runs in bfloat16: ``(x.bf16() @ W.bf16().T).to(x.dtype) + b``.

    Made from an existing ``nn.Linear`` in place by :func:`bf16_frozen_linears` (its class changes; ``weight`` stays
    the same float32 parameter, the bfloat16 copy is a non-persistent buffer ``weight_bf16``). Its weight must not
    change afterwards: the copy is taken once.
    """

    weight_bf16: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight_bf16).to(x.dtype)
        return y if self.bias is None else y + self.bias


def bf16_frozen_linears(modules: Iterable[torch.nn.Module]) -> int:
    """Turn every frozen float32 ``nn.Linear`` inside ``modules`` (weight without ``requires_grad``) into a
    :class:`BF16ProductLinear`; returns how many changed. Linears already converted, trainable, or already in
    bfloat16 (the CUDA learner loads the model in bfloat16) are left alone."""
    n = 0
    seen: set[int] = set()
    for root in modules:
        for mod in root.modules():
            if (type(mod) is not torch.nn.Linear or mod.weight.requires_grad or mod.weight.dtype != torch.float32
                    or id(mod) in seen):
                continue
            seen.add(id(mod))
            mod.__class__ = BF16ProductLinear
            mod.register_buffer("weight_bf16", mod.weight.detach().to(torch.bfloat16).contiguous(), persistent=False)
            n += 1
    return n
