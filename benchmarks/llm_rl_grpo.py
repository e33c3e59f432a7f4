"""GRPO on easy Arithmetic (one-digit a op b): success before and after training, SmolLM2-135M on CPU.

Stages, each evaluated on the same held-out tasks (greedy and sampled at temperature 1, Wilson 95% CIs):
``pretrained`` (no training), ``sft`` (supervised warm start on ``--warm`` oracle answers, as TRL users do before
GRPO -- the pretrained model almost never answers right when sampling, so GRPO groups would have zero reward
variance), ``grpo`` (then ``--steps`` GRPO steps of ``--prompts`` prompts x ``--group`` samples). Also prints the
fraction of zero-variance groups per step and a few sampled completions to read.

Run: ``python benchmarks/llm_rl_grpo.py`` (defaults below).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from echorl_agent.eval.report import wilson_interval  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.grpo import GRPOConfig, GRPOTrainer  # noqa: E402

EASY = {"dataset_kwargs": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "max_attempts": 1}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=int, default=64, help="oracle answers for the SFT warm start")
    ap.add_argument("--warm-epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval", type=int, default=40, help="held-out tasks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/llm_rl_grpo.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = GRPOConfig(env_kwargs=EASY, group_size=args.group, prompts_per_step=args.prompts, max_tokens=8, lr=args.lr,
                     seed=args.seed, lm=LLMPolicyConfig(lora_rank=8, train_layers=2))
    tr = GRPOTrainer(cfg)
    held_out = list(range(500_000, 500_000 + args.eval))
    rows, result = [], {"config": vars(args), "stages": {}}

    def evaluate(stage: str) -> None:
        for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
            wins = tr.evaluate(held_out, temperature=temp)
            k, n = int(wins.sum()), len(wins)
            lo, hi = wilson_interval(k, n)
            rows.append([stage, name, n, f"{k / n:.2f} [{lo:.2f}, {hi:.2f}]"])
            result["stages"].setdefault(stage, {})[name] = {"k": k, "n": n}
            print(rows[-1], flush=True)

    t0 = time.perf_counter()
    evaluate("pretrained")
    losses = tr.warm_start(list(range(args.warm)), epochs=args.warm_epochs)
    result["warm_losses"] = losses
    evaluate("sft")
    t1 = time.perf_counter()
    hist = tr.train(args.steps)
    result["grpo_s"] = time.perf_counter() - t1
    result["history"] = hist
    evaluate("grpo")
    g = tr.sample_group(held_out[0])
    result["samples"] = {"task": tr.env.reset(seed=held_out[0])[0], "completions": g.texts,
                         "rewards": g.rewards.tolist()}
    result["total_s"] = time.perf_counter() - t0
    print(tabulate(rows, headers=["stage", "eval", "tasks", "success [95% CI]"], tablefmt="github"))
    print(tabulate([[int(h["step"]), f"{h['reward_mean']:.2f}", f"{h['frac_zero_std']:.2f}", f"{h['loss']:.4f}",
                     f"{h['is_weight_mean']:.4f}"] for h in hist],
                   headers=["step", "group reward", "zero-std groups", "loss", "IS weight"], tablefmt="github"))
    print("samples:", json.dumps(result["samples"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    print(f"GRPO {args.steps} steps: {result['grpo_s']:.0f} s; total {result['total_s']:.0f} s")


if __name__ == "__main__":
    main()
