"""Summaries of runner rows: Success@1 with a Wilson 95% interval, the paired difference against a reference agent
(bootstrap CI and exact McNemar p on the shared instances), step caps, returns, tokens, KV reuse, cost; written as
Markdown, CSV and JSON (the figures: :mod:`echorl_agent.eval.plots`)."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from echorl_agent.eval.stats import wilson_interval

__all__ = ["summarize", "write_summary", "markdown_table", "notes", "budget_notes", "COLUMNS", "TIMING_COLUMNS"]

COLUMNS = ["task", "agent", "mode", "max_steps", "episodes", "success", "ci_low", "ci_high", "reference", "paired_n",
           "diff", "diff_low", "diff_high", "mcnemar_p", "significant", "mean_return", "mean_steps",
           "episodes_per_s", "prompt_tokens", "cached_tokens", "generated_tokens", "kv_reuse", "eta_bw",
           "cost_per_success"]
#: Significance level of the paired test that marks a difference with "*".
ALPHA = 0.05
#: Columns that depend on the machine's speed (left out when two runs are compared for equality).
TIMING_COLUMNS = ("episodes_per_s",)


def _caps(rs: list[dict]) -> int | str | None:
    caps = sorted({r["max_steps"] for r in rs if r.get("max_steps") is not None})
    return None if not caps else caps[0] if len(caps) == 1 else f"{caps[0]}-{caps[-1]}"


def _paired(rs: list[dict], ref: list[dict]) -> dict[str, Any]:
    """Success of ``rs`` minus the reference's, on the instances (seed, episode) both played."""
    from echorl_agent.eval.stats import mcnemar_exact, paired_bootstrap

    by_ref = {(r["seed"], r["episode"]): bool(r["success"]) for r in ref}
    # instance order, so the bootstrap CI does not depend on the order the rows were written in
    pairs = [(bool(r["success"]), by_ref[(r["seed"], r["episode"])])
             for r in sorted(rs, key=lambda r: (r["seed"], r["episode"])) if (r["seed"], r["episode"]) in by_ref]
    if not pairs:
        return {"paired_n": 0, "diff": None, "diff_low": None, "diff_high": None, "mcnemar_p": None,
                "significant": None}
    diff, lo, hi = paired_bootstrap([float(a) - float(b) for a, b in pairs])
    p = mcnemar_exact([a for a, _ in pairs], [b for _, b in pairs])
    return {"paired_n": len(pairs), "diff": diff, "diff_low": lo, "diff_high": hi, "mcnemar_p": p,
            "significant": p < ALPHA}


def _reference_group(groups: dict[tuple[str, str, str], list[dict]], task: str, reference: str,
                     mode: str) -> tuple[str, str, str] | None:
    """The reference's rows to pair with a row of mode ``mode``: the same mode if it has it, else its first."""
    keys = [k for k in groups if k[0] == task and k[1] == reference]
    same = [k for k in keys if k[2] == mode]
    return (same or keys or [None])[0]


def summarize(rows: list[dict], price_per_mtok: float = 0.0, reference: str | None = None) -> list[dict[str, Any]]:
    """One summary record per (task, agent, mode), in first-seen order.

    Args:
        rows: runner rows (one per episode).
        price_per_mtok: price per million LLM tokens, for cost per success (agents whose rows carry ``cost_usd``,
            priced by their own endpoint prices, use that instead).
        reference: agent every other agent of the same task is paired with (same seed and episode, so the same
            task instance): ``diff`` = mean success difference with its 95% paired-bootstrap CI, ``mcnemar_p`` the
            exact McNemar p-value, ``significant`` = p < :data:`ALPHA`.
    """
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["agent"], r.get("mode", "-"))].append(r)
    out = []
    for (task, agent, mode), rs in groups.items():
        n = len(rs)
        wins = sum(bool(r["success"]) for r in rs)
        lo, hi = wilson_interval(wins, n)
        secs = sum(r["seconds"] for r in rs)
        prompt = sum(r.get("prompt_tokens", 0.0) for r in rs)
        cached = sum(r.get("cached_tokens", 0.0) for r in rs)
        gen = sum(r.get("generated_tokens", 0.0) for r in rs)
        eta = [r["eta_bw"] for r in rs if "eta_bw" in r]
        # an agent that prices its own tokens (endpoint prices in its options) reports cost_usd per episode; the
        # others are priced at price_per_mtok per computed prompt + generated token
        own = [r["cost_usd"] for r in rs if "cost_usd" in r]
        cost = sum(own) if own else price_per_mtok * (prompt - cached + gen) / 1e6
        priced = bool(own) or bool(price_per_mtok)
        ref_key = _reference_group(groups, task, reference, mode) if reference else None
        paired = _paired(rs, groups[ref_key]) if ref_key and ref_key != (task, agent, mode) else {
            "paired_n": None, "diff": None, "diff_low": None, "diff_high": None, "mcnemar_p": None,
            "significant": None}
        out.append({
            "task": task, "agent": agent, "mode": mode, "max_steps": _caps(rs), "episodes": n, "success": wins / n,
            "ci_low": lo, "ci_high": hi, "reference": reference if ref_key else None, **paired,
            "mean_return": sum(r["return"] for r in rs) / n, "mean_steps": sum(r["steps"] for r in rs) / n,
            "episodes_per_s": n / secs if secs > 0 else float("inf"),
            "prompt_tokens": prompt, "cached_tokens": cached, "generated_tokens": gen,
            "kv_reuse": cached / prompt if prompt else None,
            "eta_bw": sum(eta) / len(eta) if eta else None,
            "cost_per_success": (cost / wins if wins else None) if priced else None,
        })
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _diff_cell(s: dict) -> str:
    if s.get("diff") is None:
        return "(reference)" if s.get("reference") and s.get("paired_n") is None else "-"
    mark = " *" if s["significant"] else ""
    return f"{s['diff']:+.2f} [{s['diff_low']:+.2f}, {s['diff_high']:+.2f}]{mark}"


