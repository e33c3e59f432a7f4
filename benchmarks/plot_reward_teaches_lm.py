"""Figure for the README: success vs env steps of RL on the LM, mean and 95% CI over seeds, per study.

Left: MiniGrid-Empty-Random-5x5, GiGPO from the pretrained SmolLM2 (``benchmarks/llm_rl_learning.py``, registered
study §5): the rolling training success of each seed's ``curve.csv`` on a common env-step grid, and the held-out
evaluation of frozen and GiGPO (both modes) as points with CIs over seeds. Right: single-turn GRPO on Arithmetic
(``benchmarks/llm_rl_grpo.py``, §6): the training group reward per step (one env step = one judged completion) and
the held-out success (the env's judge) of the start (pretrained, or SFT) and after GRPO in both modes. Third:
BabyAI-GoToLocal (§7): GiGPO from the pretrained LM and from BC on 2 demonstrations, with the held-out evaluation of
frozen, BC, GiGPO and BC + GiGPO. Fourth: ALFWorld-PickAndPlace (§9): GiGPO from BC on 8 demonstrations, with
frozen and BC. Fifth and sixth: BabyAI-GoToLocal from BC on 2 demonstrations (§10, ``benchmarks/gigpo_signal.py``):
the probe (mean probability of the expert's action and the share of states where it is the argmax, on 64 fixed
held-out states) after every GiGPO iteration with the held-out success before and after, and each iteration's
advantage alignment with the expert's actions. Seventh and eighth: the same probe for GiGPO with centred advantages,
8 groups x 4, one epoch, from BC-2 (§12) and from the pretrained LM (§13). Ninth: §12's recipe with the env's goal line
(§14). Tenth: §10's recipe for three times the env steps (§11). Eleventh: episode-level GRPO for 12k env steps with
int8 prefill and the goal line (§16). Twelfth: ALFWorld-PickAndPlace, BC on 16 demonstrations + positive-only
GiGPO for 12k env steps (§17), with frozen and BC. Thirteenth: §16's recipe on 20 fresh seeds (§18). Fourteenth:
BC-2 + PPO with a critic for 12k env steps on the same task (§20), with BC. Fifteenth: ALFWorld-PickAndPlace, BC on 16
demonstrations + PPO with a critic for 12k env steps (§21), with BC. Sixteenth: ALFWorld-PickAndPlace on four games,
BC on 4 demonstrations + PPO and + GiGPO at lr 1e-4 for 4,096 env steps (§24), with frozen (§25) and BC.
Seventeenth: ALFWorld-PickAndPlace, BC on 16 demonstrations + PPO at lr 1e-4 for 12k env steps (§23), with BC. The
ALFWorld panels' held-out points are on the training games (unseen-game rows, §19, §22, §23 (b), are left out). The
number of seeds each method has is in the legend (a probe panel counts only finished seeds).

Run: ``python benchmarks/plot_reward_teaches_lm.py`` (reads the committed results -- the studies' summaries and run
folders' curves, ``benchmarks/summarize_study.py`` -- and writes ``docs/figures/reward_teaches_lm.png``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.summarize_study import load_rows, load_seed_jsons  # noqa: E402
from echorl_agent.eval.stats import paired_bootstrap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def mean_ci(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-wise mean and 95% percentile-bootstrap CI over rows (seeds)."""
    stats = np.array([paired_bootstrap(col) for col in values.T])
    return stats[:, 0], stats[:, 1], stats[:, 2]


def on_grid(steps: list[float], values: list[float], grid: np.ndarray) -> np.ndarray:
    """A step function (the last value at or before each grid point; the first value before it starts)."""
    idx = np.searchsorted(np.asarray(steps), grid, side="right") - 1
    return np.asarray(values)[np.clip(idx, 0, len(values) - 1)]


