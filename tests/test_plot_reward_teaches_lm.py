"""The §10 panels of benchmarks/plot_reward_teaches_lm.py on hand-built gigpo_signal rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "plot_reward_teaches_lm", Path(__file__).resolve().parents[1] / "benchmarks" / "plot_reward_teaches_lm.py")
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def _rows(seed: int, probe: list[tuple[float, float]], align: list[float | None], won: dict[str, list[bool]]):
    out = []
    for i, (t, p) in enumerate(probe):
        r = {"label": "s10", "seed": seed, "kind": "iteration", "iteration": i, "timesteps": t,
             "probe_p_expert": p, "probe_top_expert": p / 2}
        if i > 0:
            a = align[i - 1]
            r.update(alignment=0.0 if a is None else a, n_expert=0 if a is None else 3, n_other=0 if a is None else 5)
        out.append(r)
    for phase, wins in won.items():
        for mode in ("stochastic", "deterministic"):
            out += [{"label": "s10", "seed": seed, "kind": "episode", "phase": phase, "mode": mode, "won": w}
                    for w in wins]
    return out + [{"label": "s10", "seed": seed, "kind": "done"}]


@pytest.fixture
def signal_file(tmp_path):
    rows = _rows(1, [(0, 0.2), (100, 0.4), (200, 0.4)], [0.5, None], {"before": [0, 0], "after": [1, 0]})
    rows += _rows(2, [(0, 0.3), (150, 0.3), (250, 0.5)], [-0.25, 0.0], {"before": [1, 0], "after": [1, 1]})
    rows += [{"label": "other", "seed": 3, "kind": "done"},
             {"label": "s10", "seed": 4, "kind": "iteration", "iteration": 0, "timesteps": 0,
              "probe_p_expert": 0.9, "probe_top_expert": 0.9}]  # seed 4 never finished: left out
    path = tmp_path / "signal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_probe_panel_plots_the_mean_step_function_of_finished_seeds(signal_file):
    fig, ax = plt.subplots()
    plot.probe_panel(ax, signal_file, "s10", "GoToLocal (§13)", start="frozen")
    line = ax.get_lines()[0]
    x, y = line.get_data()
    assert x[0] == 0 and x[-1] == 200  # the grid ends at the shortest finished run
    # seed 1: 0.2 until 100, then 0.4; seed 2: 0.3 until 150, then 0.3 (its 0.5 comes at 250, past the grid)
    expect = [(0.2 if t < 100 else 0.4) / 2 + 0.3 / 2 for t in x]
    np.testing.assert_allclose(y, expect)
    assert "2 seeds" in line.get_label()
    assert ax.get_title() == "GoToLocal (§13): the probe (2 seeds)"
    labels = ax.get_legend_handles_labels()[1]
    assert "frozen held-out success, stochastic" in labels
    assert "frozen + GiGPO held-out success, deterministic" in labels
    plt.close(fig)


def test_alignment_panel_counts_iterations_with_signal(signal_file):
    fig, ax = plt.subplots()
    plot.alignment_panel(ax, signal_file, "s10")
    pts = ax.collections[0].get_offsets()
    # iterations with samples only: seed 1 it 1 (+0.5), seed 2 its 1 (-0.25) and 2 (0.0, but it had samples)
    assert sorted(map(tuple, np.asarray(pts).tolist())) == [(100, 0.5), (150, -0.25), (250, 0.0)]
    assert ax.collections[0].get_label() == "3 of 4 iterations had signal (2 seeds)"
    plt.close(fig)


def _run(folder: Path, name: str, curve: list[tuple[int, float]]) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "curve.csv").write_text(
        "timesteps,success_rate\n" + "".join(f"{t},{s}\n" for t, s in curve))


def test_group_rl_panel_averages_finished_runs_only(tmp_path):
    _run(tmp_path, "gigpo-seed1", [(16, 0.0), (100, 0.5)])
    _run(tmp_path, "gigpo-seed2", [(16, 0.5), (100, 1.0)])
    _run(tmp_path, "gigpo-seed3", [(16, 1.0), (40, 1.0)])  # checkpointed mid-run: no rows yet, left out
    rows = [{"method": "gigpo", "seed": 1, "mode": m, "won": w} for m, w in (("stochastic", 1), ("deterministic", 0))]
    rows += [{"method": "gigpo", "seed": 2, "mode": "none"}]  # finished without evaluation: its curve counts
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig, ax = plt.subplots()
    plot.group_rl_panel(ax, tmp_path, "t", trained=("gigpo",), starts=(), colors={"gigpo": "C3"})
    line = ax.get_lines()[0]
    x, y = line.get_data()
    assert x[0] == 16 and x[-1] == 100  # the grid ends at the shortest finished run (seed 3's 40 would cut it)
    np.testing.assert_allclose(y, [0.25 if t < 100 else 0.75 for t in x])
    assert line.get_label() == "gigpo training (rolling, sampled), 2 seeds"
    assert line.get_color() == "C3"
    labels = ax.get_legend_handles_labels()[1]
    assert "gigpo held-out, stochastic (1 seeds)" in labels and "gigpo held-out, deterministic (1 seeds)" in labels
    plt.close(fig)


def test_group_rl_panel_leaves_out_rows_on_other_held_out_options(tmp_path):
    _run(tmp_path, "bc+ppo-seed1", [(16, 0.0), (100, 0.5)])
    rows = [{"method": "bc+ppo", "seed": 1, "mode": "stochastic", "won": w} for w in (1, 1, 0, 0)]
    rows += [{"method": "bc+ppo", "seed": 1, "mode": "stochastic", "won": 0,
              "eval_env_kwargs": '{"split": "valid_unseen"}'}] * 4  # unseen games: another measure, not pooled
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig, ax = plt.subplots()
    plot.group_rl_panel(ax, tmp_path, "t", trained=("bc+ppo",), starts=())
    (held_out,) = [c for c in ax.containers if c.get_label() == "bc+ppo held-out, stochastic (1 seeds)"]
    assert held_out.lines[0].get_ydata()[0] == 0.5  # 2 of the 4 training-option episodes, not 2 of 8
    plt.close(fig)
