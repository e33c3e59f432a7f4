"""The bench's figures: Success@1 per task (``success.png``) and the learning curves of trained agents
(``learning_curves.png``).

Both figures give each agent one colour (the same in both; agents ordered as in the registry) and each evaluation mode
one hatch, so no two series look alike. A success of 0 is drawn as a short outlined stub with its value written
above it (a bar of height 0 would be invisible), and each task's bars are centred under its label. Learning curves
get one panel per kind of learner (SB3 agents train for thousands of env steps, LLM policies for a few hundred), so
each is read at its own scale.
"""

from __future__ import annotations

import csv
import json
import textwrap
import warnings
from pathlib import Path
from typing import Any

__all__ = ["plot_success", "draw_success", "plot_curves", "curves_figure", "agent_colors", "MODE_HATCH", "MODE_LABEL", "ZERO_STUB"]

#: Hatch per evaluation mode ("-": agents that are not learned, drawn plain).
MODE_HATCH = {"-": "", "deterministic": "///", "stochastic": "..."}
#: Legend text per evaluation mode.
MODE_LABEL = {"deterministic": "greedy (deterministic)", "stochastic": "sampled (stochastic)"}
#: Height of the stub that stands for a success of 0 (in success units; the axis runs 0 to 1.05).
ZERO_STUB = 0.012
#: Bars in a task's group are this wide (one unit per bar); groups are separated by ``_GAP`` units.
_GAP = 1.2


def _agent_order(agents: list[str]) -> list[str]:
    """``agents`` (unique) in registry order, unknown names after them in the order given."""
    from echorl_agent.eval.agents import agent_names

    registered = {n: i for i, n in enumerate(agent_names())}
    unique = list(dict.fromkeys(agents))
    return sorted(unique, key=lambda a: (registered.get(a, len(registered)), unique.index(a)))


def agent_colors(agents: list[str]) -> dict[str, tuple[float, float, float, float]]:
    """One distinct colour per agent: tab10 for up to 10 agents, tab20 up to 20, then evenly spaced hues."""
    import matplotlib
    import numpy as np

    order = _agent_order(agents)
    n = len(order)
    if n <= 10:
        cmap, xs = matplotlib.colormaps["tab10"], [i for i in range(n)]
    elif n <= 20:
        cmap, xs = matplotlib.colormaps["tab20"], [i for i in range(n)]
    else:
        cmap, xs = matplotlib.colormaps["hsv"], list(np.linspace(0, 1, n, endpoint=False))
    return {a: tuple(float(c) for c in cmap(x)) for a, x in zip(order, xs, strict=True)}


def _short(task: str) -> str:
    """Task label: no ``EchoRL/`` or ``-v0``, wrapped at dashes so neighbouring labels do not overlap."""
    name = task.replace("EchoRL/", "").replace("EchoRL_", "").replace("-v0", "")
    return "\n".join(textwrap.wrap(name.replace("-", "- "), 14, break_on_hyphens=False)).replace("- ", "-")


