"""The engine's int8 prefill (``EngineConfig.prefill_dtype="int8"``) vs float32 on real BabyAI-GoToLocal scoring.

Two engines over one SmolLM2-135M-Instruct (float32 prefill, and W8A8 prefill of every layer below the top
``--trained``, calibrated on the engine's built-in set) score the admissible actions of the same real GoToLocal
states (history 2, random actions, as ``benchmarks/int8_prefill_probe.py`` walks them). Timing alternates float32
and int8 per state and repeat in one process; each score runs on an empty prefix cache (``reset_prefix_cache``),
so every prompt token is prefilled. Reports prefill tokens/s of each, their ratio, and over the candidate
distribution (length-normalised scores, softmax over candidates, as the probe) KL(float32 || int8) mean / max
and argmax agreement. A microbenchmark of one [512, 576] x [576, 1536] product is printed first.

Run: ``python benchmarks/engine_prefill_int8.py --seeds 4 --repeats 3 --threads 1``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def gemm_microbenchmark(reps: int = 20) -> None:
    from echorl_agent.llm.quant.w8a8 import W8A8Linear, _load, int8_backend, int8_matmul

    x, w = torch.randn(512, 576), torch.randn(1536, 576)
    lin = W8A8Linear([w])
    xq = torch.randint(-127, 128, (512, 576), dtype=torch.int8)
    fs = {"float32 F.linear": lambda: torch.nn.functional.linear(x, w),
          "int8 product (torch._int_mm)": lambda: int8_matmul(xq, lin.w_q, use_kernel=False),
          **({"int8 product (w8a8.c)": lambda: int8_matmul(xq, lin.w_q, True, lin.w_packed)} if _load() else {}),
          "W8A8Linear (quantize + product + scales)": lambda: lin(x)}
    tot = dict.fromkeys(fs, 0.0)
    for f in fs.values():
        f()
    for _ in range(reps):  # alternating
        for k, f in fs.items():
            t = time.perf_counter()
            f()
            tot[k] += time.perf_counter() - t
    for k, v in tot.items():
        print(f"{k}: {v / reps * 1e3:.2f} ms for [512, 576] x [576, 1536]")
    print(f"the engine's int8 backend on this CPU: {int8_backend()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4, help="episodes (env seeds 0..N-1), up to 4 states each")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the states (alternating engines)")
    ap.add_argument("--trained", type=int, default=2, help="top layers kept float32 (EngineConfig.float32_top_layers)")
    ap.add_argument("--threads", type=int, choices=(1, 2), default=1)
    ap.add_argument("--bf16", action="store_true", help="a third engine with bfloat16 prefill, alternating with the two")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gemm_microbenchmark()

    import echorl_envs
    from echorl_agent.llm import EngineConfig, LLMEngine, load_model
    from echorl_agent.llm_rl.prompt import candidate_ids, render_prompt
    from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs

    llm = load_model()
    env = LLMObservationWrapper(echorl_envs.make("EchoRL/BabyAI-GoToLocal-v0"), history=2)
    rng = np.random.default_rng(0)
    states = []
    for seed in range(args.seeds):
        obs, _ = env.reset(seed=seed)
        for _ in range(4):
            state = decode_llm_obs(obs)
            if not state["admissible"]:
                break
            states.append((render_prompt(llm, state, "You are an agent.")[0], candidate_ids(llm, state["admissible"])))
            obs, _, term, trunc, _ = env.step(int(rng.integers(len(state["admissible"]))))
            if term or trunc:
                break
    t = time.perf_counter()
    engines = {"float32": LLMEngine(llm, EngineConfig()),
               "int8": LLMEngine(llm, EngineConfig(prefill_dtype="int8", float32_top_layers=args.trained))}
    if args.bf16:
        engines["bfloat16"] = LLMEngine(llm, EngineConfig(prefill_dtype="bfloat16", float32_top_layers=args.trained))
    print(f"engines built in {time.perf_counter() - t:.1f} s (int8: calibration + packing included)")

    def dist(engine, prompt, cands):
        engine.reset_prefix_cache()
        r = engine.score(prompt, cands)
        means = torch.tensor([lp / n for lp, n in zip(r.logprobs, r.token_counts, strict=True)], dtype=torch.float64)
        return torch.log_softmax(means, 0)

    for e in engines.values():  # warm-up
        dist(e, *states[0])
    times = dict.fromkeys(engines, 0.0)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in engines}
    for rep in range(args.repeats):
        for prompt, cands in states:
            for name, e in engines.items():
                t = time.perf_counter()
                d = dist(e, prompt, cands)
                times[name] += time.perf_counter() - t
                if rep == 0:
                    out[name].append(d)
    tokens = args.repeats * sum(len(p) + sum(len(c) for c in cs) for p, cs in states)
    print(f"{len(states)} GoToLocal states (history 2), {tokens // args.repeats} prefilled tokens per pass, "
          f"{args.repeats} alternating passes, {args.threads} thread(s), top {args.trained} layers float32")
    for name, v in times.items():
        print(f"{name}: {v:.2f} s, {tokens / v:.0f} prefill tok/s")
    for name in [n for n in engines if n != "float32"]:
        kls = [float((p.exp() * (p - q)).sum()) for p, q in zip(out["float32"], out[name], strict=True)]
        agree = sum(int(p.argmax() == q.argmax()) for p, q in zip(out["float32"], out[name], strict=True))
        print(f"{name} / float32 speed: {times['float32'] / times[name]:.2f}x; KL(float32 || {name}) over the "
              f"candidates: mean {np.mean(kls):.4f}, max {np.max(kls):.4f}; argmax agreement {agree}/{len(states)}")
    if "bfloat16" in times:
        print(f"int8 / bfloat16 speed: {times['bfloat16'] / times['int8']:.2f}x")


if __name__ == "__main__":
    main()