def reference_of(summary: list[dict]) -> str | None:
    """The reference agent of a summary (None when it has no paired columns)."""
    return next((s["reference"] for s in summary if s.get("reference")), None)


def markdown_table(summary: list[dict]) -> str:
    """The summary as a GitHub Markdown table (Success@1 with its 95% Wilson CI; the paired difference against the
    reference with its 95% bootstrap CI, "*" when McNemar's exact p < 0.05; without a reference, no such columns)."""
    from tabulate import tabulate

    ref = reference_of(summary)
    paired = [f"Δ vs {ref} [95% CI]", "McNemar p"] if ref else []
    headers = ["task", "agent", "mode", "max steps", "n", "Success@1 [95% CI]", *paired,
               "return", "steps", "ep/s", "prompt tok", "cached", "generated", "KV reuse", "eta_bw",
               "cost/success"]
    diff = lambda s: [_diff_cell(s), "-" if s.get("mcnemar_p") is None else f"{s['mcnemar_p']:.2g}"] if ref else []  # noqa: E731
    body = [[s["task"], s["agent"], s.get("mode", "-"), _fmt(s.get("max_steps")), s["episodes"],
             f"{s['success']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]", *diff(s),
             _fmt(s["mean_return"]), _fmt(s["mean_steps"]), _fmt(s["episodes_per_s"]), _fmt(s["prompt_tokens"]),
             _fmt(s["cached_tokens"]), _fmt(s["generated_tokens"]), _fmt(s["kv_reuse"]), _fmt(s["eta_bw"]),
             _fmt(s["cost_per_success"])] for s in summary]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def budget_notes(summary: list[dict]) -> list[str]:
    """One sentence per task whose agents do not all have the same step cap (a deliberate per-agent cap)."""
    notes = []
    for task in dict.fromkeys(s["task"] for s in summary):
        caps = {s["agent"]: s.get("max_steps") for s in summary if s["task"] == task}
        if len({str(c) for c in caps.values()}) > 1:
            notes.append(f"Unequal budgets on {task}: max steps per episode "
                         + ", ".join(f"{a} {_fmt(c)}" for a, c in caps.items())
                         + ". Compare these agents with care.")
    return notes


def notes(summary: list[dict]) -> str:
    """The text under the table: what the columns mean and which budgets differ."""
    ref = reference_of(summary)
    lines = []
    if ref:
        lines.append(f"Δ vs {ref}: mean paired difference in success against {ref} on the same task instances "
                     f"(same seed and episode), 95% paired-bootstrap CI; * = exact McNemar p < {ALPHA}.")
    lines.append("mode: how a learned agent acts at evaluation (deterministic = greedy, stochastic = sampled; "
                 "'-' for agents that are not learned).")
    lines += budget_notes(summary)
    return "\n".join(f"- {x}" for x in lines)


def write_summary(summary: list[dict], out: str | Path) -> dict[str, Path]:
    """Write summary.md (table and notes), summary.csv and summary.json under ``out``; returns the paths."""
    out = Path(out)
    paths = {"md": out / "summary.md", "csv": out / "summary.csv", "json": out / "summary.json"}
    paths["md"].write_text(markdown_table(summary) + "\n\n" + notes(summary) + "\n")
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for s in summary:
            w.writerow({k: s.get(k) for k in COLUMNS})
    paths["json"].write_text(json.dumps(summary, indent=2))
    return paths
