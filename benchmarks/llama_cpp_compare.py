"""Our engine (float32 / int8 / int4 weights) next to llama.cpp on the same GGUF, same prompts, greedy (issue 16).

llama.cpp runs through ``llama-cpp-python`` when it is installed (``pip install -e .[bench]`` builds it from
source); this script installs nothing and prints ``n/a`` in the llama.cpp column without it. Both read the
embedded SmolLM2-135M-Instruct Q4_1 GGUF (ours dequantizes it to float32 and re-quantizes per ``weight_dtype``),
both get the same token ids, and the two run alternately (ours, theirs, ours, theirs...) so a busy machine slows
both alike; report the ratios.

Parts (``--parts``):

* ``speed``: decode of a 100-token prompt + 128 tokens at 1 and 2 threads; prefill of 512 tokens; a 10-turn
  dialogue (+60 prompt tokens and 16 generated per turn) with prefix reuse; 8 sequences x 64 tokens batched (ours)
  vs one llama.cpp stream.
* ``requantize``: time to re-pack the quantized copies after a learner update (``ModelRunner.refresh_weights``):
  one decoder layer (its 7 projections, what a LoRA-on-top-layers update touches per layer), the LM head and the
  whole model, median of 3, 1 thread.
* ``quality``: greedy agreement of each quantized mode with float32 on ``--prompts`` prompts (first 32 tokens
  identical) and the ScoringAgent's greedy action agreement with float32 on ``--states`` MiniGrid states.

Run: ``nice -n 15 python benchmarks/llama_cpp_compare.py --parts speed,quality``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from echorl_agent.llm import EngineConfig, LLMEngine, PrefixCacheConfig, SamplingParams, load_model  # noqa: E402
from echorl_agent.llm.engine.scoring import common_prefix_len  # noqa: E402
from echorl_agent.llm.models.loading import embedded_gguf  # noqa: E402

_TEXT = (
    "You are an agent in a small house. The kitchen has a fridge, a stove, a sink and a table with two chairs. "
    "The living room has a sofa, a lamp, a bookshelf and a window facing the garden. Your task is to find the "
    "keys, put them on the table, then water the plants in the garden and come back inside before it rains. "
)


def _ids(llm, n: int, salt: str = "") -> list[int]:
    ids = llm.encode((salt + _TEXT) * (n // 40 + 2))
    return ids[:n]


def _ours(llm, dtype: str, cache: bool = True, max_num_seqs: int = 16) -> LLMEngine:
    pc = PrefixCacheConfig(block_size=16, max_tokens=8192, enable_prefix_caching=cache)
    return LLMEngine(llm, EngineConfig(prefix_cache=pc, max_num_seqs=max_num_seqs, weight_dtype=dtype))


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


class _LlamaCpp:
    """One llama.cpp context per thread count (greedy = top_k 1)."""

    def __init__(self, threads: int) -> None:
        from llama_cpp import Llama

        self.m = Llama(str(embedded_gguf("smollm2-135m")), n_ctx=2048, n_batch=512, n_threads=threads,
                       n_threads_batch=threads, verbose=False)

    def generate(self, ids: list[int], n: int, reset: bool = True) -> list[int]:
        out = []
        for t in self.m.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=reset):
            out.append(int(t))
            if len(out) == n:
                break
        return out

    def prefill(self, ids: list[int]) -> None:
        self.m.reset()
        self.m.eval(ids)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _dialogue_ours(eng: LLMEngine, llm, turns: int) -> float:
    hist: list[int] = []
    t0 = time.perf_counter()
    for t in range(turns):
        hist = hist + _ids(llm, 60, f"Turn {t}. ")
        hist = hist + eng.generate([hist], _greedy(16))[0].token_ids
    return time.perf_counter() - t0


def _dialogue_theirs(cpp: _LlamaCpp, llm, turns: int) -> float:
    hist: list[int] = []
    cpp.m.reset()
    t0 = time.perf_counter()
    for t in range(turns):
        hist = hist + _ids(llm, 60, f"Turn {t}. ")
        hist = hist + cpp.generate(hist, 16, reset=True)  # llama-cpp-python reuses the matching KV prefix
    return time.perf_counter() - t0


def speed(llm, dtypes: list[str], threads: list[int], rounds: int) -> list[list]:
    have_cpp = _has_llama_cpp()
    rows = []
    prompt100, prompt512 = _ids(llm, 100), _ids(llm, 512)
    for th in threads:
        torch.set_num_threads(th)
        cpp = _LlamaCpp(th) if have_cpp else None
        for dt in dtypes:
            eng = _ours(llm, dt)
            cold = _ours(llm, dt, cache=False)
            res: dict[str, list[float]] = {}
            agree = None
            for _ in range(rounds):  # alternate ours / theirs
                t_ours, r = _timed(lambda: eng.generate([prompt100], _greedy(128))[0].token_ids)  # noqa: B023
                res.setdefault("decode_ours", []).append(128 / t_ours)
                if cpp:
                    cpp.m.reset()
                    t_th, theirs = _timed(lambda: cpp.generate(prompt100, 128))  # noqa: B023
                    res.setdefault("decode_theirs", []).append(128 / t_th)
                    agree = common_prefix_len(r, theirs)
                t_ours, _r = _timed(lambda: cold.generate([prompt512], _greedy(1)))  # noqa: B023
                res.setdefault("prefill_ours", []).append(512 / t_ours)
                if cpp:
                    t_th, _r = _timed(lambda: cpp.prefill(prompt512))  # noqa: B023
                    res.setdefault("prefill_theirs", []).append(512 / t_th)
                if th == threads[0]:
                    res.setdefault("dialogue_ours", []).append(_dialogue_ours(_ours(llm, dt), llm, 10))
                    if cpp:
                        res.setdefault("dialogue_theirs", []).append(_dialogue_theirs(cpp, llm, 10))
                    batch = [_ids(llm, 100, f"Agent {i}. ") for i in range(8)]
                    beng = _ours(llm, dt, max_num_seqs=8)
                    t_ours, _r = _timed(lambda: beng.generate(batch, _greedy(64)))  # noqa: B023
                    res.setdefault("batch_ours", []).append(8 * 64 / t_ours)
                    if cpp:
                        cpp.m.reset()
                        t_th, _r = _timed(lambda: cpp.generate(batch[0], 64))  # noqa: B023
                        res.setdefault("batch_theirs", []).append(64 / t_th)
            rows.extend(_rows(res, dt, th, agree))
    return rows


def _med(v: list[float] | None) -> float | None:
    return None if not v else sorted(v)[len(v) // 2]


def _rows(res: dict[str, list[float]], dt: str, th: int, agree: int | None) -> list[list]:
    out = []
    names = {"decode": f"decode 100+128 tok/s, {th} thr", "prefill": f"prefill 512 tok/s, {th} thr",
             "dialogue": "10-turn dialogue s (reuse on), 1 thr", "batch": "8x64 batched vs 1 stream tok/s, 1 thr"}
    for key, label in names.items():
        ours, theirs = _med(res.get(f"{key}_ours")), _med(res.get(f"{key}_theirs"))
        if ours is None:
            continue
        ratio = None if theirs is None else (theirs / ours if key == "dialogue" else ours / theirs)
        note = f"greedy common prefix with llama.cpp: {agree}/128" if key == "decode" and agree is not None else ""
        out.append([label, dt, f"{ours:.3g}", "n/a" if theirs is None else f"{theirs:.3g}",
                    "n/a" if ratio is None else f"{ratio:.2f}", note])
    return out


def _has_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------------- quality
_TOPICS = ("rain", "a cat", "the moon", "bread", "a river", "chess", "a bicycle", "the ocean", "music", "a forest")
_ASKS = ("Explain {} in one sentence.", "Write a short poem about {}.", "Give three facts about {}.",
         "Describe {} to a child.", "What is the history of {}?", "List two uses of {}.", "Why do people like {}?",
         "Tell a very short story about {}.", "Compare {} with a mountain.", "What colour is {}?")


def greedy_agreement(llm, dtypes: list[str], n_prompts: int) -> dict[str, float]:
    prompts = [llm.chat_ids([{"role": "user", "content": a.format(t)}]) for a in _ASKS for t in _TOPICS][:n_prompts]
    ref = [r.token_ids for r in _ours(llm, "float32").generate(prompts, _greedy(32))]
    out = {}
    for dt in dtypes:
        got = [r.token_ids for r in _ours(llm, dt).generate(prompts, _greedy(32))]
        out[dt] = sum(a == b for a, b in zip(got, ref, strict=True)) / len(prompts)
    return out


def action_agreement(llm, dtypes: list[str], n_states: int, env_id: str) -> dict[str, float]:
    import gymnasium as gym
    import numpy as np

    import echorl_envs  # noqa: F401
    from echorl_agent.agents import ScoringAgent

    env = gym.make(env_id)
    rng = np.random.default_rng(0)
    states = []
    obs, info = env.reset(seed=0)
    while len(states) < n_states:
        adm = list(info.get("admissible_actions") or [])
        states.append((obs, info))
        obs, _r, term, trunc, info = env.step(adm[int(rng.integers(len(adm)))])
        if term or trunc:
            obs, info = env.reset(seed=len(states))
    picks = {}
    for dt in ["float32", *dtypes]:
        agent = ScoringAgent(_ours(llm, dt), temperature=0.0)
        acts = []
        for i, (obs, info) in enumerate(states):
            agent.reset(env_id, obs, info, i)
            acts.append(agent.act(obs, info))
        picks[dt] = acts
    return {dt: float(np.mean([a == b for a, b in zip(picks[dt], picks["float32"], strict=True)])) for dt in dtypes}


def requantize_times(llm, dtypes: list[str]) -> list[list]:
    torch.set_num_threads(1)
    rows = []
    for dt in dtypes:
        if dt == "float32":
            continue
        runner = _ours(llm, dt).runner
        layer = [f"model.layers.29.{n}.weight" for n in ("self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                                                          "mlp.up_proj", "mlp.down_proj")]
        for what, names in (("one decoder layer (7 projections)", layer), ("LM head", ["lm_head.weight"]),
                            ("whole model", None)):
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                runner.refresh_weights(names)
                times.append(time.perf_counter() - t0)
            rows.append([what, dt, f"{sorted(times)[1] * 1e3:.0f} ms"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="speed,quality")
    p.add_argument("--dtypes", default="float32,int8,int4")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2, help="alternating ours/theirs repetitions (median reported)")
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--states", type=int, default=500)
    p.add_argument("--env", default="EchoRL/MiniGrid-Empty-5x5-v0")
    args = p.parse_args(argv)
    llm = load_model("smollm2-135m")
    dtypes = args.dtypes.split(",")
    parts = args.parts.split(",")
    if "speed" in parts:
        rows = speed(llm, dtypes, [int(t) for t in args.threads.split(",")], args.rounds)
        print(tabulate(rows, ["measure", "weight_dtype", "our engine", "llama.cpp", "ours / theirs", "note"],
                       tablefmt="github"), flush=True)
    if "requantize" in parts:
        print(tabulate(requantize_times(llm, dtypes), ["re-pack", "weight_dtype", "median"], tablefmt="github"),
              flush=True)
    if "quality" in parts:
        torch.set_num_threads(1)
        q = [d for d in dtypes if d != "float32"]
        ga = greedy_agreement(llm, q, args.prompts)
        print(f"greedy agreement with float32 (first 32 tokens identical, {args.prompts} prompts):", ga, flush=True)
        aa = action_agreement(llm, q, args.states, args.env)
        print(f"ScoringAgent greedy action agreement with float32 ({args.states} states of {args.env}):", aa)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
