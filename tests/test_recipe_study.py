"""benchmarks/recipe_study.py: run folders of ``echorl train-llm`` reduce to one row per seed, and the table pairs
each seed's phases on the same held-out episodes with a bootstrap over seeds."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from echorl_agent.eval.stats import paired_bootstrap
from echorl_agent.llm_rl.curve import write_curve

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def study(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("recipe_study", ROOT / "benchmarks" / "recipe_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    return mod


def _run(folder: Path, seed: int, wins: dict[tuple[str, str], str]) -> None:
    folder.mkdir(parents=True)
    with open(folder / "eval_episodes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "mode", "episode_seed", "won", "return", "steps", "actions"])
        for (phase, mode), won in wins.items():
            for ep, c in enumerate(won):
                acts = ["turn left", "go forward"] if c == "1" else ["go forward"] * 3
                w.writerow([phase, mode, 100000 + 1000 * seed + ep, c, 0.9 * int(c), len(acts), " | ".join(acts)])
    (folder / "eval.json").write_text(json.dumps({"after": {}}))
    write_curve(folder / "curve.csv", [(8 * i, i / 10, 0.0) for i in range(1, 6)])
    (folder / "wall_s.txt").write_text("120.0\n")


def test_summary_rows_and_table_pair_phases_per_seed(study):
    a = {("after_bc", m): "0011" for m in ("sampled", "greedy")} | {("after", m): "0111" for m in ("sampled", "greedy")}
    b = {("after_bc", m): "0101" for m in ("sampled", "greedy")} | {("after", "sampled"): "0101",
                                                                     ("after", "greedy"): "0001"}
    _run(study.RUNS / "s" / "seed7", 7, a)
    _run(study.RUNS / "s" / "seed8", 8, b)
    (study.RUNS / "s" / "seed9").mkdir()  # unfinished: no eval.json, left out
    path = study.summarize("s")
    rows = study.load("s", path)
    assert [r["seed"] for r in rows] == [7, 8]
    r = rows[0]
    assert r["phases"]["after"]["greedy"]["won"] == "0111" and r["phases"]["after"]["greedy"]["success"] == 0.75
    assert r["phases"]["after_bc"]["sampled"]["episode_seed0"] == 107000
    assert [[r["vocab"][i] for i in acts] for acts in r["phases"]["after"]["sampled"]["actions"]][1] == [
        "turn left", "go forward"]
    assert r["wall_s"] == 120.0 and r["env_steps"] == 40 and r["curve"][-1] == [40, 0.5]
    # a later session without seed 8's run folder keeps its row
    import shutil

    shutil.rmtree(study.RUNS / "s" / "seed8")
    assert [r["seed"] for r in study.load("s", study.summarize("s"))] == [7, 8]
    text = study.table(rows, "after_bc")
    d, lo, hi = paired_bootstrap([0.25, 0.0])
    assert f"| sampled | 2 | 0.500 | 0.625 | {d:+.3f} [{lo:+.3f}, {hi:+.3f}] | 1 / 1 / 0 |" in text
    d, lo, hi = paired_bootstrap([0.25, -0.25])
    assert f"| greedy | 2 | 0.500 | 0.500 | {d:+.3f} [{lo:+.3f}, {hi:+.3f}] | 1 / 0 / 1 |" in text


def test_table_refuses_phases_on_different_episodes(study):
    rows = [{"seed": 1, "phases": {"after_bc": {"sampled": {"won": "01", "success": 0.5, "episode_seed0": 5}},
                                   "after": {"sampled": {"won": "11", "success": 1.0, "episode_seed0": 6}}}}]
    with pytest.raises(ValueError, match="same held-out episodes"):
        study.table(rows, "after_bc")


def test_run_command_resumes_from_a_checkpoint(study, tmp_path):
    out = tmp_path / "seed3"
    cmd = study._command("gotolocal-sft-rl", 3, out, ["--train-steps", "64"])
    assert cmd[2:6] == ["echorl_agent.cli", "train-llm", "--recipe", "gotolocal-sft-rl"] and "--resume" not in cmd
    cmd = study._command("gotolocal-sft-rl", 3, out, ["--init-from", "runs/studies/bc/seed{seed}"])
    assert cmd[-2:] == ["--init-from", "runs/studies/bc/seed3"]  # each seed starts from its own run
    (out / "bc_stage").mkdir(parents=True)  # cut during its BC warm start
    assert study._command("gotolocal-sft-rl", 3, out, [])[-1] == "--resume"
    (out / "bc_stage").rmdir()
    (out / "checkpoint").mkdir()
    assert study._command("gotolocal-sft-rl", 3, out, [])[-1] == "--resume"


def test_summary_keeps_rl_seconds_per_iteration_and_plot_reads_them(study, tmp_path):
    wins = {(p, m): "0110" for p in ("after_bc", "after") for m in ("sampled", "greedy")}
    for seed, secs in ((7, (10.0, 20.0)), (8, (30.0, 5.0))):
        folder = study.RUNS / "s" / f"seed{seed}"
        _run(folder, seed, wins)
        with open(folder / "gigpo.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["iteration", "timesteps", "success_rate", "rollout_s", "learner_s"])
            w.writerow([1, 100, 0.25, secs[0], secs[1]])
            w.writerow([2, 230, 0.5, secs[1], secs[0]])
        (folder / "bc.json").write_text(json.dumps({"losses": [1.0], "seconds": 60.0 * seed}))
    rows = study.load("s", study.summarize("s"))
    # seconds of RL accumulate rollouts + updates; BC's own seconds are kept beside them
    assert rows[0]["iterations"] == [[100, 0.25, 30.0], [230, 0.5, 60.0]] and rows[0]["bc_s"] == 420.0
    assert rows[1]["iterations"] == [[100, 0.25, 35.0], [230, 0.5, 70.0]] and rows[1]["bc_s"] == 480.0
    # env steps from 0; wall minutes from the seeds' mean BC time (RL's start) to the shorter run's end: 420 s of BC
    # + 60 s of RL for seed 7 (8.0 min), 480 + 70 s for seed 8
    start, grid, ys = study.panel(rows, "steps")
    assert (start, grid[0], grid[-1]) == (0.0, 0.0, 230.0) and ys.shape == (2, 100)
    assert ys[:, 0].tolist() == [0.25, 0.25] and ys[:, -1].tolist() == [0.5, 0.5]
    start, grid, ys = study.panel(rows, "wall")
    assert start == pytest.approx(7.5) and grid[0] == pytest.approx(7.5) and grid[-1] == pytest.approx(8.0)
    # at 7.5 min seed 7 is 30 s into RL (its first iteration ended at 7.5 min), seed 8 has not ended one: held back
    assert ys[:, 0].tolist() == [0.25, 0.25] and ys[:, -1].tolist() == [0.5, 0.25]
    png = study.plot(["s"], tmp_path / "fig.png")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_summary_without_iterations(study, tmp_path):
    _run(study.RUNS / "s" / "seed7", 7, {("after", "sampled"): "01"})
    study.summarize("s")
    with pytest.raises(SystemExit, match="no per-iteration rows"):
        study.plot(["s"], tmp_path / "fig.png")


def test_compare_pairs_two_studies_on_their_common_seeds(study):
    # the reference study's imitation start vs this study's on the same seeds and held-out episodes
    for seed, ref, new in ((7, "0011", "0111"), (8, "0101", "1101"), (9, "1111", "1111")):
        _run(study.RUNS / "ref" / f"seed{seed}", seed, {("after_bc", "greedy"): ref, ("after", "greedy"): ref})
        if seed != 9:  # seed 9 only in the reference: left out
            _run(study.RUNS / "new" / f"seed{seed}", seed, {("after_bc", "greedy"): new, ("after", "greedy"): new})
    study.summarize("ref")
    study.summarize("new")
    text = study.compare(study.load("new"), study.load("ref"), "after_bc", "after_bc")
    d, lo, hi = paired_bootstrap([0.25, 0.25])
    assert f"| greedy | 2 | 0.500 | 0.750 | {d:+.3f} [{lo:+.3f}, {hi:+.3f}] | 2 / 0 / 0 |" in text
    assert "sampled" not in text
    assert study.main(["compare", "--study", "new", "--reference", "ref", "--phase", "after_bc"]) == 0
    with pytest.raises(ValueError, match="no seed in both studies"):
        study.compare(study.load("new"), [r | {"seed": 99} for r in study.load("ref")], "after_bc", "after_bc")


def test_compare_refuses_different_held_out_episodes(study):
    _run(study.RUNS / "ref" / "seed7", 7, {("after_bc", "greedy"): "01"})
    _run(study.RUNS / "new" / "seed7", 7, {("after_bc", "greedy"): "011"})
    study.summarize("ref")
    study.summarize("new")
    with pytest.raises(ValueError, match="did not play the same held-out episodes"):
        study.compare(study.load("new"), study.load("ref"), "after_bc", "after_bc")


def test_levels_report_the_mean_over_seeds_with_its_bootstrap(study):
    for seed, won in ((7, "1110"), (8, "1111"), (9, "0110")):
        _run(study.RUNS / "s" / f"seed{seed}", seed, {("after", "sampled"): won})
    rows = study.load("s", study.summarize("s"))
    m, lo, hi = paired_bootstrap([0.75, 1.0, 0.5])
    text = study.levels(rows)
    assert f"| sampled | 3 | {m:.3f} [{lo:.3f}, {hi:.3f}] | 0.500 – 1.000 |" in text and "greedy" not in text
    assert m == pytest.approx(0.75) and lo < 0.75 < hi


def test_an_eval_llm_evaluation_summarizes_into_its_own_file(study):
    wins = {("after_bc", m): "0011" for m in ("sampled", "greedy")} | {("after", m): "0111" for m in ("sampled", "greedy")}
    _run(study.RUNS / "s" / "seed7", 7, wins)
    _run(study.RUNS / "s" / "seed8", 8, wins)
    seed7 = study.RUNS / "s" / "seed7"  # `echorl eval-llm --prefix eval_templates` on seed 7 only
    (seed7 / "eval_episodes.csv").rename(seed7 / "own.csv")
    _run(study.RUNS / "t" / "seed7", 7, {("after_bc", "greedy"): "1000", ("after", "greedy"): "1100"})
    (study.RUNS / "t" / "seed7" / "eval_episodes.csv").rename(seed7 / "eval_templates_episodes.csv")
    (seed7 / "own.csv").rename(seed7 / "eval_episodes.csv")
    path = study.summarize("s", prefix="eval_templates")
    assert path.name == "s-eval_templates.jsonl"
    rows = study.load("s", path)
    assert [r["seed"] for r in rows] == [7]
    assert {ph: set(v) for ph, v in rows[0]["phases"].items()} == {"after_bc": {"greedy"}, "after": {"greedy"}}
    assert [rows[0]["phases"][ph]["greedy"]["won"] for ph in ("after_bc", "after")] == ["1000", "1100"]
    assert study.load("s", study.summarize("s"))[0]["phases"]["after"]["sampled"]["won"] == "0111"  # its own, apart


def test_an_imitation_only_study_reads_no_training_effect_from_its_replayed_after(study, capsys):
    # a run without RL (curve.csv has no rows: no env steps) plays "after" again with the after_bc policy; the table
    # gives the after_bc level and says so, instead of an after - after_bc difference
    for seed, first, again in ((7, "0011", "0111"), (8, "0101", "1101")):
        folder = study.RUNS / "bc" / f"seed{seed}"
        _run(folder, seed, {("after_bc", "sampled"): first, ("after", "sampled"): again})
        (folder / "curve.csv").write_text("timesteps,success_rate,return_mean\n")
    rows = study.load("bc", study.summarize("bc"))
    assert not any(r["env_steps"] for r in rows)
    assert study.main(["table", "--study", "bc", "--start", "after_bc"]) == 0
    out = capsys.readouterr().out
    m, lo, hi = paired_bootstrap([0.5, 0.5])
    assert f"| sampled | 2 | {m:.3f} [{lo:.3f}, {hi:.3f}] | 0.500 – 0.500 |" in out
    assert "No RL ran" in out and "after − after_bc" not in out
