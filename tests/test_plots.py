"""The bench's figures can be read: one style per agent × mode, zero visible, bars under their task, curves at their
own scale (the Axes are inspected, not just the file's existence)."""

from __future__ import annotations

import csv
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from echorl_agent.eval.plots import (  # noqa: E402
    ZERO_STUB,
    agent_colors,
    curves_figure,
    draw_success,
    plot_curves,
    plot_success,
)

MG, G24, ALF = "EchoRL/MiniGrid-Empty-Random-5x5-v0", "EchoRL/Game24-v0", "EchoRL/ALFWorld-PickAndPlace-v0"


def _row(task: str, agent: str, mode: str, p: float) -> dict:
    return {"task": task, "agent": agent, "mode": mode, "success": p, "ci_low": max(0.0, p - 0.2),
            "ci_high": min(1.0, p + 0.2)}


#: The shape of the demo's summary: the learned agents in both modes on MiniGrid only, react on Game24 only, zeros.
SUMMARY = [
    _row(MG, "random", "-", 0.5), _row(MG, "expert", "-", 1.0),
    _row(MG, "ppo", "deterministic", 0.2), _row(MG, "ppo", "stochastic", 0.97),
    _row(MG, "llm-frozen", "deterministic", 0.0), _row(MG, "llm-frozen", "stochastic", 0.38),
    _row(MG, "llm-gigpo", "deterministic", 1.0), _row(MG, "llm-gigpo", "stochastic", 1.0),
    _row(G24, "random", "-", 0.0), _row(G24, "expert", "-", 1.0), _row(G24, "react", "-", 0.0),
    _row(ALF, "random", "-", 0.0), _row(ALF, "expert", "-", 1.0),
]


@pytest.fixture
def ax():
    fig, ax = plt.subplots(figsize=(12, 4.5))
    yield ax
    plt.close(fig)


def _bars(ax) -> dict[tuple[str, str, str], matplotlib.patches.Rectangle]:
    return {tuple(p.get_gid().split("|")): p for p in ax.patches if p.get_gid()}


def test_each_agent_and_mode_has_its_own_style(ax):
    draw_success(SUMMARY, ax)
    bars = _bars(ax)
    assert len(bars) == len(SUMMARY)
    style: dict[tuple[str, str], tuple] = {}
    for (_, agent, mode), bar in bars.items():
        s = (tuple(round(c, 4) for c in bar.get_facecolor()), bar.get_hatch() or "")
        assert style.setdefault((agent, mode), s) == s, f"{agent} ({mode}) is drawn in two styles"
    assert len(set(style.values())) == len(style), f"two series share a style: {style}"
    # one colour per agent, whatever the mode; one hatch per mode, whatever the agent
    colors = {agent: s[0] for (agent, _), s in style.items()}
    assert len(set(colors.values())) == len(colors)
    assert all(s[0] == colors[a] for (a, _), s in style.items())
    hatches = {mode: s[1] for (_, mode), s in style.items()}
    assert len(set(hatches.values())) == len(hatches) == 3
    assert all(s[1] == hatches[m] for (_, m), s in style.items())
    # the pairs that looked alike in the old figure (random vs llm-gigpo greedy, expert vs llm-gigpo sampled)
    assert style[("random", "-")] != style[("llm-gigpo", "deterministic")]
    assert style[("expert", "-")] != style[("llm-gigpo", "stochastic")]
    # the legend names every agent and both modes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert set(legend) >= {"random", "expert", "ppo", "llm-frozen", "llm-gigpo", "react", "greedy (deterministic)",
                           "sampled (stochastic)"}


def test_zero_success_is_visible_and_written(ax):
    draw_success(SUMMARY, ax)
    bars = _bars(ax)
    zeros = [k for k in bars if next(s["success"] for s in SUMMARY if (s["task"], s["agent"], s["mode"]) == k) == 0]
    assert len(zeros) == 4
    labels = [(t.xy[0], t.get_text()) for t in ax.texts]
    for k in zeros:
        bar = bars[k]
        assert bar.get_height() == pytest.approx(ZERO_STUB) and bar.get_linewidth() > 0, k
        x = bar.get_x() + bar.get_width() / 2
        assert any(abs(lx - x) < 1e-9 and text == "0" for lx, text in labels), f"no '0' written over {k}"
    # a non-zero bar is its value, with no label
    assert bars[(MG, "ppo", "deterministic")].get_height() == pytest.approx(0.2)
    assert len(ax.texts) == len(zeros)