def draw_success(summary: list[dict[str, Any]], ax: Any) -> dict[str, Any]:
    """Draw grouped Success@1 bars (Wilson 95% CI) of ``summary`` into ``ax``.

    Each task gets a group of bars, one per (agent, mode) that ran on it, centred under the task's tick label; each
    bar's ``gid`` is ``"task|agent|mode"``. Returns ``{"colors": {agent: rgba}, "ticks": {task: x}}``.
    """
    import numpy as np
    from matplotlib.patches import Patch

    tasks = list(dict.fromkeys(s["task"] for s in summary))
    colors = agent_colors([s["agent"] for s in summary])
    rank = {a: i for i, a in enumerate(colors)}
    modes = list(MODE_HATCH)
    ticks: dict[str, float] = {}
    left = 0.0
    for task in tasks:
        rows = sorted((s for s in summary if s["task"] == task),
                      key=lambda s: (rank[s["agent"]], modes.index(s.get("mode", "-")) if s.get("mode", "-") in modes
                                     else len(modes)))
        xs = left + np.arange(len(rows)) + 0.5
        ticks[task] = float(left + len(rows) / 2)
        for x, s in zip(xs, rows, strict=True):
            p, mode = float(s["success"]), s.get("mode", "-")
            # max(0, .): the Wilson bounds can sit a rounding error inside p at p = 0 or 1
            err = [[max(0.0, p - float(s["ci_low"]))], [max(0.0, float(s["ci_high"]) - p)]]
            height = p if p > 0 else ZERO_STUB
            ax.bar(x, height, 0.85, color=colors[s["agent"]], hatch=MODE_HATCH.get(mode, "xx"), edgecolor="black",
                   linewidth=0.6, gid=f"{task}|{s['agent']}|{mode}")
            ax.errorbar(x, p, yerr=err, fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
            if p == 0:
                ax.annotate("0", (x, ZERO_STUB), xytext=(0, 2), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7, bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})
        left += len(rows) + _GAP
    ax.set_xticks(list(ticks.values()), [_short(t) for t in tasks], fontsize=8)
    ax.set_xlim(-_GAP / 2, left - _GAP / 2)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Success@1 (95% Wilson CI)")
    used_modes = [m for m in MODE_LABEL if any(s.get("mode", "-") == m for s in summary)]
    handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.6, label=a) for a, c in colors.items()]
    handles += [Patch(facecolor="white", edgecolor="black", linewidth=0.6, hatch=MODE_HATCH[m], label=MODE_LABEL[m])
                for m in used_modes]
    ncols = max(1, min(len(handles), int(ax.figure.get_figwidth() // 1.7)))  # about 1.7 inches per legend entry
    ax.legend(handles=handles, fontsize=8, ncols=ncols, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return {"colors": colors, "ticks": ticks}


def plot_success(summary: list[dict[str, Any]], path: str | Path) -> Path:
    """``success.png``: Success@1 per task, one colour per agent and one hatch per mode (see :func:`draw_success`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = len(summary) + _GAP * len({s["task"] for s in summary})
    fig, ax = plt.subplots(figsize=(min(18, max(6, 1.5 + 0.32 * bars)), 4.8))
    draw_success(summary, ax)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _read_curve(path: Path) -> tuple[list[float], list[float]] | None:
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    if rows and not {"timesteps", "success_rate"} <= set(rows[0]):
        warnings.warn(f"{path} has no timesteps/success_rate columns; left out of the learning curves", stacklevel=3)
        return None
    return [float(r["timesteps"]) for r in rows], [float(r["success_rate"]) for r in rows]


def plot_curves(out: str | Path, path: str | Path) -> Path | None:
    """``learning_curves.png`` (see :func:`curves_figure`); None when no agent trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = curves_figure(out)
    if fig is None:
        return None
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves_figure(out: str | Path) -> Any:
    """The learning curves of ``<out>/training/<agent>/<task>/<seed>/curve.csv`` (rolling training success vs env
    steps) as a matplotlib Figure: one panel per kind of learner (SB3 agents, LLM policies), each at its own step
    scale; one colour per agent (as in ``success.png``: the agents of ``<out>/summary.json`` when it is there), one line
    style per seed. None when no agent trained."""
    files = sorted(Path(out).glob("training/**/curve.csv"))
    curves = []
    for f in files:
        parts = f.relative_to(Path(out) / "training").parts[:-1]
        data = _read_curve(f)
        if data is not None and data[0]:
            curves.append((parts, data))
    if not curves:
        return None
    import matplotlib.pyplot as plt

    # the bench writes summary.json first: colour the agents as success.png does (same agents, same order)
    trained = [parts[0] for parts, _ in curves]
    summary = Path(out) / "summary.json"
    ran = [s["agent"] for s in json.loads(summary.read_text())] if summary.is_file() else []
    colors = {a: c for a, c in agent_colors(ran + trained).items() if a in trained}
    # the bench's LM-policy agents are the llm-* ones; the others (ppo, echoppo, dqn...) are SB3 agents
    kind = {a: "LLM policies" if a.startswith("llm-") else "SB3 agents" for a in colors}
    panels = list(dict.fromkeys(kind[a] for a in colors))
    styles = ["-", "--", ":", "-."]
    tasks = {parts[1] for parts, _ in curves if len(parts) > 1}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for parts, (steps, success) in curves:
            agent = parts[0]
            if kind[agent] != panel:
                continue
            seeds = sorted({p[-1] for p, _ in curves if p[0] == agent})
            label = " ".join([agent, *(parts[1:-1] if len(tasks) > 1 else []), parts[-1]])
            ax.plot(steps, success, color=colors[agent], linestyle=styles[seeds.index(parts[-1]) % len(styles)],
                    marker="o" if len(steps) < 8 else None, markersize=3, label=label, alpha=0.9)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel("training success (rolling)")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=6)
    if len(tasks) == 1:
        fig.suptitle(_short(next(iter(tasks))).replace("\n", ""), fontsize=10)
    fig.tight_layout()
    return fig