def group_rl_panel(ax, folder: Path, title: str, trained: tuple[str, ...] = ("gigpo",),
                   starts: tuple[str, ...] = ("frozen",), colors: dict[str, str] | None = None) -> None:
    """Rolling training success of each ``trained`` method (mean and CI over its finished seeds: those with rows in
    ``episodes.jsonl``) and the held-out evaluation of every method in ``starts + trained`` (both modes, on the
    training options: rows tagged ``eval_env_kwargs`` are left out) as points with CIs over seeds; ``colors`` maps
    each method to its colour (default: C0, C1, ... in that order)."""
    colors = colors or {m: f"C{i}" for i, m in enumerate(starts + trained)}
    episodes = load_rows(folder)  # episodes.jsonl, else the study's committed summary
    finished = {f"{e['method']}-seed{e['seed']}" for e in episodes}  # a run's rows are written when it has finished
    x_end = 0.0
    for method in trained:
        curves = []
        for f in sorted(folder.glob(f"{method}-seed*/curve.csv")):
            rows = list(csv.DictReader(f.open()))
            if rows and f.parent.name in finished:  # also rules out another method's folders that the glob matches
                curves.append(([float(r["timesteps"]) for r in rows], [float(r["success_rate"]) for r in rows]))
        if not curves:
            continue
        grid = np.linspace(16, min(c[0][-1] for c in curves), 40)
        x_end = max(x_end, grid[-1])
        m, lo, hi = mean_ci(np.stack([on_grid(s, v, grid) for s, v in curves]))
        ax.plot(grid, m, color=colors[method], label=f"{method} training (rolling, sampled), {len(curves)} seeds")
        ax.fill_between(grid, lo, hi, color=colors[method], alpha=0.2)
    if x_end == 0:
        ax.set_title(f"{title}: no finished {', '.join(trained)} run yet", fontsize=9)
        return
    evals: dict[tuple[str, str], dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for e in episodes:
        # not a run's "none" marker, and not rows played on other held-out options (e.g. §22's unseen games)
        if e["method"] in colors and e["mode"] in ("stochastic", "deterministic") and not e.get("eval_env_kwargs"):
            evals[(e["method"], e["mode"])][e["seed"]].append(bool(e["won"]))
    dx = x_end / 80
    for (method, mode), by_seed in sorted(evals.items()):
        per_seed = [np.mean(w) for w in by_seed.values()]
        mu, a, b = paired_bootstrap(per_seed)
        x = (0 if method in starts else x_end) + (starts + trained).index(method) * dx
        x += dx / 2 if mode == "deterministic" else -dx / 2
        ax.errorbar([x], [mu], yerr=[[mu - a], [b - mu]], fmt="o" if mode == "stochastic" else "s", capsize=3,
                    color=colors[method], label=f"{method} held-out, {mode} ({len(per_seed)} seeds)")
    ax.set_xlabel("env steps (training)")
    ax.set_ylabel("success")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)


def grpo_panel(ax, folder: Path) -> None:
    runs = load_seed_jsons(folder)
    if not runs:
        ax.set_title(f"no GRPO runs in {folder}")
        return
    per_step = runs[0]["config"]["prompts"] * runs[0]["config"]["group"]
    n = min(len(r["history"]) for r in runs)
    rewards = np.array([[h["reward_mean"] for h in r["history"][:n]] for r in runs])
    steps = np.arange(1, n + 1) * per_step
    m, lo, hi = mean_ci(rewards)
    ax.plot(steps, m, color="C1", label=f"GRPO training group reward (sampled), {len(runs)} seeds")
    ax.fill_between(steps, lo, hi, color="C1", alpha=0.2)
    start = "sft" if "sft" in runs[0]["wins"] else "pretrained"
    dx = per_step * n / 60
    for stage, x, color in ((start, 0, "C0"), ("grpo", steps[-1], "C1")):
        for mode, off, fmt in (("greedy", dx, "s"), ("sampled", -dx, "o")):
            mu, a, b = paired_bootstrap([np.mean(r["wins"][stage][mode]) for r in runs])
            ax.errorbar([x + off], [mu], yerr=[[mu - a], [b - mu]], fmt=fmt, capsize=3, color=color,
                        label=f"{stage} held-out, {mode}")
    ax.set_xlabel("env steps (judged completions)")
    ax.set_ylabel("success")
    ax.set_title(f"Arithmetic (one-digit, 200 held-out tasks): GRPO from the {start} LM", fontsize=9)
    ax.legend(fontsize=6)


def _signal_runs(path: Path, label: str) -> dict[int, list[dict]]:
    """The finished seeds of one ``gigpo_signal.py`` recipe: seed -> its rows (iterations and episodes)."""
    rows = load_rows(path)
    done = {r["seed"] for r in rows if r.get("kind") == "done" and r["label"] == label}
    return {s: [r for r in rows if r["seed"] == s and r["label"] == label] for s in sorted(done)}


