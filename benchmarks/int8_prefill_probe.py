"""Would int8 *activations* make scoring prefill faster on this CPU, and what would they do to the policy?

Prefill is compute-bound on a CPU (float32 GEMMs near the core's FMA peak), and the engine's int8/int4 weights only
save memory traffic, so the LLM-RL loop stays prefill-bound (docs/results/loop-speed.md). An int8 x int8
GEMM (``torch._int_mm``) has ~4x float32's arithmetic rate here. This probe measures, on real BabyAI-GoToLocal
states (history 2, random actions, SmolLM2-135M-Instruct), the distribution over the admissible actions
(length-normalised scores, softmax over candidates, as :class:`~echorl_agent.llm_rl.policy.LLMPolicy`) from the
float32 model and from a copy whose frozen layers (all but the top ``--trained`` layers) run their projections as

* ``per-token``: each row's activations rounded to int8 with its own scale, weights int8 per output channel,
  ``torch._int_mm`` (``--skip down_proj`` keeps the MLP's down projection in float32);
* ``fbgemm``: ``torch.ao.quantization.quantize_dynamic`` (one activation scale per call);
* ``smooth``: ``per-token`` after SmoothQuant-style smoothing (Xiao et al. 2023): each projection's input channel
  ``j`` is divided by ``s_j = max|X_j|^alpha / max|W_:j|^(1 - alpha)`` and its weight column multiplied by it
  (exact in float; ``max|X_j|`` from calibration states on other seeds), so outlier channels move into the weights;
* ``bf16``: no int8 at all: activations and weights rounded to bfloat16 and multiplied in bfloat16 (float32
  accumulation inside the GEMM); fast only where the CPU has bfloat16 units (AVX512-BF16 / AMX), slow on AVX2;

and reports KL(float32 || int8) per state, argmax agreement and the wall time of both (HF forward per candidate,
so the ratio is a lower bound of what an engine path would gain). A microbenchmark of one [512, 576] x [576, 1536]
GEMM is printed first.

Run: ``python benchmarks/int8_prefill_probe.py --mode per-token [--skip down_proj] --seeds 3`` (``--mode smooth
--alpha 0.5``, ``--mode bf16``).
"""

from __future__ import annotations

import argparse
import copy
import os
import time
import warnings

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class PerTokenInt8Linear(torch.nn.Module):
    """``x W^T + b`` with x rounded to int8 per row and W to int8 per output channel (``torch._int_mm``)."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        w = lin.weight.detach().float()
        self.w_scale = w.abs().amax(1).clamp_min(1e-8) / 127
        self.w_q = torch.round(w / self.w_scale[:, None]).to(torch.int8).t().contiguous()
        self.bias = lin.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        scale = x2.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
        xq = torch.round(x2 / scale).to(torch.int8)
        n = xq.shape[0]
        if n <= 16:  # _int_mm needs more than 16 rows
            xq = torch.cat([xq, xq.new_zeros(17 - n, xq.shape[1])])
        y = torch._int_mm(xq, self.w_q)[:n].float() * scale * self.w_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], -1)


class SmoothInt8Linear(PerTokenInt8Linear):
    """:class:`PerTokenInt8Linear` of ``x / s`` and ``W * s`` (per input channel ``s``; the product is unchanged)."""

    def __init__(self, lin: torch.nn.Linear, act_max: torch.Tensor, alpha: float) -> None:
        w = lin.weight.detach().float()
        s = (act_max.clamp_min(1e-5) ** alpha / w.abs().amax(0).clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5)
        smoothed = torch.nn.Linear(w.shape[1], w.shape[0], bias=lin.bias is not None)
        smoothed.weight.data = w * s
        if lin.bias is not None:
            smoothed.bias.data = lin.bias.detach().float()
        super().__init__(smoothed)
        self.inv_s = 1.0 / s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.inv_s)


@torch.no_grad()
def calibrate(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per input channel, the largest |activation| entering every projection over ``prompts``."""
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in PROJ:
            def hook(m, inp, out, name=name):
                a = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0).float()
                amax[name] = torch.maximum(amax[name], a) if name in amax else a
            hooks.append(mod.register_forward_hook(hook))
    for ids in prompts:
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return amax


def gemm_microbenchmark() -> None:
    a8 = torch.randint(-127, 127, (512, 576), dtype=torch.int8)
    b8 = torch.randint(-127, 127, (576, 1536), dtype=torch.int8)
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    a16, b16 = a.bfloat16(), b.bfloat16()
    for name, f in (("float32 matmul", lambda: a @ b), ("torch._int_mm int8", lambda: torch._int_mm(a8, b8)),
                    ("bfloat16 matmul", lambda: a16 @ b16)):
        f()
        t = time.perf_counter()
        for _ in range(20):
            f()
        print(f"{name}: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms for [512, 576] x [576, 1536]")


