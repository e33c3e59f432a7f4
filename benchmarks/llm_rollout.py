"""LLM rollout benchmarks on the real SmolLM2-135M-Instruct (issue 7), ours and the baseline in one run.

1. Multi-turn ReAct rollouts: ``--actors`` actors (one env each, one thread each, one shared engine), ``--turns``
   turns each, prefix cache off vs on: wall time and prefilled prompt tokens (off / on), the measured reuse rate
   rho = cached / prompt tokens (EchoRL Eq. 15), and the bound gamma(rho) = 1 / (1 - rho + rho / T) for T -> inf
   (reused tokens free) -- the most prefill work the cache can save at that rho.
2. Scoring N admissible actions: N full forwards of prompt + action (naive) vs one prompt prefill shared by N short
   suffixes in one batched forward (each candidate's last token is never run, so P + N (S - 1) tokens); the goal
   is >= 0.7 x N (P + S) / (P + N S).
3. Batched decode: tokens/s of the engine decoding ``--decode-actors`` sequences together vs sequential HF
   ``generate`` (greedy, same prompts, same number of new tokens).

Run: ``python benchmarks/llm_rollout.py`` (``--parts 1,2,3``; ``--env EchoRL/BabyAI-GoToLocal-v0`` to switch env).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401  (registers the envs)
from echorl_agent.agents import ReActAgent, ScoringAgent  # noqa: E402
from echorl_agent.llm import (  # noqa: E402
    EngineConfig,
    LLMEngine,
    PrefixCacheConfig,
    SamplingParams,
    load_model,
    speedup_bound,
)


def _engine(llm, cache: bool, max_tokens: int = 16384, max_num_seqs: int = 16) -> LLMEngine:
    pc = PrefixCacheConfig(block_size=16, max_tokens=max_tokens, enable_prefix_caching=cache)
    return LLMEngine(llm, EngineConfig(prefix_cache=pc, max_num_seqs=max_num_seqs))


# ------------------------------------------------------------------------------------------- part 1
#: ALFWorld's engine (textworld's PDDL parser, fast-downward) is not thread-safe across env instances of one
#: process, so env calls are serialised; they are milliseconds next to the LLM calls, which run concurrently.
_ENV_LOCK = threading.Lock()


def _actor(engine: LLMEngine, env_id: str, seed: int, turns: int, max_tokens: int, log: list) -> None:
    with _ENV_LOCK:
        env = gym.make(env_id)
        obs, info = env.reset(seed=seed)
    agent = ReActAgent(engine, max_tokens=max_tokens)
    agent.reset(env_id, obs, info, seed)
    for t in range(turns):
        action = agent.act(obs, info)
        with _ENV_LOCK:
            obs, reward, term, trunc, info = env.step(action)
            if term or trunc:
                obs, info = env.reset(seed=seed + 1000 + t)
        log.append((seed, t, action, agent.last.matched, reward))
        if term or trunc:
            agent.reset(env_id, obs, info, seed + 1000 + t)
        else:
            agent.observe(action, obs, reward, False, info)
    with _ENV_LOCK:
        env.close()


def rollouts(llm, env_id: str, actors: int, turns: int, max_tokens: int, cache: bool) -> dict:
    engine = _engine(llm, cache).start()
    logs: list = []
    t0 = time.perf_counter()
    ths = [threading.Thread(target=_actor, args=(engine, env_id, s, turns, max_tokens, logs)) for s in range(actors)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t0
    engine.stop()
    s = engine.stats
    return {
        "wall": wall,
        "prefill": s.num_computed_tokens,
        "prompt": s.num_computed_tokens + s.num_cached_tokens,
        "rho": s.reuse_rate,
        "requests": s.num_requests,
        "generated": engine.num_generated_tokens,
        "actions": sorted(logs),
    }


def part1(llm, args) -> list[list]:
    off = rollouts(llm, args.env, args.actors, args.turns, args.max_tokens, cache=False)
    on = rollouts(llm, args.env, args.actors, args.turns, args.max_tokens, cache=True)
    same = [a[:3] for a in off["actions"]] == [a[:3] for a in on["actions"]]
    matched = sum(a[3] for a in on["actions"]) / max(len(on["actions"]), 1)
    rho = on["rho"]
    rows = [
        ["1 ReAct rollouts", "wall time [s]", f"{off['wall']:.1f}", f"{on['wall']:.1f}", f"{off['wall'] / on['wall']:.2f}x",
         ">= 3x"],
        ["", "prefilled prompt tokens", off["prefill"], on["prefill"], f"{off['prefill'] / max(on['prefill'], 1):.2f}x",
         ">= 3x"],
        ["", "reuse rate rho (measured)", f"{off['rho']:.3f}", f"{rho:.3f}", "", ">= 0.78"],
        ["", "gamma(rho), T=inf: 1/(1-rho)", "", f"{speedup_bound(rho, float('inf')) if rho < 1 else float('inf'):.2f}x",
         "", "bound on prefill saving"],
        ["", "requests / generated tokens", f"{off['requests']} / {off['generated']}",
         f"{on['requests']} / {on['generated']}", "", ""],
        ["", "same actions off/on; matched", "", f"{same}; {matched:.0%}", "", ""],
    ]
    return rows


# ------------------------------------------------------------------------------------------- part 2
def part2(llm, args) -> list[list]:
    env = gym.make(args.env)
    obs, info = env.reset(seed=0)
    admissible = info["admissible_actions"][: args.score_n]
    probe = ScoringAgent(_engine(llm, True), temperature=1.0)
    probe.reset(args.env, obs, info, 0)
    prompt = probe.tokens
    eos = llm.eos_token_ids[:1]
    cands = [llm.encode(a) + eos for a in admissible]
    n, p = len(cands), len(prompt)
    s = sum(map(len, cands)) / n
    naive_engine, shared_engine = _engine(llm, False), _engine(llm, True)
    naive_engine.score(prompt[:8], cands[:1])  # warm-up
    shared_engine.score(prompt[-8:], cands[:1])
    t0 = time.perf_counter()
    naive = naive_engine.score(prompt, cands, share_prefix=False)
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    shared = shared_engine.score(prompt, cands, share_prefix=True)
    t_shared = time.perf_counter() - t0
    err = max(abs(a - b) for a, b in zip(naive.logprobs, shared.logprobs, strict=True))
    ideal = n * (p + s) / (p + n * s)  # the goal's ratio (the issue's: P + N S tokens when shared)
    tokens = n * (p + s) / (p + n * (s - 1))  # shared runs the prompt once and each candidate but its last token
    env.close()
    return [
        [f"2 scoring N={n} actions", "wall time [s]", f"{t_naive:.2f}", f"{t_shared:.2f}", f"{t_naive / t_shared:.2f}x",
         f">= {0.7 * ideal:.2f}x (0.7 x {ideal:.2f})"],
        ["", f"computed tokens (P={p}, S={s:.1f})", naive.num_computed_tokens, shared.num_computed_tokens,
         f"{naive.num_computed_tokens / shared.num_computed_tokens:.2f}x", f"N(P+S)/(P+N(S-1)) = {tokens:.2f}"],
        ["", "max |loglik naive - shared|", "", f"{err:.2e}", "", ""],
    ]


# ------------------------------------------------------------------------------------------- part 3
def part3(llm, args) -> list[list]:
    topics = ["the sea", "a forest", "a city", "the moon", "a river", "a mountain", "a desert", "the rain",
              "a garden", "a library", "a train", "a bridge"]
    prompts = [llm.chat_ids([{"role": "user", "content": f"Write a short poem about {t}."}])
               for t in topics[: args.decode_actors]]
    k = args.decode_tokens
    model = llm.model
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        hf_out = []
        for p in prompts:
            g = model.generate(torch.tensor([p]), max_new_tokens=k, min_new_tokens=k, do_sample=False)
            hf_out.append(g[0, len(p):].tolist())
        t_hf = time.perf_counter() - t0
    engine = _engine(llm, cache=False)
    engine.generate([prompts[0]], SamplingParams(max_tokens=2))  # warm-up
    t0 = time.perf_counter()
    ours = engine.generate(prompts, SamplingParams(max_tokens=k, ignore_eos=True))
    t_ours = time.perf_counter() - t0
    n_tok = sum(len(r.token_ids) for r in ours)
    agree = sum(r.token_ids[:16] == h[:16] for r, h in zip(ours, hf_out, strict=True))
    tps_hf, tps_ours = len(prompts) * k / t_hf, n_tok / t_ours
    return [
        [f"3 decode {len(prompts)} actors x {k} tok", "tokens/s", f"{tps_hf:.1f}", f"{tps_ours:.1f}",
         f"{tps_ours / tps_hf:.2f}x", ">= 4x"],
        ["", "greedy first 16 tokens equal to HF", "", f"{agree}/{len(prompts)}", "", ""],
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--env", default="EchoRL/ALFWorld-v0")
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32, help="generation budget per ReAct turn")
    ap.add_argument("--score-n", type=int, default=16, help="max admissible actions scored in part 2")
    ap.add_argument("--decode-actors", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    llm = load_model("smollm2-135m")
    rows: list[list] = []
    parts = {int(x) for x in args.parts.split(",")}
    headers = ["benchmark", "metric", "baseline", "ours", "ratio (>1: ours better)", "goal"]
    for i, fn in ((3, part3), (2, part2), (1, part1)):
        if i in parts:
            t0 = time.perf_counter()
            part_rows = fn(llm, args)
            rows.extend(part_rows)
            print(f"[part {i} done in {time.perf_counter() - t0:.0f} s]", flush=True)
            print(tabulate(part_rows, headers=headers, tablefmt="github"), flush=True)
    print("\n" + tabulate(rows, headers=headers, tablefmt="github"))


if __name__ == "__main__":
    main()
