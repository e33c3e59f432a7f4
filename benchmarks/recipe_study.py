"""A pre-registered study of one ``echorl train-llm`` recipe over seeds: run the seeds, summarize them, print the table.

Every learning result is runnable as ``echorl train-llm --recipe NAME``; this script only runs that command once per
registered seed (``--jobs`` at a time, one torch thread each), resumes a seed from its checkpoint, and reduces the
run folders to one compact summary that git keeps (``benchmarks/results/<study>.jsonl``, one row per seed):

* ``phases``: per phase (``before`` = the pretrained LM, ``after_bc`` = the imitation start, ``after``) and mode
  (sampled, greedy): success, mean return, the per-episode wins as a ``"0110..."`` string in held-out episode order,
  steps, and every episode's actions as codes into the row's ``vocab`` (so trajectories can be read back);
* ``curve``: the run's ``curve.csv`` thinned to at most 200 points (env steps, rolling training success), with the
  wall seconds of the run (``wall_s``) and the env steps it used;
* ``iterations``: per RL iteration (the method's ``<method>.csv``, e.g. ``gigpo.csv``) the env steps, the
  iteration's training success and the seconds of RL so far (rollouts + updates), and ``bc_s`` (seconds of the BC
  warm start, from ``bc.json``, where the run wrote it): the x axes of ``plot``.

``table`` prints the per-seed points, the mean success after RL over seeds with its bootstrap (``levels``), and
the table that pairs each seed's phases on the same held-out episodes, reporting, per mode, the mean over seeds of the
start and the end, and the mean per-seed difference with its 95% percentile bootstrap over **seeds**
(:func:`~echorl_agent.eval.stats.paired_bootstrap`, 10,000 resamples, seed 0), plus the seeds better / tied / worse.
The registered rule reads that interval (see ``docs/studies/protocol.md``).

Run (the study pages quote the exact lines)::

    python benchmarks/recipe_study.py run --study NAME --recipe gotolocal-sft-rl --seeds 1300 1301 --jobs 2 \\
        -- --bc-episodes 32 --train-steps 6144 --eval-episodes 40
    python benchmarks/recipe_study.py summarize --study NAME          # runs/studies/NAME -> benchmarks/results/NAME.jsonl
    python benchmarks/recipe_study.py table --study NAME [--start after_bc]
    python benchmarks/recipe_study.py compare --study NAME --reference OTHER --phase after_bc  # same seeds, two studies
    python benchmarks/recipe_study.py plot --study NAME [NAME ...] --out docs/figures/NAME.png
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "studies"
RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("before", "after_bc", "after")
MODES = ("sampled", "greedy")
CURVE_POINTS = 200


def run_folder(study: str, seed: int) -> Path:
    return RUNS / study / f"seed{seed}"


def _command(recipe: str, seed: int, out: Path, extra: list[str]) -> list[str]:
    """The seed's ``train-llm`` command; ``{seed}`` in a flag after ``--`` becomes the seed (``--init-from
    runs/studies/OTHER/seed{seed}``: each seed starts from its own run of another study)."""
    extra = [a.replace("{seed}", str(seed)) for a in extra]
    cmd = [sys.executable, "-m", "echorl_agent.cli", "train-llm", "--recipe", recipe, "--seed", str(seed),
           "--out", str(out), "--checkpoint-every", "1", "--quiet", *extra]
    from echorl_agent.llm_rl.checkpoint import BC_STAGE, has_checkpoint

    if has_checkpoint(out) or has_checkpoint(out, BC_STAGE):  # cut in RL, or during its BC warm start
        cmd.append("--resume")
    return cmd


def run(study: str, recipe: str, seeds: list[int], jobs: int, extra: list[str]) -> int:
    """Run every seed not finished yet (no ``eval.json`` with an ``after`` phase), ``jobs`` at a time."""
    todo = [s for s in seeds if not _finished(run_folder(study, s))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: list[tuple[int, subprocess.Popen, float]] = []
    failed = 0
    while todo or running:
        while todo and len(running) < jobs:
            seed = todo.pop(0)
            out = run_folder(study, seed)
            out.mkdir(parents=True, exist_ok=True)
            cmd = _command(recipe, seed, out, extra)
            (out / "command.txt").write_text(shlex.join(cmd[1:]) + "\n")  # quoted: a JSON flag pastes back whole
            log = open(out / "train.log", "a")
            running.append((seed, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                            time.time()))
            print(f"seed {seed}: started ({shlex.join(cmd[3:])})", flush=True)
        time.sleep(5)
        for item in list(running):
            seed, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode == 0:
                (run_folder(study, seed) / "wall_s.txt").write_text(f"{time.time() - t0:.1f}\n")
            else:
                failed += 1
            print(f"seed {seed}: exit {proc.returncode} after {time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


def _finished(folder: Path) -> bool:
    path = folder / "eval.json"
    return path.is_file() and "after" in json.loads(path.read_text())


def summarize_seed(folder: Path, seed: int, prefix: str = "eval") -> dict:
    """One seed's compact row (see the module docstring); ``prefix``: the held-out files it reads
    (``<prefix>_episodes.csv``: ``eval`` the run's own, another an ``echorl eval-llm --prefix`` evaluation)."""
    from echorl_agent.eval.runner import cpu_name
    from echorl_agent.llm_rl.heldout import read_episodes

    episodes = read_episodes(folder / f"{prefix}_episodes.csv")
    code: dict[str, int] = {}
    phases: dict[str, dict] = {}
    for phase in PHASES:
        for mode in MODES:
            eps = sorted((e for e in episodes if e.phase == phase and e.mode == mode), key=lambda e: e.seed)
            if not eps:
                continue
            for e in eps:
                for t in e.actions:
                    code.setdefault(t, len(code))
            won = "".join("1" if e.won else "0" for e in eps)
            phases.setdefault(phase, {})[mode] = {
                "success": won.count("1") / len(won), "won": won,
                "return_mean": round(sum(e.ret for e in eps) / len(eps), 4), "episode_seed0": eps[0].seed,
                "steps": [e.steps for e in eps], "actions": [[code[t] for t in e.actions] for e in eps]}
    vocab = sorted(code, key=code.get)
    curve = []
    if (folder / "curve.csv").is_file():
        with open(folder / "curve.csv", newline="") as f:
            train = [r for r in csv.DictReader(f) if r["success_rate"] != ""]
        stride = max(1, len(train) // CURVE_POINTS)
        curve = [[int(r["timesteps"]), round(float(r["success_rate"]), 4)] for r in train[::stride]]
        if train and curve[-1][0] != int(train[-1]["timesteps"]):
            curve.append([int(train[-1]["timesteps"]), round(float(train[-1]["success_rate"]), 4)])
    iterations = _iterations(folder)
    bc = json.loads((folder / "bc.json").read_text()) if (folder / "bc.json").is_file() else {}
    wall = folder / "wall_s.txt"
    cmd = folder / "command.txt"
    return {"seed": seed, "command": cmd.read_text().strip() if cmd.is_file() else None,
            "wall_s": float(wall.read_text()) if wall.is_file() else None, "cpu": cpu_name(),
            "env_steps": curve[-1][0] if curve else None, "phases": phases, "vocab": vocab, "curve": curve,
            "iterations": iterations, "bc_s": bc.get("seconds")}


ITERATION_FILES = ("gigpo.csv",)  # the GiGPO family (gigpo, bc+gigpo, grpo-by-episode recipes)


def _iterations(folder: Path) -> list[list[float]]:
    """``[[env steps, training success of the iteration, seconds of RL so far], ...]`` from the run's per-iteration
    file (the first of :data:`ITERATION_FILES` it has; rollouts + updates, no BC and no held-out evaluation);
    [] when it has none."""
    for name in ITERATION_FILES:
        path = folder / name
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("timesteps")]
        out, total = [], 0.0
        for r in rows:
            total += float(r.get("rollout_s") or 0) + float(r.get("learner_s") or 0)
            out.append([int(float(r["timesteps"])), round(float(r["success_rate"]), 4), round(total, 1)])
        return out
    return []


def summarize(study: str, out: Path | None = None, prefix: str = "eval") -> Path:
    """Write the summary of every finished seed under ``runs/studies/<study>``; rows already in the summary for seeds
    whose run folder is gone (a study that spans sessions) are kept. ``prefix`` other than ``eval``: the seeds'
    ``echorl eval-llm --prefix`` evaluations instead (into ``<study>-<prefix>.jsonl`` by default)."""
    folders = sorted(p for p in (RUNS / study).glob("seed*")
                     if _finished(p) and (prefix == "eval" or (p / f"{prefix}_episodes.csv").is_file()))
    out = out or RESULTS / (f"{study}.jsonl" if prefix == "eval" else f"{study}-{prefix}.jsonl")
    rows = {r["seed"]: r for r in load(study, out)} if out.is_file() else {}
    rows.update({int(p.name[4:]): summarize_seed(p, int(p.name[4:]), prefix) for p in folders})
    if not rows:
        raise SystemExit(f"no finished run under {RUNS / study} (a run is finished when its eval.json has 'after')"
                         + ("" if prefix == "eval" else f" with {prefix}_episodes.csv"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for seed in sorted(rows):
            f.write(json.dumps(rows[seed], separators=(",", ":")) + "\n")
    print(f"{out}: {len(rows)} seeds ({len(folders)} from run folders), {out.stat().st_size / 1e3:.0f} KB")
    return out


def load(study: str, path: Path | None = None) -> list[dict]:
    path = path or RESULTS / f"{study}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(rows: list[dict], start: str, end: str = "after") -> str:
    """Per mode: mean success at ``start`` and ``end`` over seeds, the per-seed paired difference with its bootstrap
    over seeds, and seeds better / tied / worse."""
    return _paired_table([(r["seed"], r["phases"].get(start, {}), r["phases"].get(end, {})) for r in rows],
                         start, end)


def levels(rows: list[dict], phase: str = "after") -> str:
    """Per mode: the mean over seeds of held-out success at ``phase`` with its 95% percentile bootstrap over seeds,
    and the seeds' range (a study whose rule reads a level, not a difference)."""
    from echorl_agent.eval.stats import paired_bootstrap

    lines = [f"| mode | seeds | {phase}: mean (95% CI over seeds) | min – max |", "|---|---|---|---|"]
    for mode in MODES:
        v = [r["phases"][phase][mode]["success"] for r in rows if mode in r["phases"].get(phase, {})]
        if v:
            m, lo, hi = paired_bootstrap(v)
            lines.append(f"| {mode} | {len(v)} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {min(v):.3f} – {max(v):.3f} |")
    return "\n".join(lines)


def compare(rows: list[dict], reference: list[dict], phase: str, ref_phase: str) -> str:
    """The same paired table across two studies run on the same seeds: ``phase`` of this study's row vs
    ``ref_phase`` of the reference study's row for each seed both have (e.g. a recipe change against the study whose
    seeds it reuses). The two must have played the same held-out episodes."""
    ref = {r["seed"]: r for r in reference}
    common = [r for r in rows if r["seed"] in ref]
    if not common:
        raise ValueError(f"no seed in both studies: {sorted(r['seed'] for r in rows)} vs {sorted(ref)}")
    return _paired_table([(r["seed"], ref[r["seed"]]["phases"].get(ref_phase, {}), r["phases"].get(phase, {}))
                          for r in common], f"reference {ref_phase}", phase)


def _paired_table(pairs: list[tuple[int, dict, dict]], start: str, end: str) -> str:
    from echorl_agent.eval.stats import paired_bootstrap

    lines = [f"| mode | seeds | {start} | {end} | {end} − {start} (95% CI over seeds) | seeds + / = / − |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        diffs, a, b = [], [], []
        for seed, first, last in pairs:
            s, e = first.get(mode), last.get(mode)
            if not s or not e:
                continue
            if s["episode_seed0"] != e["episode_seed0"] or len(s["won"]) != len(e["won"]):
                raise ValueError(f"seed {seed}: {start} and {end} did not play the same held-out episodes")
            pairs_ = list(zip(s["won"], e["won"], strict=True))
            diffs.append(sum(int(y) - int(x) for x, y in pairs_) / len(pairs_))
            a.append(s["success"])
            b.append(e["success"])
        if not diffs:
            continue
        d, lo, hi = paired_bootstrap(diffs)
        sign = (sum(x > 0 for x in diffs), sum(x == 0 for x in diffs), sum(x < 0 for x in diffs))
        lines.append(f"| {mode} | {len(diffs)} | {sum(a) / len(a):.3f} | {sum(b) / len(b):.3f} | "
                     f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] | {sign[0]} / {sign[1]} / {sign[2]} |")
    return "\n".join(lines)


def per_seed(rows: list[dict]) -> str:
    head = "| seed | " + " | ".join(f"{p} {m[0]}" for p in PHASES for m in MODES) + " | env steps | wall min |"
    out = [head, "|" + "---|" * (len(PHASES) * len(MODES) + 3)]
    for r in rows:
        cells = [f"{r['phases'][p][m]['success']:.3f}" if m in r["phases"].get(p, {}) else "–"
                 for p in PHASES for m in MODES]
        wall = f"{r['wall_s'] / 60:.0f}" if r.get("wall_s") else "–"
        out.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {r.get('env_steps') or '–'} | {wall} |")
    return "\n".join(out)


def panel(rows: list[dict], x: str) -> tuple:
    """One panel's curves: ``(start, grid, ys)``, the training success of every seed (``ys[seed]``) on a common grid
    of 100 points, held from each iteration to the next. ``x="steps"``: env steps of RL, from 0 to the shortest
    run's last iteration; ``x="wall"``: minutes since the run began (BC's seconds, then RL's rollouts and updates),
    from the seeds' mean BC time (``start``, where RL begins) to the shortest run's end."""
    import numpy as np

    if x not in ("steps", "wall"):
        raise ValueError(f"x must be 'steps' or 'wall', got x={x!r}")
    xs = [np.array([it[0] for it in r["iterations"]], dtype=float) if x == "steps" else
          (np.array([it[2] for it in r["iterations"]], dtype=float) + (r.get("bc_s") or 0)) / 60 for r in rows]
    start = float(np.mean([(r.get("bc_s") or 0) / 60 for r in rows])) if x == "wall" else 0.0
    grid = np.linspace(start, min(v[-1] for v in xs), 100)
    ys = []
    for v, r in zip(xs, rows, strict=True):
        y = np.array([it[1] for it in r["iterations"]])
        ys.append(y[np.clip(np.searchsorted(v, grid, side="right") - 1, 0, len(y) - 1)])
    return start, grid, np.array(ys)


def plot(studies: list[str], out: Path, labels: list[str] | None = None) -> Path:
    """Training success vs env steps and vs wall minutes (BC + RL's rollouts and updates, no held-out evaluation),
    mean over seeds with the seeds' range, one line per study; the held-out success at the start of RL and after it
    (sampled o, greedy s) beside each panel's end. Reads only the committed summaries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colors = plt.get_cmap("tab10").colors
    for k, study in enumerate(studies):
        rows = [r for r in load(study) if r.get("iterations")]
        if not rows:
            raise SystemExit(f"{study}: no per-iteration rows in its summary (re-run summarize from its run folders)")
        c, label = colors[k % 10], (labels[k] if labels else study) + f" ({len(rows)} seeds)"
        for ax, x in zip(axes, ("steps", "wall"), strict=True):
            start, grid, ys = panel(rows, x)
            ax.plot(grid, ys.mean(0), color=c, label=label)
            ax.fill_between(grid, ys.min(0), ys.max(0), color=c, alpha=0.15, linewidth=0)
            for phase, xpos in (("after_bc", start), ("after", grid[-1])):
                for mode, marker in (("sampled", "o"), ("greedy", "s")):
                    v = [r["phases"][phase][mode]["success"] for r in rows if mode in r["phases"].get(phase, {})]
                    if v:
                        ax.plot([xpos], [np.mean(v)], marker=marker, color=c, markerfacecolor="white"
                                if phase == "after_bc" else c, linestyle="none")
    axes[0].set_xlabel("env steps of RL")
    axes[1].set_xlabel("wall minutes of the run (BC + RL, held-out evaluation left out)")
    axes[0].set_ylabel("success (line: training iterations; markers: held-out)")
    axes[0].set_ylim(0, 1.02)
    axes[0].legend(loc="lower right", fontsize=8, title="o sampled, s greedy; hollow = start of RL", title_fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the registered seeds (resumes; skips finished ones); flags after -- go to train-llm")
    r.add_argument("--study", required=True)
    r.add_argument("--recipe", required=True)
    r.add_argument("--seeds", type=int, nargs="+", required=True)
    r.add_argument("--jobs", type=int, default=2)
    s = sub.add_parser("summarize", help="run folders -> benchmarks/results/<study>.jsonl")
    s.add_argument("--study", required=True)
    s.add_argument("--out", type=Path)
    s.add_argument("--prefix", default="eval",
                   help="the held-out files to read: eval (the runs' own) or an `echorl eval-llm --prefix` name")
    t = sub.add_parser("table", help="the outcome tables from the summary")
    t.add_argument("--study", required=True)
    t.add_argument("--summary", type=Path)
    t.add_argument("--start", default="after_bc", choices=PHASES)
    c = sub.add_parser("compare", help="one study's phase vs another study's on the seeds both ran (paired table)")
    c.add_argument("--study", required=True)
    c.add_argument("--reference", required=True, help="the study whose seeds and held-out episodes this one reuses")
    c.add_argument("--phase", default="after", choices=PHASES, help="this study's phase (default: after)")
    c.add_argument("--reference-phase", choices=PHASES, help="the reference's phase (default: --phase)")
    g = sub.add_parser("plot", help="success vs env steps and vs wall minutes from the summaries (a PNG)")
    g.add_argument("--study", nargs="+", required=True)
    g.add_argument("--label", nargs="+", help="legend names, one per --study (default: the study names)")
    g.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "run":
        if args.jobs < 1:
            p.error(f"--jobs must be >= 1, got {args.jobs}")
        return run(args.study, args.recipe, args.seeds, args.jobs, extra)
    if args.cmd == "plot":
        if args.label and len(args.label) != len(args.study):
            p.error(f"--label needs one name per --study: {len(args.label)} labels for {len(args.study)} studies")
        plot(args.study, args.out, args.label)
        return 0
    if args.cmd == "summarize":
        summarize(args.study, args.out, args.prefix)
        return 0
    if args.cmd == "compare":
        print(compare(load(args.study), load(args.reference), args.phase, args.reference_phase or args.phase))
        return 0
    rows = load(args.study, args.summary)
    print(per_seed(rows))
    print()
    if not any(r.get("env_steps") for r in rows):  # imitation only: "after" replays the after_bc policy
        print(levels(rows, args.start))
        print(f"\nNo RL ran (no env steps): 'after' is a second play of the {args.start} policy (the same in greedy, "
              "a fresh draw in sampled), so after - start is no training effect.")
        return 0
    print(levels(rows))
    print()
    print(table(rows, args.start))
    if args.start != "before" and any("before" in r["phases"] for r in rows):
        print()
        print(table(rows, "before"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
