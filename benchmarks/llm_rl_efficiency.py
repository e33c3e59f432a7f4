"""Efficiency of the LLM RL path (issue: the LLM learns), ours and the baseline side by side, alternating.

1. Learner: transitions/s of one PPO-style update (forward + backward of the policy's action log-probs and value)
   with rollout-activation reuse -- the learner starts from the activations the engine captured at the first
   trained layer and runs only the trained top layers, the prompt once for all candidates -- vs the naive
   full forward + backward of every ``prompt + action`` sequence through the whole model (what a trainer that
   ignores the rollout does), same batch, same LoRA adapters on the same layers.
2. Rollouts: env steps/s of LLMPolicy rollouts (engine scoring of every admissible action, history window k) with
   the prefix cache on vs off, same seeds and same (greedy) actions; rho = cached / all prompt tokens.
3. GRPO group sampling: completion tokens/s of n samples of one prompt on the engine (prompt prefilled once, KV
   forked) vs HF ``generate(num_return_sequences=n)``, temperature 1, same number of new tokens.

Run: ``python benchmarks/llm_rl_efficiency.py`` (``--parts 1,2,3``). One thread (``torch.set_num_threads(1)``).
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

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3.common.utils import ConstantSchedule  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401
from echorl_agent.llm.engine.config import SamplingParams  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402
from echorl_agent.llm_rl.policy import LLMPolicy  # noqa: E402
from echorl_envs.wrappers.llm import LLMObservationWrapper  # noqa: E402


def _policy(lm: TrainableLM, history: int) -> tuple[LLMPolicy, LLMObservationWrapper]:
    env = LLMObservationWrapper(gym.make(ARGS.env), history=history, max_actions=8)
    return LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-4), lm=lm), env


def _collect(policy: LLMPolicy, env, steps: int, seed: int) -> list[np.ndarray]:
    rows, ep = [], 0
    obs, _ = env.reset(seed=seed)
    policy.recording = True
    for _ in range(steps):
        a, _, _ = policy(torch.as_tensor(obs[None]), deterministic=True)
        rows.append(obs)
        obs, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            ep += 1
            obs, _ = env.reset(seed=seed + ep)
    return rows


# ------------------------------------------------------------------------------------------- part 1
def naive_update(policy: LLMPolicy, rows, actions) -> None:
    """Full forward + backward of every prompt + candidate through all layers (HF model, LoRA active)."""
    model = policy.lm.model
    losses = []
    for row, a in zip(rows, actions, strict=True):
        rec = policy.record(row)
        scores, last = [], None
        for c in rec.cands:
            out = model(torch.tensor([rec.context + c]), output_hidden_states=True)
            lp = torch.log_softmax(out.logits[0].float(), -1)
            p = len(rec.context)
            scores.append(sum(lp[p - 1 + j, t] for j, t in enumerate(c)))
            last = out.hidden_states[-1][0, p - 1]
        logp = torch.log_softmax(torch.stack(scores), -1)
        losses.append(-logp[a] + policy.value_head(last.float()).pow(2).sum())
    torch.stack(losses).mean().backward()


def reuse_update(policy: LLMPolicy, rows, actions) -> None:
    losses = []
    for row, a in zip(rows, actions, strict=True):
        logp, value, _ = policy.learner_scores(policy.record(row))
        losses.append(-logp[a] + value.pow(2).sum())
    torch.stack(losses).mean().backward()


def part1(lm: TrainableLM) -> list[list]:
    policy, env = _policy(lm, ARGS.history)
    rows = _collect(policy, env, ARGS.batch, seed=0)
    actions = [0] * len(rows)
    ctx = np.mean([len(policy.record(r).context) for r in rows])
    times = {"naive": [], "reuse": []}
    for _ in range(ARGS.repeats):
        for name, fn in (("naive", naive_update), ("reuse", reuse_update)):
            policy.optimizer.zero_grad()
            t = time.perf_counter()
            fn(policy, rows, actions)
            times[name].append(time.perf_counter() - t)
    naive, reuse = np.median(times["naive"]), np.median(times["reuse"])
    return [["learner update: transitions/s", f"{len(rows) / reuse:.2f}", f"{len(rows) / naive:.3f}",
             f"{naive / reuse:.1f}x", f"batch {len(rows)}, mean context {ctx:.0f} tok, 7 actions, "
             f"train_layers={lm.cfg.train_layers}, LoRA r={lm.cfg.lora_rank}"]]


# ------------------------------------------------------------------------------------------- part 2
def part2(lm_on: TrainableLM, lm_off: TrainableLM) -> list[list]:
    res = {}
    for _ in range(ARGS.repeats):
        for name, lm in (("off", lm_off), ("on", lm_on)):
            policy, env = _policy(lm, ARGS.history)
            s0 = lm.engine.stats
            cached0, computed0 = s0.num_cached_tokens, s0.num_computed_tokens
            t = time.perf_counter()
            _collect(policy, env, ARGS.rollout_steps, seed=100)
            dt = time.perf_counter() - t
            s = lm.engine.stats
            res.setdefault(name, []).append((dt, s.num_cached_tokens - cached0, s.num_computed_tokens - computed0))
    on, off = np.median([r[0] for r in res["on"]]), np.median([r[0] for r in res["off"]])
    c, p = res["on"][-1][1], res["on"][-1][2]
    rho = c / (c + p)
    return [["rollout env steps/s (prefix cache on ÷ off)", f"{ARGS.rollout_steps / on:.2f}",
             f"{ARGS.rollout_steps / off:.2f}", f"{off / on:.2f}x",
             f"history k={ARGS.history}, rho={rho:.3f} (candidate sharing included), prefilled tokens on/off "
             f"{p}/{res['off'][-1][2]}"]]


# ------------------------------------------------------------------------------------------- part 3
def part3(lm: TrainableLM) -> list[list]:
    llm = lm.llm
    env = gym.make("EchoRL/Arithmetic-v0")
    obs, _ = env.reset(seed=0)
    prompt = llm.chat_ids([{"role": "system", "content": "Solve the problem. Reply with the final answer only."},
                           {"role": "user", "content": obs}])
    n, new = ARGS.group, ARGS.new_tokens
    hf = lm.engine.llm.model
    times = {"hf": [], "engine": []}
    for r in range(ARGS.repeats):
        t = time.perf_counter()
        with torch.no_grad():
            hf.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, top_k=0, num_return_sequences=n,
                        max_new_tokens=new, min_new_tokens=new, pad_token_id=llm.tokenizer.eos_token_id)
        times["hf"].append(time.perf_counter() - t)
        t = time.perf_counter()
        params = SamplingParams(max_tokens=new, temperature=1.0, ignore_eos=True, seed=r, logprobs=True)
        outs = [lm.engine.wait(f) for f in lm.engine.submit_group(prompt, params, n)]
        times["engine"].append(time.perf_counter() - t)
        assert all(len(o.token_ids) == new for o in outs)
    hf_t, en_t = np.median(times["hf"]), np.median(times["engine"])
    return [["GRPO group sampling: completion tok/s", f"{n * new / en_t:.1f}", f"{n * new / hf_t:.1f}",
             f"{hf_t / en_t:.2f}x", f"n={n} x {new} tokens, prompt {len(prompt)} tok, HF generate "
             "num_return_sequences"]]


def main(argv: list[str] | None = None) -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--env", default="EchoRL/MiniGrid-Empty-5x5-v0")
    ap.add_argument("--history", type=int, default=4, help="history window k of the prompts")
    ap.add_argument("--batch", type=int, default=8, help="transitions in the learner update")
    ap.add_argument("--rollout-steps", type=int, default=24)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-layers", type=int, default=2)
    ARGS = ap.parse_args(argv)
    torch.set_num_threads(1)
    parts = {int(p) for p in ARGS.parts.split(",")}
    cfg = LLMPolicyConfig(train_layers=ARGS.train_layers, lora_rank=8, max_kv_tokens=16384)
    lm = TrainableLM(cfg)
    rows: list[list] = []
    if 1 in parts:
        rows += part1(lm)
    if 2 in parts:
        lm_off = TrainableLM(LLMPolicyConfig(train_layers=ARGS.train_layers, lora_rank=8, prefix_caching=False),
                             llm=None)
        rows += part2(lm, lm_off)
    if 3 in parts:
        rows += part3(lm)
    print(tabulate(rows, headers=["measure", "ours", "baseline", "ours ÷ baseline", "setting"], tablefmt="github"))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