def quantized_copy(model: torch.nn.Module, mode: str, trained: int, skip: set[str],
                   act_max: dict[str, torch.Tensor] | None = None, alpha: float = 0.5) -> torch.nn.Module:
    from echorl_agent.llm.quant.bf16 import pack_bf16

    q = copy.deepcopy(model)
    layers = q.model.layers
    for i in range(len(layers) - trained):
        if mode == "fbgemm":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                layers[i] = torch.ao.quantization.quantize_dynamic(layers[i], {torch.nn.Linear}, dtype=torch.qint8)
            continue
        for part in (layers[i].self_attn, layers[i].mlp):
            for name in PROJ:
                if hasattr(part, name) and name not in skip:
                    lin = getattr(part, name)
                    if mode == "bf16":
                        setattr(part, name, pack_bf16([lin]))  # the engine's bfloat16 prefill projection
                    elif mode == "smooth":
                        key = f"model.layers.{i}.{'self_attn' if part is layers[i].self_attn else 'mlp'}.{name}"
                        setattr(part, name, SmoothInt8Linear(lin, act_max[key], alpha))
                    else:
                        setattr(part, name, PerTokenInt8Linear(lin))
    return q


@torch.no_grad()
def action_logprobs(model, ids: list[int], cands: list[list[int]]) -> torch.Tensor:
    rows = []
    for c in cands:
        lp = torch.log_softmax(model(torch.tensor([ids + c])).logits[0].float(), -1)
        rows.append(float(sum(lp[len(ids) - 1 + j, tok] for j, tok in enumerate(c))) / len(c))
    return torch.log_softmax(torch.tensor(rows), 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("per-token", "fbgemm", "smooth", "bf16"), default="per-token")
    ap.add_argument("--alpha", type=float, default=0.5, help="smoothing strength of --mode smooth")
    ap.add_argument("--calibration-seeds", type=int, default=4,
                    help="--mode smooth: episodes (env seeds 1000..) whose states set max|X|")
    ap.add_argument("--skip", nargs="*", default=[], choices=PROJ, help="projections kept in float32")
    ap.add_argument("--trained", type=int, default=2, help="top layers kept in float32 (the LoRA layers)")
    ap.add_argument("--seeds", type=int, default=3, help="episodes (env seeds 0..N-1), up to 4 states each")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    gemm_microbenchmark()

    import echorl_envs
    from echorl_agent.llm import load_model
    from echorl_agent.llm_rl.prompt import candidate_ids, render_prompt
    from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs

    llm = load_model()
    ref = llm.model.eval()
    env = LLMObservationWrapper(echorl_envs.make("EchoRL/BabyAI-GoToLocal-v0"), history=2)

    def walk(seeds, rng):
        """(prompt ids, candidate ids) of up to 4 states per episode, random actions in between."""
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            for _ in range(4):
                state = decode_llm_obs(obs)
                if not state["admissible"]:
                    break
                yield render_prompt(llm, state, "You are an agent.")[0], candidate_ids(llm, state["admissible"])
                obs, _, term, trunc, _ = env.step(int(rng.integers(len(state["admissible"]))))
                if term or trunc:
                    break

    act_max = None
    if args.mode == "smooth":
        cal = range(1000, 1000 + args.calibration_seeds)
        act_max = calibrate(ref, [ids + cands[0] for ids, cands in walk(cal, np.random.default_rng(1))])
    quant = quantized_copy(ref, args.mode, args.trained, set(args.skip), act_max, args.alpha)
    kls, agree, times = [], 0, [0.0, 0.0]
    for ids, cands in walk(range(args.seeds), np.random.default_rng(0)):
        out = []
        for k, model in enumerate((ref, quant)):
            t = time.perf_counter()
            out.append(action_logprobs(model, ids, cands))
            times[k] += time.perf_counter() - t
        p, q = out
        kls.append(float((p.exp() * (p - q)).sum()))
        agree += int(p.argmax() == q.argmax())
    print(f"mode {args.mode}{f' alpha {args.alpha}' if args.mode == 'smooth' else ''}, float32 kept: {args.skip or 'none'} + top {args.trained} layers; {len(kls)} states")
    print(f"KL(float32 || {'bf16' if args.mode == 'bf16' else 'int8'}) over the admissible actions: mean {np.mean(kls):.4f}, max {np.max(kls):.4f}; "
          f"argmax agreement {agree}/{len(kls)}; time float32 {times[0]:.1f} s, quantized {times[1]:.1f} s "
          f"({times[0] / times[1]:.2f}x)")


if __name__ == "__main__":
    main()