def test_every_bar_sits_under_its_task_label(ax):
    info = draw_success(SUMMARY, ax)
    ticks = ax.get_xticks()
    names = [t.get_text().replace("\n", "") for t in ax.get_xticklabels()]
    assert names == ["MiniGrid-Empty-Random-5x5", "Game24", "ALFWorld-PickAndPlace"]
    assert all(t.get_rotation() == 0 and t.get_horizontalalignment() == "center" for t in ax.get_xticklabels())
    # each task's bars form one group: groups do not overlap, and each is centred on its own tick label
    groups = {}
    for (task, _, _), bar in _bars(ax).items():
        lo, hi = groups.get(task, (float("inf"), float("-inf")))
        groups[task] = (min(lo, bar.get_x()), max(hi, bar.get_x() + bar.get_width()))
    assert list(groups) == list(info["ticks"]) == [MG, G24, ALF]
    spans = [groups[t] for t in info["ticks"]]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    for task, tick in zip(info["ticks"], ticks, strict=True):
        lo, hi = groups[task]
        assert tick == pytest.approx(info["ticks"][task]) == pytest.approx((lo + hi) / 2, abs=0.1)
    # react ran on Game24 only: its bar is under Game24, within that task's group
    react = _bars(ax)[(G24, "react", "-")]
    g24 = [b for (t, _, _), b in _bars(ax).items() if t == G24]
    assert min(b.get_x() for b in g24) <= react.get_x() <= max(b.get_x() for b in g24)


def test_plot_success_writes_the_png(tmp_path):
    path = plot_success(SUMMARY, tmp_path / "success.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_agent_colours_follow_the_registry_and_stay_distinct():
    colors = agent_colors(["llm-gigpo", "random", "expert"])
    assert list(colors) == ["random", "expert", "llm-gigpo"]  # registry order, whatever order they came in
    many = agent_colors([f"agent{i}" for i in range(25)])
    assert len(set(many.values())) == 25


def _write_curve(path, steps, success):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timesteps", "success_rate", "return"])
        w.writerows([(s, p, p) for s, p in zip(steps, success, strict=True)])


def test_learning_curves_put_the_lm_on_its_own_scale(tmp_path):
    task = MG.replace("/", "_")
    for seed in (0, 1):
        _write_curve(tmp_path / "training" / "ppo" / task / f"seed{seed}" / "curve.csv",
                     range(512, 8193, 512), [min(1.0, i / 16) for i in range(16)])
    _write_curve(tmp_path / "training" / "llm-gigpo" / task / "seed0" / "curve.csv", [32, 64, 96, 128],
                 [0.5, 0.75, 1.0, 1.0])
    fig = curves_figure(tmp_path)
    try:
        panels = {ax.get_title(): ax for ax in fig.axes}
        assert set(panels) == {"SB3 agents", "LLM policies"}
        lm, sb3 = panels["LLM policies"], panels["SB3 agents"]
        assert lm.get_xlim()[1] < 200 < 8000 < sb3.get_xlim()[1]  # 128 LM steps span their own panel
        assert [line.get_label() for line in lm.get_lines()] == ["llm-gigpo seed0"]
        colors = agent_colors(["ppo", "llm-gigpo"])
        assert to_rgba(lm.get_lines()[0].get_color()) == pytest.approx(colors["llm-gigpo"])
        ppo = sb3.get_lines()
        assert [to_rgba(line.get_color()) for line in ppo] == [pytest.approx(colors["ppo"])] * 2
        assert ppo[0].get_linestyle() != ppo[1].get_linestyle()  # one line style per seed
    finally:
        plt.close(fig)
    assert plot_curves(tmp_path, tmp_path / "curves.png").stat().st_size > 10_000
    # with the bench's summary.json beside them, each agent has the colour success.png gives it
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY + [_row(MG, "echoppo", "stochastic", 1.0)]))
    fig = curves_figure(tmp_path)
    fig2, ax = plt.subplots()
    try:
        bars = draw_success(SUMMARY + [_row(MG, "echoppo", "stochastic", 1.0)], ax)["colors"]
        lines = {line.get_label().split()[0]: to_rgba(line.get_color()) for a in fig.axes for line in a.get_lines()}
        assert lines == {"ppo": pytest.approx(bars["ppo"]), "llm-gigpo": pytest.approx(bars["llm-gigpo"])}
        assert bars["ppo"] != agent_colors(["ppo", "llm-gigpo"])["ppo"]  # random comes first in this run's summary
    finally:
        plt.close(fig)
        plt.close(fig2)
    assert plot_curves(tmp_path / "nothing", tmp_path / "none.png") is None
