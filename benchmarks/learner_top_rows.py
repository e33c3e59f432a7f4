"""The learner's top layer on the rows that are read vs on every row, alternating, on real GoToLocal records.

The learner starts from the activations the rollout captured at the first trained layer and runs the trained layers
over ``[prompt, candidates...]``. Only the rows that predict a candidate token (and each state's last prompt row,
the value head's input) are ever read after the top layer, so ``run_layers(..., keep=rows)`` computes that layer's
queries, attention output and MLP for those rows alone (keys and values still for every row). This times one
forward + backward of a minibatch through :func:`~echorl_agent.llm_rl.forward.run_layers` both ways (same records,
same adapters), checks that the log-probabilities agree, and prints the ratio.

Run: ``python benchmarks/learner_top_rows.py`` (``--history 0 2``, ``--batch 32``, ``--repeats 5``, ``--threads 1``).
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3.common.utils import ConstantSchedule  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.forward import candidate_set_logprobs, output_rows, pack_sets, run_layers  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402
from echorl_agent.llm_rl.policy import LLMPolicy, StepRecord  # noqa: E402
from echorl_agent.llm_rl.rollout import make_choice_env  # noqa: E402


def records(lm: TrainableLM, env_id: str, history: int, n: int, seed: int) -> list[StepRecord]:
    """``n`` states of uniformly random episodes, recorded by the policy (captured activations included)."""
    env = make_choice_env(env_id, history=history, max_episode_steps=24)
    policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-4), lm=lm, show_admissible=False)
    rng = np.random.default_rng(seed)
    out, ep = [], 0
    obs, _ = env.reset(seed=seed)
    while len(out) < n:
        rec = policy.record(obs)
        out.append(rec)
        obs, _, term, trunc, _ = env.step(int(rng.integers(len(rec.cands))))
        if term or trunc:
            ep += 1
            obs, _ = env.reset(seed=seed + ep)
    return out


def step(lm: TrainableLM, recs: list[StepRecord], keep: bool) -> tuple[float, torch.Tensor]:
    """One forward + backward over every record (each its own packed sequence); seconds and the log-probs."""
    parts, b = lm.parts, lm.boundary
    t = time.perf_counter()
    loss, lps = 0.0, []
    for r in recs:
        batch = pack_sets(len(r.context), [(len(r.context), r.cands)])
        x = torch.cat([r.context_states, batch.candidate_rows(r.cand_states)])
        rows = output_rows(batch, [len(r.context) - 1]) if keep else None
        y = run_layers(parts, x, batch, b, lm.num_layers, keep=rows)
        lp, ctx = candidate_set_logprobs(parts, y, batch, rows)
        loss = loss + lp[0].log_softmax(-1)[0] + ctx.square().mean()
        lps.append(lp[0].detach())
    loss.backward()
    return time.perf_counter() - t, torch.cat(lps)


def parser(doc: str) -> argparse.ArgumentParser:
    """The options shared by the learner benchmarks."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--env", default="EchoRL/BabyAI-GoToLocal-v0")
    ap.add_argument("--history", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def alternate(lm: TrainableLM, run, repeats: int) -> tuple[dict[bool, float], float]:
    """``run(flag) -> (seconds, log-probs)`` for ``flag`` False and True, ``repeats`` times each in alternating
    order; the median seconds per flag and the largest log-probability difference between the two."""
    times: dict[bool, list[float]] = {True: [], False: []}
    lps = {}
    for i in range(repeats):
        for flag in ((False, True) if i % 2 == 0 else (True, False)):  # alternate the order
            lm.model.zero_grad()
            s, lps[flag] = run(flag)
            times[flag].append(s)
    return {k: float(np.median(v)) for k, v in times.items()}, float((lps[True] - lps[False]).abs().max())


def main() -> None:
    args = parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    lm = TrainableLM(LLMPolicyConfig(lora_rank=8, train_layers=2, max_kv_tokens=8192))
    table = []
    for h in args.history:
        recs = records(lm, args.env, h, args.batch, args.seed)
        med, diff = alternate(lm, lambda keep, recs=recs: step(lm, recs, keep), args.repeats)
        full, kept = med[False], med[True]
        ctx = np.mean([len(r.context) for r in recs])
        cand = np.mean([sum(len(c) for c in r.cands) for r in recs])
        table.append([h, f"{ctx:.0f} + {cand:.0f}", f"{full:.3f}", f"{kept:.3f}", f"{full / kept:.2f}x",
                      f"{diff:.1e}"])
    print(f"{args.env}, {args.batch} records, LoRA r=8 on the top 2 layers, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(tabulate(table, headers=["history", "prompt + candidate tokens", "every row s", "read rows s",
                                   "speed-up", "max |dlogp|"], tablefmt="github"))


if __name__ == "__main__":
    main()
