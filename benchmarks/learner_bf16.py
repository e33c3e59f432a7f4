"""The learner with bfloat16 products for its frozen weights vs float32, alternating, on real GoToLocal records.

``LLMPolicyConfig.learner_matmul_dtype="bfloat16"`` (:mod:`~echorl_agent.llm_rl.learner_bf16`) runs the trained
layers' base projections and the LM head on bfloat16 inputs and weights (float32 accumulation); the LoRA adapters,
attention, norms and residual stream stay float32. This builds two learners with the same adapters (one float32, one
bfloat16), times one forward + backward of :meth:`LLMPolicy.learner_scores_many` over the same minibatch with each
(alternating), and measures how far the bfloat16 policy moves: the KL between the two policies' softmax over each
state's admissible actions (mean and max over states) and the largest log-probability difference. The ratio depends
on the CPU: bfloat16 is fast only with AVX-512 BF16 or AMX.

Run: ``python benchmarks/learner_bf16.py`` (``--history 0 2``, ``--batch 32``, ``--repeats 5``, ``--threads 1``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from learner_top_rows import parser, records  # noqa: E402
from stable_baselines3.common.utils import ConstantSchedule  # noqa: E402
from tabulate import tabulate  # noqa: E402

from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402
from echorl_agent.llm_rl.policy import LLMPolicy  # noqa: E402
from echorl_agent.llm_rl.rollout import make_choice_env  # noqa: E402


def policy(lm: TrainableLM, env_id: str) -> LLMPolicy:
    env = make_choice_env(env_id, history=0, max_episode_steps=24)
    return LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-4), lm=lm, show_admissible=False)


def step(pol: LLMPolicy, recs) -> tuple[float, list[torch.Tensor]]:
    """One forward + backward of the learner over the minibatch; seconds and each state's log pi."""
    pol.lm.model.zero_grad()
    t = time.perf_counter()
    logps, values, _ = pol.learner_scores_many(recs)
    loss = sum(lp[0] for lp in logps) + values.square().mean()
    loss.backward()
    return time.perf_counter() - t, [lp.detach() for lp in logps]


def main() -> None:
    args = parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = dict(lora_rank=8, train_layers=2, max_kv_tokens=8192)
    lm32 = TrainableLM(LLMPolicyConfig(**cfg))
    lm16 = TrainableLM(LLMPolicyConfig(**cfg, learner_matmul_dtype="bfloat16"))
    with torch.no_grad():  # non-zero adapters (peft starts B at 0), the same in both learners
        for p in lm32.trainable_parameters():
            p.normal_(0.0, 0.02)
    lm16.load_trainable_state(lm32.trainable_state())
    pols = {"float32": policy(lm32, args.env), "bfloat16": policy(lm16, args.env)}
    table = []
    for h in args.history:
        recs = records(lm32, args.env, h, args.batch, args.seed)
        times: dict[str, list[float]] = {k: [] for k in pols}
        lps = {}
        for i in range(args.repeats):
            for k in (("float32", "bfloat16") if i % 2 == 0 else ("bfloat16", "float32")):
                s, lps[k] = step(pols[k], recs)
                times[k].append(s)
        kl = [float((a.exp() * (a - b)).sum()) for a, b in zip(lps["float32"], lps["bfloat16"], strict=True)]
        diff = max(float((a - b).abs().max()) for a, b in zip(lps["float32"], lps["bfloat16"], strict=True))
        t32, t16 = float(np.median(times["float32"])), float(np.median(times["bfloat16"]))
        table.append([h, f"{t32:.3f}", f"{t16:.3f}", f"{t32 / t16:.2f}x", f"{np.mean(kl):.1e}", f"{max(kl):.1e}",
                      f"{diff:.1e}"])
    print(f"{args.env}, {args.batch} records, LoRA r=8 on the top 2 layers, {args.threads} thread(s), "
          f"median of {args.repeats}, {cpu_name()}")
    print(tabulate(table, headers=["history", "float32 s", "bfloat16 s", "speed-up", "KL mean", "KL max",
                                   "max |dlog pi|"], tablefmt="github"))


if __name__ == "__main__":
    main()