def probe_panel(ax, path: Path, label: str, title: str, start: str = "BC-2") -> None:
    """§10/§12/§13: probe p(expert) and argmax = expert vs env steps (mean and CI over seeds), held-out success
    before (x = 0, the start) and after (x = the end) in both modes."""
    runs = _signal_runs(path, label)
    if not runs:
        ax.set_title(f"no finished seeds of {label!r} in {path.name} yet", fontsize=9)
        return
    its = {s: sorted((r for r in rows if r["kind"] == "iteration"), key=lambda r: r["iteration"])
           for s, rows in runs.items()}
    grid = np.linspace(0, min(v[-1]["timesteps"] for v in its.values()), 40)
    for key, color, name in (("probe_p_expert", "C2", "probe: p(expert action)"),
                             ("probe_top_expert", "C4", "probe: argmax = expert")):
        m, lo, hi = mean_ci(np.stack([on_grid([r["timesteps"] for r in v], [r[key] for r in v], grid)
                                      for v in its.values()]))
        ax.plot(grid, m, color=color, label=f"{name}, {len(its)} seeds")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.2)
    dx = grid[-1] / 60
    for phase, x, color in (("before", 0.0, "C0"), ("after", grid[-1], "C1")):
        for mode, off, fmt in (("stochastic", -dx, "o"), ("deterministic", dx, "s")):
            per_seed = [np.mean([r["won"] for r in rows if r["kind"] == "episode" and r["phase"] == phase
                                 and r["mode"] == mode]) for rows in runs.values()]
            mu, a, b = paired_bootstrap(per_seed)
            name = start if phase == "before" else f"{start} + GiGPO"
            ax.errorbar([x + off], [mu], yerr=[[mu - a], [b - mu]], fmt=fmt, capsize=3, color=color,
                        label=f"{name} held-out success, {mode}")
    ax.set_xlabel("env steps (GiGPO training)")
    ax.set_ylabel("probability / success")
    ax.set_title(f"{title}: the probe ({len(runs)} seeds)", fontsize=9)
    ax.legend(fontsize=6)


