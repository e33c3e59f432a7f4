"""The two token samplers (``SamplingParams.sampler``) on the real model: same success rate on Arithmetic?

``multinomial`` and ``inverse_cdf`` draw from the same distribution (``tests/test_llm_engine_requests.py`` tests
that on fixed distributions); this checks it where GRPO uses them. For each of ``--tasks`` held-out one-digit
Arithmetic tasks (the ``benchmarks/llm_rl_grpo.py`` setting and prompt), the pretrained SmolLM2-135M answers
``--samples`` times at temperature 1 with each sampler (8 tokens; sample ``i`` of task ``t`` seeded ``t * 1000 + i``,
the same seeds for both), judged by the env. Prints each sampler's mean success (env judge and the strict
reading) and the paired difference per task with a 95% bootstrap CI over tasks.

Run: ``python benchmarks/sampler_check.py --tasks 200 --samples 16``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.llm_rl_grpo import EASY, HELD_OUT, strict_answer  # noqa: E402
from echorl_agent.eval.stats import paired_bootstrap  # noqa: E402
from echorl_agent.llm.engine.config import SAMPLERS, WEIGHT_DTYPES, SamplingParams  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks (seeds 500000...)")
    ap.add_argument("--samples", type=int, default=16, help="answers per task and sampler")
    ap.add_argument("--engine-dtype", choices=WEIGHT_DTYPES, default="int8")
    args = ap.parse_args(argv)
    if args.tasks < 2 or args.samples < 1:
        ap.error(f"--tasks must be >= 2 and --samples >= 1, got {args.tasks}, {args.samples}")
    torch.set_num_threads(1)
    from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig
    from echorl_agent.llm_rl.algorithms.grpo.trainer import GRPOTrainer
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    tr = GRPOTrainer(GRPOConfig(env_kwargs=EASY, max_tokens=8,
                                lm=LLMPolicyConfig(lora_rank=8, train_layers=2, engine_weight_dtype=args.engine_dtype)))
    eng = tr.lm.engine
    tasks = list(range(HELD_OUT, HELD_OUT + args.tasks))
    answers = [str(tr.env.reset(seed=s)[1]["expert_action"]) for s in tasks]
    rates: dict[str, dict[str, np.ndarray]] = {}
    for sampler in SAMPLERS:
        wins, strict = np.zeros(len(tasks)), np.zeros(len(tasks))
        for k, (s, ans) in enumerate(zip(tasks, answers, strict=True)):
            params = SamplingParams(max_tokens=8, temperature=1.0, seed=s * 1000, sampler=sampler)
            texts = [eng.wait(f).text for f in eng.submit_group(tr.prompt_ids(s), params, args.samples)]
            w = [tr.judge(s, t) > 0 for t in texts]
            wins[k] = np.mean(w)
            strict[k] = np.mean([a and strict_answer(t, ans) for a, t in zip(w, texts, strict=True)])
        rates[sampler] = {"env judge": wins, "strict": strict}
    rows = []
    for metric in ("env judge", "strict"):
        a, b = rates["multinomial"][metric], rates["inverse_cdf"][metric]
        m, lo, hi = paired_bootstrap(b - a)
        rows.append([metric, f"{a.mean():.3f}", f"{b.mean():.3f}", f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"])
    print(f"{args.tasks} tasks x {args.samples} samples per sampler, pretrained SmolLM2-135M, {args.engine_dtype} engine")
    print(tabulate(rows, headers=["metric", "multinomial", "inverse_cdf", "inverse_cdf - multinomial [95% CI over tasks]"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
