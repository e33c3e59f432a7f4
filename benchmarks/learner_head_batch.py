"""The learner's LM head once per minibatch vs once per packed sequence, alternating, on real GoToLocal records.

:meth:`LLMPolicy.learner_scores_many` runs the trained layers per packed sequence (a state, or the states that share
a prompt prefix) and then the final norm, the LM head and the softmax once over the head rows of all of them
(:func:`~echorl_agent.llm_rl.forward.candidate_set_logprobs_many`), so the head's 576 x 49,152 weight is read once
per minibatch instead of once per sequence of ~13 rows. The baseline here is the per-sequence head it replaced. This
times one forward + backward of the same minibatch both ways (same learner, same adapters), with float32 and with
bfloat16 products for the frozen weights (``learner_matmul_dtype``), and checks the log-probabilities agree.

Run: ``python benchmarks/learner_head_batch.py`` (``--history 0 2``, ``--batch 32``, ``--repeats 5``, ``--threads 1``).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from learner_bf16 import policy, step  # noqa: E402
from learner_top_rows import parser, records  # noqa: E402
from tabulate import tabulate  # noqa: E402

from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_agent.llm_rl import forward  # noqa: E402
from echorl_agent.llm_rl import policy as policy_mod  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402


def per_sequence(parts, items):
    """The baseline: one final norm, LM head and softmax per packed sequence."""
    return [forward.candidate_set_logprobs_many(parts, [it])[0] for it in items]


def head(batched: bool):
    """The learner as it runs (``batched``) or with the per-sequence head patched in."""
    return nullcontext() if batched else patch.object(policy_mod, "candidate_set_logprobs_many", per_sequence)


def main() -> None:
    args = parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    table = []
    for dtype in ("float32", "bfloat16"):
        lm = TrainableLM(LLMPolicyConfig(lora_rank=8, train_layers=2, max_kv_tokens=8192, learner_matmul_dtype=dtype))
        pol = policy(lm, args.env)
        for h in args.history:
            recs = records(lm, args.env, h, args.batch, args.seed)
            times: dict[bool, list[float]] = {False: [], True: []}
            lps = {}
            for i in range(args.repeats):
                for batched in ((False, True) if i % 2 == 0 else (True, False)):
                    with head(batched):
                        s, lps[batched] = step(pol, recs)
                    times[batched].append(s)
            diff = max(float((a - b).abs().max()) for a, b in zip(lps[False], lps[True], strict=True))
            seq, once = float(np.median(times[False])), float(np.median(times[True]))
            segs = len(policy_mod.merge_prefixes(recs))
            table.append([dtype, h, segs, f"{seq:.3f}", f"{once:.3f}", f"{seq / once:.2f}x", f"{diff:.1e}"])
    print(f"{args.env}, {args.batch} records, LoRA r=8 on the top 2 layers, {args.threads} thread(s), "
          f"median of {args.repeats}, {cpu_name()}")
    print(tabulate(table, headers=["learner products", "history", "packed sequences", "head per sequence s",
                                   "head per minibatch s", "speed-up", "max |dlog pi|"], tablefmt="github"))


if __name__ == "__main__":
    main()
