"""What the held-out episodes did: action shares per method and evaluation mode, and ALFWorld's take-then-put-back loops.

Reads the ``actions`` that ``benchmarks/llm_rl_learning.py`` records with every held-out episode in
``<out>/episodes.jsonl`` and prints, per method and mode, the share of each kind of action over all steps, the mean
episode length of wins and losses, and for ALFWorld the number of *put-backs* per episode: ``take O from R``
immediately followed by ``move O to R`` (the same object back onto the same receptacle: a wasted pair of steps, the
loop §17 diagnosed), with the share of episodes that repeat it three or more times. Episodes held out on other env
options (``--eval-env-kwargs``) get their own table.

An action's kind is its whole text when the episodes use at most ``--max-kinds`` distinct texts (MiniGrid/BabyAI:
``turn left``, ``go forward``, …), else its first word (ALFWorld: ``go``, ``take``, ``move``, ``open``, …).

Run: ``python benchmarks/episode_actions.py --out benchmarks/results/llm_rl_alfworld_s1110`` (``--seeds`` to keep
only some seeds, e.g. the finished pairs; ``--methods`` to keep some methods).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import numpy as np
from tabulate import tabulate

from echorl_agent.eval.stats import read_jsonl

_TAKE = re.compile(r"^take (.+) from (.+)$")
_MOVE = re.compile(r"^move (.+) to (.+)$")


def put_backs(actions: list[str]) -> int:
    """How often ``take O from R`` is immediately followed by ``move O to R`` (same object, same receptacle)."""
    n = 0
    for a, b in pairwise(actions):
        take, move = _TAKE.match(a), _MOVE.match(b)
        n += bool(take and move and take.groups() == move.groups())
    return n


def kinds(rows: list[dict], max_kinds: int) -> Callable[[str], str]:
    """The function naming an action's kind: its text when the episodes have few distinct texts, else its first word."""
    texts = {a for r in rows for a in r["actions"]}
    return (lambda a: a) if len(texts) <= max_kinds else (lambda a: a.split(" ", 1)[0])


def table(rows: list[dict], max_kinds: int = 12, top: int = 8) -> list[list]:
    """One line per (method, mode): episodes, wins, steps of wins / losses, action shares, put-backs."""
    kind = kinds(rows, max_kinds)
    lines = []
    for method in dict.fromkeys(r["method"] for r in rows):
        for mode in ("stochastic", "deterministic"):
            rs = [r for r in rows if r["method"] == method and r["mode"] == mode]
            if not rs:
                continue
            counts = Counter(kind(a) for r in rs for a in r["actions"])
            total = sum(counts.values())
            shares = ", ".join(f"{k} {100 * c / total:.0f}%" for k, c in counts.most_common(top))
            won = [r["steps"] for r in rs if r["won"]]
            lost = [r["steps"] for r in rs if not r["won"]]
            pb = [put_backs(r["actions"]) for r in rs]
            lines.append([method, mode, len(rs), sum(r["won"] for r in rs),
                          f"{np.mean(won):.1f}" if won else "–", f"{np.mean(lost):.1f}" if lost else "–", shares,
                          f"{np.mean(pb):.2f}", f"{sum(p >= 3 for p in pb)}/{len(pb)}"])
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a results folder of benchmarks/llm_rl_learning.py (or its "
                    "episodes.jsonl)")
    ap.add_argument("--methods", nargs="+", help="only these methods")
    ap.add_argument("--seeds", nargs="+", type=int, help="only these seeds")
    ap.add_argument("--max-kinds", type=int, default=12,
                    help="at most this many distinct action texts: shares per text, else per first word")
    args = ap.parse_args(argv)
    path = Path(args.out)
    path = path / "episodes.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"--out: no episodes.jsonl at {path}")
    rows = [r for r in read_jsonl(path) if r.get("mode") in ("stochastic", "deterministic") and "actions" in r
            and (args.methods is None or r["method"] in args.methods)
            and (args.seeds is None or r["seed"] in args.seeds)]
    if not rows:
        raise ValueError(f"no held-out episodes with actions in {path} for --methods={args.methods} "
                         f"--seeds={args.seeds}")
    for tag in sorted({r.get("eval_env_kwargs") or "" for r in rows}):  # held-out options never pool
        rs = [r for r in rows if (r.get("eval_env_kwargs") or "") == tag]
        seeds = sorted({r["seed"] for r in rs})
        print(f"\n{path}: {len(rs)} held-out episodes on {tag or 'the training options'}, "
              f"seeds {', '.join(map(str, seeds))}")
        print(tabulate(table(rs, args.max_kinds), headers=["method", "eval", "episodes", "wins", "steps (won)",
                                                           "steps (lost)", "action shares", "put-backs / episode",
                                                           "episodes ≥ 3 put-backs"], tablefmt="github"))


if __name__ == "__main__":
    main()
