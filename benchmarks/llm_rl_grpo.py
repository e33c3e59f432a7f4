"""GRPO on easy Arithmetic (one-digit a op b): success before and after training, SmolLM2-135M on CPU, over seeds.

Per seed, each stage is evaluated on the same held-out tasks (greedy and sampled at temperature 1, the sampling
seeded by the task): ``pretrained`` (no training; ``--skip-pretrained`` leaves it out), ``sft`` (supervised warm
start on ``--warm`` oracle answers of the seed's own training tasks, as TRL users do before GRPO -- the pretrained
model almost never answers right when sampling, so GRPO groups would have zero reward variance), ``grpo`` (then
``--steps`` GRPO steps of ``--prompts`` prompts x ``--group`` samples). One JSON per seed goes to ``--out``
(per-task wins of every stage and mode, the per-step history, sampled completions to read).

``--summary`` reads a results folder (its ``seed_*.json``, else the study's committed summary ``<out>.jsonl``
without the texts: ``benchmarks/summarize_study.py``) and prints, per mode, pooled success with Wilson CIs and the
paired difference grpo - sft per seed with a 95% percentile bootstrap over seeds (the registered statistic, see
``docs/studies/arithmetic-grpo-from-pretrained.md``) and over tasks.

Run: ``python benchmarks/llm_rl_grpo.py --seeds 0`` (one seed, defaults below, into ``runs/llm_rl_grpo``); the
study: ``python benchmarks/llm_rl_grpo.py --seeds 940 941 ... --out runs/llm_rl_grpo_s940``, then
``python benchmarks/summarize_study.py runs/llm_rl_grpo_s940 --out benchmarks/results/llm_rl_grpo_s940.jsonl`` and
``python benchmarks/llm_rl_grpo.py --summary --out benchmarks/results/llm_rl_grpo_s940``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.summarize_study import load_seed_jsons  # noqa: E402
from echorl_agent.eval.stats import paired_bootstrap, success_text  # noqa: E402
from echorl_agent.llm.engine.config import SAMPLERS, WEIGHT_DTYPES  # noqa: E402

EASY = {"dataset_kwargs": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "max_attempts": 1}
HELD_OUT = 500_000  # held-out task seeds start here (the same tasks for every seed and stage)
MODES = (("greedy", 0.0), ("sampled", 1.0))


def strict_answer(text: str, answer: str) -> bool:
    """The reply *is* the answer: the text after its last ``=`` (the whole reply if none) is one number equal to
    ``answer``. The env's judge takes the last number of the reply, which a truncated restatement of the task can
    satisfy ("1 * -6 means ..." for 1 * -6); this stricter reading separates such wins from computed ones."""
    tail = text.rsplit("=", 1)[-1].strip().rstrip(".").strip()
    return re.fullmatch(r"-?\d+(\.\d+)?(/\d+)?", tail) is not None and float(Fraction(tail)) == float(Fraction(answer))


def grpo_config(args: argparse.Namespace, seed: int):
    """The :class:`GRPOConfig` of one seed (what the shipped recipe ``arithmetic-grpo`` is checked against)."""
    from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    return GRPOConfig(env_kwargs=EASY, group_size=args.group, prompts_per_step=args.prompts, max_tokens=8,
                      lr=args.lr, seed=seed, sampler=args.sampler,
                      lm=LLMPolicyConfig(lora_rank=8, train_layers=2, engine_weight_dtype=args.engine_dtype))


def run_seed(seed: int, args: argparse.Namespace) -> dict:
    from echorl_agent.llm_rl.algorithms.grpo.trainer import GRPOTrainer

    torch.manual_seed(seed)
    tr = GRPOTrainer(grpo_config(args, seed))
    held_out = list(range(HELD_OUT, HELD_OUT + args.eval))
    result: dict = {"seed": seed, "config": {k: v for k, v in vars(args).items() if k != "seeds"}, "wins": {}}

    answers = [tr.env.reset(seed=s)[1]["expert_action"] for s in held_out]

    def evaluate(stage: str) -> None:
        for name, temp in MODES:
            texts = tr.answers(held_out, temperature=temp)
            wins = np.array([tr.judge(s, t) > 0 for s, t in zip(held_out, texts, strict=True)])
            strict = np.array([w and strict_answer(t, a) for w, t, a in zip(wins, texts, answers, strict=True)])
            result["wins"].setdefault(stage, {})[name] = wins.astype(int).tolist()
            result.setdefault("strict", {}).setdefault(stage, {})[name] = strict.astype(int).tolist()
            result.setdefault("texts", {}).setdefault(stage, {})[name] = texts
            print(f"seed {seed} {stage:10s} {name:8s} {success_text(int(wins.sum()), len(wins))}  strict "
                  f"{success_text(int(strict.sum()), len(strict))}", flush=True)

    t0 = time.perf_counter()
    if not args.skip_pretrained or not args.warm:
        evaluate("pretrained")
    if args.warm:
        warm = [seed * 10_000 + i for i in range(args.warm)]  # the seed's own training tasks (never >= HELD_OUT)
        result["warm_losses"] = tr.warm_start(warm, epochs=args.warm_epochs)
        evaluate("sft")
    t1 = time.perf_counter()
    hist = tr.train(args.steps)
    result["grpo_s"] = time.perf_counter() - t1
    result["history"] = hist
    evaluate("grpo")
    samples = []
    for s in held_out[:4]:
        g = tr.sample_group(s)
        samples.append({"task": tr.env.reset(seed=s)[0], "completions": g.texts, "rewards": g.rewards.tolist()})
    result["samples"] = samples
    result["total_s"] = time.perf_counter() - t0
    return result


def summary(out: Path, base: str, target: str) -> None:
    runs = load_seed_jsons(out)
    if not runs:
        raise SystemExit(f"no seed_*.json in {out} and no summary of it (benchmarks/summarize_study.py)")
    rows = []
    for metric in ("wins", "strict"):
        for name, _ in MODES:
            a = np.array([r[metric][base][name] for r in runs], dtype=float)  # [seeds, tasks]
            b = np.array([r[metric][target][name] for r in runs], dtype=float)
            per_seed = b.mean(1) - a.mean(1)
            m, lo, hi = paired_bootstrap(per_seed)
            _, tlo, thi = paired_bootstrap((b - a).mean(0))  # over tasks (seeds averaged per task)
            better, worse = int((per_seed > 0).sum()), int((per_seed < 0).sum())
            rows.append(["env judge" if metric == "wins" else "strict", name, len(runs), a.shape[1],
                         success_text(int(a.sum()), a.size), success_text(int(b.sum()), b.size),
                         f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]", f"[{tlo:+.3f}, {thi:+.3f}]", f"{better}/{worse}",
                         ("holds" if lo > 0 else "not established") if metric == "wins" else "(secondary)"])
    print(tabulate(rows, headers=["metric", "mode", "seeds", "tasks", base, target,
                                  f"{target} - {base} over seeds [95% CI]", "CI over tasks", "seeds better/worse",
                                  "rule"], tablefmt="github"))
    secs = [r["grpo_s"] for r in runs]
    print(f"GRPO training: {np.mean(secs):.0f} s per seed on average ({runs[0]['config']['steps']} steps)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=int, default=64, help="oracle answers for the SFT warm start (0: GRPO from the pretrained LM)")
    ap.add_argument("--warm-epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval", type=int, default=40, help="held-out tasks")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--engine-dtype", choices=WEIGHT_DTYPES, default="float32",
                    help="weights of the rollout engine (LLMPolicyConfig.engine_weight_dtype; the trained top layers "
                         "stay float32); it samples the GRPO groups and answers the evaluation")
    ap.add_argument("--sampler", choices=SAMPLERS, default="multinomial", help="token sampler (GRPOConfig.sampler)")
    ap.add_argument("--skip-pretrained", action="store_true", help="do not evaluate the pretrained stage")
    ap.add_argument("--out", default="runs/llm_rl_grpo")
    ap.add_argument("--summary", action="store_true", help="summarise the seeds in --out instead of running")
    ap.add_argument("--base", default="sft", help="--summary: the start the difference is taken against")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    if args.summary:
        summary(out, args.base, "grpo")
        return
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        path = out / f"seed_{seed}.json"
        if path.exists():
            print(f"seed {seed}: {path} exists, skipped", flush=True)
            continue
        result = run_seed(seed, args)
        path.write_text(json.dumps(result, default=float))
        h = result["history"]
        k = max(1, len(h) // 3)
        print(f"seed {seed}: group reward {np.mean([x['reward_mean'] for x in h[:k]]):.3f} (first third) -> "
              f"{np.mean([x['reward_mean'] for x in h[-k:]]):.3f} (last third); zero-std groups "
              f"{np.mean([x['frac_zero_std'] for x in h[:k]]):.2f} -> {np.mean([x['frac_zero_std'] for x in h[-k:]]):.2f}; "
              f"GRPO {result['grpo_s']:.0f} s, total {result['total_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