def alignment_panel(ax, path: Path, label: str) -> None:
    """§10: each iteration's advantage alignment with the expert (iterations with no signal are left out)."""
    runs = _signal_runs(path, label)
    pts = [(r["timesteps"], r["alignment"]) for rows in runs.values() for r in rows
           if r["kind"] == "iteration" and r.get("n_expert", 0) + r.get("n_other", 0) > 0]
    if not pts:
        ax.set_title(f"no iterations with signal of {label!r} in {path.name}", fontsize=9)
        return
    x, y = np.array(pts).T
    n_it = sum(1 for rows in runs.values() for r in rows if r["kind"] == "iteration" and r["iteration"] > 0)
    ax.scatter(x, y, s=10, color="C3", label=f"{len(pts)} of {n_it} iterations had signal ({len(runs)} seeds)")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_ylim(-1, 1)
    ax.set_xlabel("env steps (GiGPO training)")
    ax.set_ylabel("sum A*s / sum |A|  (s = +1 expert action, -1 other)")
    ax.set_title("§10: do the advantages favour the expert's actions?", fontsize=9)
    ax.legend(fontsize=6)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gigpo", default=str(ROOT / "benchmarks/results/llm_rl_gigpo_s930"))
    ap.add_argument("--grpo", default=str(ROOT / "benchmarks/results/llm_rl_grpo_s940"))
    ap.add_argument("--gotolocal", default=str(ROOT / "benchmarks/results/llm_rl_gotolocal_s950"))
    ap.add_argument("--alfworld", default=str(ROOT / "benchmarks/results/llm_rl_alfworld_s970"))
    ap.add_argument("--signal", default=str(ROOT / "benchmarks/results/gigpo_signal_s980.jsonl"))
    ap.add_argument("--signal-label", default="s10")
    ap.add_argument("--centred", default=str(ROOT / "benchmarks/results/gigpo_signal_s1010.jsonl"),
                    help="§12's rows (label s12)")
    ap.add_argument("--pretrained", default=str(ROOT / "benchmarks/results/gigpo_signal_s1020.jsonl"),
                    help="§13's rows (label s13)")
    ap.add_argument("--goal-line", default=str(ROOT / "benchmarks/results/gigpo_signal_s1030.jsonl"),
                    help="§14's rows (label s14)")
    ap.add_argument("--long", default=str(ROOT / "benchmarks/results/gigpo_signal_s990.jsonl"),
                    help="§11's rows (label s11)")
    ap.add_argument("--grpo12k", default=str(ROOT / "benchmarks/results/gigpo_signal_s1050.jsonl"),
                    help="§16's rows (label s16)")
    ap.add_argument("--alfworld17", default=str(ROOT / "benchmarks/results/llm_rl_alfworld_s1060"), help="§17's runs")
    ap.add_argument("--repeat", default=str(ROOT / "benchmarks/results/gigpo_signal_s1070.jsonl"),
                    help="§18's rows (label s18)")
    ap.add_argument("--ppo", default=str(ROOT / "benchmarks/results/llm_rl_gotolocal_s1070"), help="§20's runs")
    ap.add_argument("--alfworld-ppo", default=str(ROOT / "benchmarks/results/llm_rl_alfworld_s1110"), help="§21's runs")
    ap.add_argument("--alfworld-ppo-lr", default=str(ROOT / "benchmarks/results/llm_rl_alfworld_s1140"),
                    help="§23's runs")
    ap.add_argument("--alfworld4", default=str(ROOT / "benchmarks/results/llm_rl_alfworld4_s1150"), help="§24's runs")
    ap.add_argument("--from-pretrained", default=str(ROOT / "benchmarks/results/gigpo_signal_s1200.jsonl"),
                    help="§26's rows (label s26)")
    ap.add_argument("--out", default=str(ROOT / "docs/figures/reward_teaches_lm.png"))
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(6, 3, figsize=(19, 26.4))
    axes = axes.ravel()
    group_rl_panel(axes[0], Path(args.gigpo), "MiniGrid-Empty-Random-5x5: GiGPO from the pretrained LM (§5)")
    grpo_panel(axes[1], Path(args.grpo))
    group_rl_panel(axes[2], Path(args.gotolocal), "BabyAI-GoToLocal, 24-step budget (§7)",
                   trained=("gigpo", "bc+gigpo"), starts=("frozen", "bc"))
    group_rl_panel(axes[3], Path(args.alfworld), "ALFWorld-PickAndPlace, 30-step budget, BC on 8 demos (§9)",
                   trained=("bc+gigpo",), starts=("frozen", "bc"))
    probe_panel(axes[4], Path(args.signal), args.signal_label, "BabyAI-GoToLocal, BC on 2 demos + GiGPO (§10)")
    alignment_panel(axes[5], Path(args.signal), args.signal_label)
    probe_panel(axes[6], Path(args.centred), "s12", "GoToLocal, BC-2 + GiGPO centred, 8x4 (§12)")
    probe_panel(axes[7], Path(args.pretrained), "s13", "GoToLocal, frozen + GiGPO centred, 8x4 (§13)", start="frozen")
    probe_panel(axes[8], Path(args.goal_line), "s14", "GoToLocal with the goal line, BC-2 + GiGPO centred, 8x4 (§14)")
    probe_panel(axes[9], Path(args.long), "s11", "GoToLocal, BC-2 + GiGPO 2x4, ~4,700 env steps (§11)")
    probe_panel(axes[10], Path(args.grpo12k), "s16",
                "GoToLocal with the goal line, BC-2 + episode GRPO 8x4, 12k env steps, int8 (§16)")
    group_rl_panel(axes[11], Path(args.alfworld17),
                   "ALFWorld-PickAndPlace, BC on 16 demos + positive-only GiGPO, 12k env steps (§17)",
                   trained=("bc+gigpo",), starts=("frozen", "bc"))
    probe_panel(axes[12], Path(args.repeat), "s18",
                "GoToLocal + goal line, §16's recipe, 20 fresh seeds (§18)")
    group_rl_panel(axes[13], Path(args.ppo), "GoToLocal + goal line, BC-2 + PPO (critic), 12k (§20)",
                   trained=("bc+ppo",), starts=("bc",))
    group_rl_panel(axes[14], Path(args.alfworld_ppo), "ALFWorld-PickAndPlace, BC-16 + PPO (critic), 12k (§21)",
                   trained=("bc+ppo",), starts=("bc",))
    group_rl_panel(axes[15], Path(args.alfworld4),
                   "ALFWorld-PickAndPlace, 4 games, BC-4 + PPO / + GiGPO, lr 1e-4, 4k (§24; frozen §25)",
                   trained=("bc+ppo", "bc+gigpo"), starts=("frozen", "bc"))
    group_rl_panel(axes[16], Path(args.alfworld_ppo_lr),
                   "ALFWorld-PickAndPlace, BC-16 + PPO (critic), lr 1e-4, 12k (§23)", trained=("bc+ppo",),
                   starts=("bc",))
    probe_panel(axes[17], Path(args.from_pretrained), "s26",
                "GoToLocal + goal line, pretrained + GRPO (§18 recipe), 12k (§26)", start="frozen")
    save_figure(fig, "Reward teaches the LM (SmolLM2-135M, LoRA r=8 top 2 layers, CPU): mean and 95% CI over seeds",
                args.out, dpi=90)  # 18 panels: at 90 dpi the PNG stays under git's 1 MB rule


def save_figure(fig, title: str, out: str | Path, dpi: int = 110) -> None:
    """Title, tighten and write a README figure (creating its folder); prints the path."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # room for the suptitle above the top row's titles
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    print(out)


if __name__ == "__main__":
    main()
