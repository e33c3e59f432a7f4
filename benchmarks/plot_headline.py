"""The README's headline figure: frozen LM vs imitation vs RL on the tasks where a registered result holds.

Held-out success of SmolLM2-135M (LoRA on its top layers, trained on CPU), sampled and greedy, mean over seeds with a
95% percentile-bootstrap CI over seeds and every seed as a point, read from the studies' committed summaries
(``benchmarks/summarize_study.py``) only:

* BabyAI-GoToLocal with the goal line, 24-step budget: the frozen LM and episode-level GRPO from it (study §26,
  seeds 1200-1209, ``gigpo_signal_s1200.jsonl``: before = frozen, after = RL), and BC on 2 demonstrations and BC-2 +
  the same GRPO (§18, seeds 1070-1089, ``gigpo_signal_s1070.jsonl``); 40 held-out episodes per seed and mode.
* ALFWorld PickAndPlace on a pool of four games, 30-step budget: frozen (§25), BC on 4 demonstrations, BC-4 + PPO with
  a critic and BC-4 + GiGPO, 4,096 env steps (§24, seeds 1150-1154, ``llm_rl_alfworld4_s1150``); 40 held-out episodes
  per seed and mode on the games trained on.

Run: ``python benchmarks/plot_headline.py`` (writes ``docs/figures/headline.png``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.summarize_study import RESULTS, load_rows  # noqa: E402
from echorl_agent.eval.stats import paired_bootstrap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = (("stochastic", "sampled"), ("deterministic", "greedy"))
"""(the rows' mode, its name in the figure)."""


@dataclass(frozen=True)
class Agent:
    """One bar pair: the held-out episodes of one arm of one study summary."""

    name: str
    """Label under the bars."""
    summary: str
    """The study's summary file in ``benchmarks/results/``."""
    select: dict
    """Row fields that pick the arm (e.g. ``{"label": "s26", "phase": "before"}`` or ``{"method": "bc"}``)."""
    color: str
    """One colour per agent, the same in every panel."""


GOTOLOCAL = (
    Agent("frozen LM", "gigpo_signal_s1200.jsonl", {"label": "s26", "kind": "episode", "phase": "before"}, "0.55"),
    Agent("frozen + GRPO", "gigpo_signal_s1200.jsonl", {"label": "s26", "kind": "episode", "phase": "after"},
          "tab:orange"),
    Agent("BC-2", "gigpo_signal_s1070.jsonl", {"label": "s18", "kind": "episode", "phase": "before"}, "tab:blue"),
    Agent("BC-2 + GRPO", "gigpo_signal_s1070.jsonl", {"label": "s18", "kind": "episode", "phase": "after"},
          "tab:green"),
)
ALFWORLD = (
    Agent("frozen LM", "llm_rl_alfworld4_s1150.jsonl", {"method": "frozen"}, "0.55"),
    Agent("BC-4", "llm_rl_alfworld4_s1150.jsonl", {"method": "bc"}, "tab:blue"),
    Agent("BC-4 + PPO", "llm_rl_alfworld4_s1150.jsonl", {"method": "bc+ppo"}, "tab:red"),
    Agent("BC-4 + GiGPO", "llm_rl_alfworld4_s1150.jsonl", {"method": "bc+gigpo"}, "tab:purple"),
)
PANELS = (("BabyAI-GoToLocal (goal line), 24-step budget", GOTOLOCAL),
          ("ALFWorld PickAndPlace, four games, 30-step budget", ALFWORLD))


def per_seed_success(rows: list[dict], agent: Agent, mode: str) -> dict[int, float]:
    """Each seed's held-out success of ``agent`` in ``mode`` (on the training env options: rows tagged with other
    held-out options, ``eval_env_kwargs``, are left out)."""
    wins: dict[int, list[bool]] = {}
    for r in rows:
        if r.get("mode") == mode and not r.get("eval_env_kwargs") and all(r.get(k) == v for k, v in
                                                                            agent.select.items()):
            wins.setdefault(r["seed"], []).append(bool(r["won"]))
    return {s: float(np.mean(w)) for s, w in sorted(wins.items())}


def headline_data(results: Path = RESULTS) -> list[dict]:
    """One record per (panel, agent, mode): per-seed success, mean and 95% CI over seeds, episodes per seed."""
    cache: dict[str, list[dict]] = {}
    out = []
    for title, agents in PANELS:
        for agent in agents:
            rows = cache.setdefault(agent.summary, load_rows(results / agent.summary))
            for mode, name in MODES:
                seeds = per_seed_success(rows, agent, mode)
                if not seeds:
                    raise ValueError(f"no held-out episodes of {agent.select} ({mode}) in {results / agent.summary}")
                mean, lo, hi = paired_bootstrap(list(seeds.values()))
                out.append({"panel": title, "agent": agent.name, "mode": name, "color": agent.color, "seeds": seeds,
                            "mean": mean, "lo": lo, "hi": hi})
    return out


def plot(data: list[dict], out: str | Path | None = None):
    """The figure: per panel, a pair of bars per agent (sampled plain, greedy hatched) with the CI, the seeds as
    points and the mean written above (a success of 0 shows as a labelled line at 0). Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = list(dict.fromkeys(d["panel"] for d in data))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    rng = np.random.default_rng(0)  # the points' horizontal jitter only
    width = 0.38
    for ax, panel in zip(axes[0], panels, strict=True):
        recs = [d for d in data if d["panel"] == panel]
        agents = list(dict.fromkeys(d["agent"] for d in recs))
        for d in recs:
            i = agents.index(d["agent"]) + (-width / 2 if d["mode"] == "sampled" else width / 2)
            greedy = d["mode"] == "greedy"
            ax.bar(i, d["mean"], width * 0.92, color=d["color"], alpha=0.45 if greedy else 0.85,
                   hatch="///" if greedy else None, edgecolor=d["color"], linewidth=1.2,
                   label=f"{d['agent']} {d['mode']}".replace("\n", " "))
            ax.errorbar(i, d["mean"], yerr=[[d["mean"] - d["lo"]], [d["hi"] - d["mean"]]], color="black", capsize=3,
                        lw=1)
            vals = list(d["seeds"].values())
            ax.scatter(i + rng.uniform(-width / 4, width / 4, len(vals)), vals, s=9, color="black", alpha=0.6,
                       zorder=3, linewidths=0)
            ax.hlines(d["mean"], i - width * 0.46, i + width * 0.46, color=d["color"], lw=2)  # 0 stays visible
            top = max(d["hi"], *vals)  # above the CI and the seeds' points
            ax.text(i, top + 0.015, f"{d['mean']:.2f}", ha="center", va="bottom", fontsize=7.5)
        n_seeds = {a: len(next(d["seeds"] for d in recs if d["agent"] == a)) for a in agents}
        ax.set_xticks(range(len(agents)), [f"{a}\n{n_seeds[a]} seeds" for a in agents], fontsize=8)
        ax.set_ylim(-0.02, 1.0)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_ylabel("held-out success")
        ax.set_title(panel, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(handles=[Patch(facecolor="0.5", alpha=0.85, label="sampled"),
                               Patch(facecolor="0.5", alpha=0.45, hatch="///", label="greedy")],
                      loc="upper left", fontsize=8, title="mode (bars: mean, 95% CI over seeds; dots: seeds)",
                      title_fontsize=7.5)
    fig.suptitle("SmolLM2-135M on CPU: the frozen LM, imitation (BC) and RL after imitation or from the frozen LM",
                 fontsize=10.5)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs/figures/headline.png"))
    args = ap.parse_args(argv)
    data = headline_data()
    for d in data:
        print(f"{d['panel']} | {d['agent']!s:<24} | {d['mode']:<7} | {d['mean']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}] "
              f"({len(d['seeds'])} seeds)".replace("\n", " "))
    plot(data, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
