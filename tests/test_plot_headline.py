"""benchmarks/plot_headline.py: the README's headline figure plots what the committed study summaries hold."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("plot_headline", ROOT / "benchmarks" / "plot_headline.py")
headline = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = headline  # its dataclass looks its module up
spec.loader.exec_module(headline)

from benchmarks.summarize_study import load_groups  # noqa: E402  (importable once the script put the root on the path)


@pytest.fixture(scope="module")
def data():
    return headline.headline_data()


def test_every_bar_is_the_per_seed_success_in_the_summary(data):
    assert len(data) == 16  # 2 panels x 4 agents x 2 modes
    for d in data:
        agent = next(a for title, agents in headline.PANELS for a in agents
                     if title == d["panel"] and a.name == d["agent"])
        mode = dict((b, a) for a, b in headline.MODES)[d["mode"]]
        wins: dict[int, list[bool]] = {}
        for g in load_groups(ROOT / "benchmarks" / "results" / agent.summary):  # the episode groups, not expanded
            if g["mode"] == mode and not g.get("eval_env_kwargs") and all(g.get(k) == v for k, v in agent.select.items()):
                wins.setdefault(g["seed"], []).extend(g["won"])
        assert d["seeds"] == {s: np.mean(w) for s, w in sorted(wins.items())}
        assert {len(w) for w in wins.values()} == {40}  # 40 held-out episodes per seed and mode
        assert d["mean"] == pytest.approx(np.mean(list(d["seeds"].values())))
        assert d["lo"] <= d["mean"] <= d["hi"]


def test_the_figure_shows_the_registered_results(data):
    got = {(d["agent"], d["mode"]): (round(d["mean"], 3), sorted(d["seeds"])) for d in data}
    # the numbers the registered studies report (§26, §18, §24, §25)
    expect = {("frozen + GRPO", "sampled"): 0.47,
              ("frozen + GRPO", "greedy"): 0.283, ("BC-2", "sampled"): 0.346, ("BC-2", "greedy"): 0.245,
              ("BC-2 + GRPO", "sampled"): 0.472, ("BC-2 + GRPO", "greedy"): 0.37, ("BC-4", "sampled"): 0.47,
              ("BC-4", "greedy"): 0.335, ("BC-4 + PPO", "sampled"): 0.655, ("BC-4 + PPO", "greedy"): 0.61,
              ("BC-4 + GiGPO", "sampled"): 0.59, ("BC-4 + GiGPO", "greedy"): 0.555}
    for key, mean in expect.items():
        assert got[key[:2]][0] == mean, key
    assert got["frozen + GRPO", "greedy"][1] == list(range(1200, 1210))
    assert got["BC-2 + GRPO", "greedy"][1] == list(range(1070, 1090))
    assert got["BC-4 + GiGPO", "greedy"][1] == list(range(1150, 1155))
    frozen = [d for d in data if d["agent"] == "frozen LM"]
    assert [(round(d["mean"], 3), d["mode"]) for d in frozen] == [(0.133, "sampled"), (0.0, "greedy"),
                                                                   (0.05, "sampled"), (0.0, "greedy")]


def test_one_colour_per_agent_one_hatch_per_mode_and_zero_visible(data):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer

    fig = headline.plot(data)
    try:
        assert len(fig.axes) == 2
        for ax in fig.axes:
            bars = [(c.get_label(), c.patches[0]) for c in ax.containers if isinstance(c, BarContainer)]
            assert len(bars) == 8
            by_agent: dict[str, set] = {}
            for label, b in bars:
                agent, mode = label.rsplit(" ", 1)
                by_agent.setdefault(agent, set()).add(tuple(np.round(b.get_facecolor()[:3], 3)))
                assert (b.get_hatch() is not None) == (mode == "greedy")
            colours = [c.pop() for c in by_agent.values() if len(c) == 1]
            assert len(colours) == 4 and len(set(colours)) == 4  # one colour per agent, distinct in the panel
            # a bar of height 0 is drawn as a line at 0 and labelled with its value
            assert any(np.allclose(seg[:, 1], 0.0) for c in ax.collections for seg in getattr(c, "get_segments",
                                                                                            lambda: [])())
            assert "0.00" in [t.get_text() for t in ax.texts]
    finally:
        plt.close(fig)
