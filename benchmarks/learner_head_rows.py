"""The learner's LM head once per distinct row vs once per candidate token, alternating, on real GoToLocal records.

A candidate set's first tokens are all predicted by the set's last prompt row, so a GoToLocal state's 7 candidates
(19 tokens) need only 13 distinct head rows. :func:`~echorl_agent.llm_rl.forward.candidate_set_logprobs` runs the
final norm, the LM head (576 x 49,152) and the softmax once per distinct row and gathers each token's log-probability
from its row; the baseline here is the per-token head it replaced (one row per candidate token). This times one
forward + backward of a minibatch through the trained layers both ways (same records, same adapters, the top layer on
the read rows as the learner runs it), checks that the log-probabilities agree, and prints the ratio.

Run: ``python benchmarks/learner_head_rows.py`` (``--history 0 2``, ``--batch 32``, ``--repeats 5``, ``--threads 1``).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from learner_top_rows import alternate, parser, records, step  # noqa: E402
from tabulate import tabulate  # noqa: E402

from echorl_agent.llm_rl import forward  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402


def per_token_lp(parts, x, batch, extra_rows=(), x_rows=None):
    """The baseline: the final norm and the LM head on one row per candidate token (and per extra row)."""
    rows, targets, owners = forward._candidate_token_rows(batch)
    need = list(extra_rows) + rows
    if x_rows is not None:
        at = {r: i for i, r in enumerate(x_rows)}
        need = [at[r] for r in need]
    hidden = parts.norm(x[torch.tensor(need, dtype=torch.long)])
    extra, tok_h = hidden[: len(extra_rows)], hidden[len(extra_rows):]
    lp = torch.log_softmax(parts.lm_head(tok_h).float(), dim=-1).gather(1, torch.tensor(targets)[:, None])[:, 0]
    return lp, owners, extra


def per_token_lp_many(parts, items):
    return [per_token_lp(parts, *item) for item in items]


def head(distinct: bool):
    """The learner's head as it runs (``distinct``) or with the per-token head patched in."""
    return nullcontext() if distinct else patch.object(forward, "_candidate_token_lp_many", per_token_lp_many)


def main() -> None:
    args = parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    lm = TrainableLM(LLMPolicyConfig(lora_rank=8, train_layers=2, max_kv_tokens=8192))

    def run(distinct: bool, recs) -> tuple[float, torch.Tensor]:
        with head(distinct):  # the learner's forward + backward, top layer on the read rows
            return step(lm, recs, keep=True)

    table = []
    for h in args.history:
        recs = records(lm, args.env, h, args.batch, args.seed)
        med, diff = alternate(lm, lambda distinct, recs=recs: run(distinct, recs), args.repeats)
        per_tok, once = med[False], med[True]
        toks = np.mean([sum(len(c) for c in r.cands) for r in recs])
        distinct_rows = np.mean([len(set(forward._candidate_token_rows(
            forward.pack_sets(len(r.context), [(len(r.context), r.cands)]))[0])) for r in recs])
        table.append([h, f"{toks:.1f} / {distinct_rows:.1f}", f"{per_tok:.3f}", f"{once:.3f}",
                      f"{per_tok / once:.2f}x", f"{diff:.1e}"])
    print(f"{args.env}, {args.batch} records, LoRA r=8 on the top 2 layers, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(tabulate(table, headers=["history", "head rows per state: per token / distinct", "per token s",
                                   "distinct rows s", "speed-up", "max |dlogp|"], tablefmt="github"))


if __name__ == "__main__":
    main()
