"""Summaries of runner rows: Success@1 with a Wilson 95% interval, returns, tokens, KV reuse, cost; written as
Markdown, CSV and JSON, with matplotlib plots."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["wilson_interval", "summarize", "write_summary", "markdown_table", "plot_success", "plot_curves"]

COLUMNS = ["task", "agent", "episodes", "success", "ci_low", "ci_high", "mean_return", "mean_steps",
           "episodes_per_s", "prompt_tokens", "cached_tokens", "generated_tokens", "kv_reuse", "eta_bw",
           "cost_per_success"]


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when ``n == 0``.

    Better than the normal approximation at the small n and extreme rates typical of agent benchmarks.
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(rows: list[dict], price_per_mtok: float = 0.0) -> list[dict[str, Any]]:
    """One summary record per (task, agent), in first-seen order."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["agent"])].append(r)
    out = []
    for (task, agent), rs in groups.items():
        n = len(rs)
        wins = sum(bool(r["success"]) for r in rs)
        lo, hi = wilson_interval(wins, n)
        secs = sum(r["seconds"] for r in rs)
        prompt = sum(r.get("prompt_tokens", 0.0) for r in rs)
        cached = sum(r.get("cached_tokens", 0.0) for r in rs)
        gen = sum(r.get("generated_tokens", 0.0) for r in rs)
        eta = [r["eta_bw"] for r in rs if "eta_bw" in r]
        cost = price_per_mtok * (prompt - cached + gen) / 1e6
        out.append({
            "task": task, "agent": agent, "episodes": n, "success": wins / n, "ci_low": lo, "ci_high": hi,
            "mean_return": sum(r["return"] for r in rs) / n, "mean_steps": sum(r["steps"] for r in rs) / n,
            "episodes_per_s": n / secs if secs > 0 else float("inf"),
            "prompt_tokens": prompt, "cached_tokens": cached, "generated_tokens": gen,
            "kv_reuse": cached / prompt if prompt else None,
            "eta_bw": sum(eta) / len(eta) if eta else None,
            "cost_per_success": (cost / wins if wins else None) if price_per_mtok else None,
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


def markdown_table(summary: list[dict]) -> str:
    """The summary as a GitHub Markdown table (Success@1 shown with its 95% CI)."""
    from tabulate import tabulate

    headers = ["task", "agent", "n", "Success@1 [95% CI]", "return", "steps", "ep/s", "prompt tok", "cached",
               "generated", "KV reuse", "eta_bw", "cost/success"]
    body = [[s["task"], s["agent"], s["episodes"], f"{s['success']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
             _fmt(s["mean_return"]), _fmt(s["mean_steps"]), _fmt(s["episodes_per_s"]), _fmt(s["prompt_tokens"]),
             _fmt(s["cached_tokens"]), _fmt(s["generated_tokens"]), _fmt(s["kv_reuse"]), _fmt(s["eta_bw"]),
             _fmt(s["cost_per_success"])] for s in summary]
    return tabulate(body, headers=headers, tablefmt="github")


def write_summary(summary: list[dict], out: str | Path) -> dict[str, Path]:
    """Write summary.md, summary.csv and summary.json under ``out``; returns the paths."""
    out = Path(out)
    paths = {"md": out / "summary.md", "csv": out / "summary.csv", "json": out / "summary.json"}
    paths["md"].write_text(markdown_table(summary) + "\n")
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for s in summary:
            w.writerow({k: s.get(k) for k in COLUMNS})
    paths["json"].write_text(json.dumps(summary, indent=2))
    return paths


def plot_success(summary: list[dict], path: str | Path) -> Path:
    """Grouped bars of Success@1 per task, one bar per agent, with Wilson 95% CI error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(dict.fromkeys(s["task"] for s in summary))
    agents = list(dict.fromkeys(s["agent"] for s in summary))
    by = {(s["task"], s["agent"]): s for s in summary}
    width = 0.8 / max(1, len(agents))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 1.0 + 0.35 * len(tasks) * len(agents))), 4.5))
    x = np.arange(len(tasks))
    for i, a in enumerate(agents):
        vals = [by[(t, a)]["success"] if (t, a) in by else np.nan for t in tasks]
        # max(0, .): the Wilson bounds can sit a rounding error inside p at p = 0 or 1
        lo = [max(0.0, by[(t, a)]["success"] - by[(t, a)]["ci_low"]) if (t, a) in by else 0 for t in tasks]
        hi = [max(0.0, by[(t, a)]["ci_high"] - by[(t, a)]["success"]) if (t, a) in by else 0 for t in tasks]
        ax.bar(x + (i - (len(agents) - 1) / 2) * width, vals, width, yerr=[lo, hi], capsize=3, label=a)
    ax.set_xticks(x, [t.replace("EchoRL/", "").replace("-v0", "") for t in tasks], rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Success@1 (95% Wilson CI)")
    ax.legend(fontsize=8, ncols=min(6, len(agents)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_curves(out: str | Path, path: str | Path) -> Path | None:
    """Learning curves of trained agents from ``<out>/training/**/progress.csv`` (episode reward vs steps)."""
    files = sorted(Path(out).glob("training/**/curve.csv"))
    if not files:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for f in files:
        steps, rets = [], []
        with open(f) as fh:
            for row in csv.DictReader(fh):
                steps.append(float(row["timesteps"]))
                rets.append(float(row["success_rate"]))
        rel = f.relative_to(Path(out) / "training")
        ax.plot(steps, rets, label=" ".join(rel.parts[:-1]), alpha=0.8)
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate (rolling)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
