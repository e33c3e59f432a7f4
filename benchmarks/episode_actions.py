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
only some seeds, e.g. the finished pairs; ``--methods`` to keep some methods). Without ``episodes.jsonl`` in the
folder it reads the study's committed summary (``benchmarks/summarize_study.py``: each run, mode and held-out option's
actions summed and put-backs per episode), which gives the same table.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.summarize_study import load_groups, put_backs  # noqa: E402

__all__ = ["kinds", "put_backs", "table"]


def _group(row: dict) -> dict:
    """A raw episode row (with its ``actions``) as an episode group of one (the summary's form)."""
    if "action_counts" in row:
        return row
    return {**row, "won": [row["won"]], "steps": [row["steps"]], "put_backs": [put_backs(row["actions"])],
            "action_counts": Counter(row["actions"])}


def kinds(groups: list[dict], max_kinds: int) -> Callable[[str], str]:
    """The function naming an action's kind: its text when the episodes have few distinct texts, else its first word."""
    texts = {a for g in groups for a in g["action_counts"]}
    return (lambda a: a) if len(texts) <= max_kinds else (lambda a: a.split(" ", 1)[0])


def table(rows: list[dict], max_kinds: int = 12, top: int = 8) -> list[list]:
    """One line per (method, mode): episodes, wins, steps of wins / losses, action shares, put-backs.

    ``rows``: raw episode rows with their ``actions``, or a summary's episode groups
    (:func:`benchmarks.summarize_study.load_groups`).
    """
    groups = [_group(r) for r in rows]
    kind = kinds(groups, max_kinds)
    lines = []
    for method in dict.fromkeys(g["method"] for g in groups):
        for mode in ("stochastic", "deterministic"):
            gs = [g for g in groups if g["method"] == method and g["mode"] == mode]
            if not gs:
                continue
            counts = Counter()
            for g in gs:
                for a, c in g["action_counts"].items():
                    counts[kind(a)] += c
            total = sum(counts.values())
            shares = ", ".join(f"{k} {100 * c / total:.0f}%" for k, c in counts.most_common(top))
            wins = [(w, s) for g in gs for w, s in zip(g["won"], g["steps"], strict=True)]
            won = [s for w, s in wins if w]
            lost = [s for w, s in wins if not w]
            pb = [p for g in gs for p in g["put_backs"]]
            lines.append([method, mode, len(wins), sum(w for w, _ in wins),
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
    path = path / "episodes.jsonl" if path.is_dir() or not path.suffix else path
    groups = load_groups(path)  # the raw episodes summed per run and mode, or the study's committed summary
    if not groups:
        raise ValueError(f"--out: no episodes.jsonl at {path} and no summary of it (benchmarks/summarize_study.py)")
    rows = [r for r in groups if r.get("mode") in ("stochastic", "deterministic") and r["action_counts"]
            and (args.methods is None or r["method"] in args.methods)
            and (args.seeds is None or r["seed"] in args.seeds)]
    if not rows:
        raise ValueError(f"no held-out episodes with actions in {path} for --methods={args.methods} "
                         f"--seeds={args.seeds}")
    for tag in sorted({r.get("eval_env_kwargs") or "" for r in rows}):  # held-out options never pool
        rs = [r for r in rows if (r.get("eval_env_kwargs") or "") == tag]
        seeds = sorted({r["seed"] for r in rs})
        print(f"\n{path}: {sum(len(r['steps']) for r in rs)} held-out episodes on {tag or 'the training options'}, "
              f"seeds {', '.join(map(str, seeds))}")
        print(tabulate(table(rs, args.max_kinds), headers=["method", "eval", "episodes", "wins", "steps (won)",
                                                           "steps (lost)", "action shares", "put-backs / episode",
                                                           "episodes ≥ 3 put-backs"], tablefmt="github"))


if __name__ == "__main__":
    main()
