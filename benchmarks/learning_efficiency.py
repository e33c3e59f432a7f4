"""Learning efficiency: env steps to reach a target success rate, EchoPPO ÷ PPO, on text MiniGrid/BabyAI.

For every (env, seed) both algorithms train with the same wrappers, PPO hyperparameters, network widths and
seed; ``steps`` is the number of env steps at which the success rate over the last ``--window`` episodes
first reaches the env's target (runs that never reach it are censored at the budget and counted as the
budget, which favours the slower algorithm -- the table says how many were censored). The ratio is
mean(EchoPPO steps) / mean(PPO steps) with a 95% percentile-bootstrap confidence interval over seeds
(resampling seeds jointly, 10 000 resamples), plus the mean of per-seed ratios.

Usage:
    .venv/bin/python benchmarks/learning_efficiency.py                # 5 seeds, 2 envs, 2 processes
    .venv/bin/python benchmarks/learning_efficiency.py --seeds 3 --quick
    # confirmation on seeds fixed before looking (issue 13): 15 fresh seeds 500..514, GoToLocal
    .venv/bin/python benchmarks/learning_efficiency.py --envs gotolocal --first-seed 500 --seeds 15 \
        --out benchmarks/results/learning_efficiency_gotolocal_s500.csv
    # pool several per-run CSVs (no training): one CI over every seed in them
    .venv/bin/python benchmarks/learning_efficiency.py --pool benchmarks/results/learning_efficiency*.csv

Latent-planning sweep (issue 13 item 7). An arm is ``KIND[:key=value]...`` with KIND one of ``PPO``,
``EchoPPO``, ``EchoPPO-noKL`` (lambda_KL = 0) and ``PPO-window`` (stock SB3 PPO whose features are
``[s_t, F_phi body(window)]`` -- the same window through the same trajectory encoder as EchoPPO, no plan, no KL;
:class:`echorl_agent.policies.WindowFeaturesExtractor`), and keys ``kl`` (lambda_KL), ``d`` (plan dimension),
``k`` (window: the env's ``history``; PPO's stacked frames too) and ``enc`` (mlp / gru / transformer). Keys left
at the defaults (k=3, d=16, kl=0.01, enc=mlp) are dropped from the name, so ``EchoPPO`` is the original arm and
old CSVs pool with new ones. ``--sweep`` runs the one-factor-at-a-time grid ``SWEEP`` around the defaults.
Seeds fixed before any sweep run (written here first, commit on branch wt-eval): tuning 300..304, confirmation
600..609. Selection rule: the EchoPPO config with the lowest mean steps to target on the tuning seeds.
    .venv/bin/python benchmarks/learning_efficiency.py --envs gotolocal --sweep --first-seed 300 --seeds 5 \
        --workers 1 --out benchmarks/results/learning_efficiency_sweep_s300.csv
    .venv/bin/python benchmarks/learning_efficiency.py --pool benchmarks/results/learning_efficiency_sweep_s300.csv
    .venv/bin/python benchmarks/learning_efficiency.py --pool FILE.csv --reference PPO-window  # arm ÷ PPO-window
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate


@dataclass(frozen=True)
class Task:
    env_id: str
    max_episode_steps: int
    target: float
    budget: int


TASKS = {
    # Success = reach the goal within 20 steps (TimeLimit); a uniformly random policy succeeds ~15% of the time.
    "empty": Task("EchoRL/MiniGrid-Empty-5x5-v0", 20, 0.9, 16_384),
    # BabyAI GoToLocal (language-conditioned: "go to the green ball" among 8 distractors), its own 64-step limit.
    "gotolocal": Task("EchoRL/BabyAI-GoToLocal-v0", 64, 0.6, 32_768),
}


ARM_KINDS = ("PPO", "EchoPPO", "EchoPPO-noKL", "PPO-window")
ARM_KEYS = {"PPO": ("k",), "EchoPPO": ("k", "d", "kl", "enc"), "EchoPPO-noKL": ("k", "d", "enc"),
            "PPO-window": ("k", "enc")}
ENCODERS = ("mlp", "gru", "transformer")


@dataclass(frozen=True)
class Arm:
    """One training configuration; ``name`` is its canonical spelling (the CSV's ``algo`` column)."""

    kind: str
    k: int = 3
    d: int = 16
    kl: float = 0.01
    enc: str = "mlp"

    @classmethod
    def parse(cls, spec: str) -> Arm:
        """``"EchoPPO:kl=0.1:d=64"`` → ``Arm``; ``EchoPPO:kl=0`` is ``EchoPPO-noKL``."""
        kind, *pairs = spec.split(":")
        if kind not in ARM_KINDS:
            raise ValueError(f"arm kind must be one of {ARM_KINDS}, got {kind!r} in arm={spec!r}")
        values: dict = {"kl": 0.0} if kind == "EchoPPO-noKL" else {}
        for pair in pairs:
            key, _, val = pair.partition("=")
            if key not in ARM_KEYS[kind]:
                raise ValueError(f"arm key must be one of {ARM_KEYS[kind]} for {kind}, got {key!r} in arm={spec!r}")
            values[key] = val if key == "enc" else (float(val) if key == "kl" else int(val))
        arm = cls(kind, **values)
        if arm.kind == "EchoPPO" and arm.kl == 0.0:
            arm = cls("EchoPPO-noKL", **{**values, "kl": 0.0})
        if arm.enc not in ENCODERS or arm.k < 0 or arm.d < 1 or arm.kl < 0:
            raise ValueError(f"bad arm {spec!r}: enc in {ENCODERS}, k >= 0, d >= 1, kl >= 0")
        return arm

    @property
    def name(self) -> str:
        default = Arm(self.kind, kl=0.0 if self.kind == "EchoPPO-noKL" else 0.01)
        parts = [self.kind]
        for key in ARM_KEYS[self.kind]:
            val = getattr(self, key)
            if val != getattr(default, key):
                parts.append(f"{key}={val:g}" if key == "kl" else f"{key}={val}")
        return ":".join(parts)


# One factor at a time around the defaults (EchoRL leaves lambda_KL, d, k and F_phi open), plus PPO-window.
SWEEP = ["PPO", "EchoPPO", "EchoPPO-noKL", "EchoPPO:kl=0.001", "EchoPPO:kl=0.1", "EchoPPO:d=4", "EchoPPO:d=64",
         "EchoPPO:k=1", "EchoPPO:k=7", "EchoPPO:enc=gru", "EchoPPO:enc=transformer", "PPO-window"]


def build_model(arm: Arm, vec, seed: int):
    """The SB3 model of ``arm`` on ``vec``; every arm shares the PPO hyperparameters and the [64, 64] heads."""
    from stable_baselines3 import PPO

    from echorl_agent import EchoPPO
    from echorl_agent.config import PlanningConfig
    from echorl_agent.policies import WindowFeaturesExtractor

    common = dict(n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3, ent_coef=0.01, seed=seed, verbose=0)
    if arm.kind == "PPO":
        # PPO sees the same stacked window (flattened by MlpPolicy).
        return PPO("MlpPolicy", vec, policy_kwargs={"net_arch": [64, 64]}, **common)
    planning = PlanningConfig(encoder=arm.enc, encoder_arch=[128], latent_dim=arm.d, kl_coef=arm.kl)
    if arm.kind == "PPO-window":
        # Stock PPO reading [s_t, F_phi body(window)]: EchoPPO's encoder without the plan (no Gaussian, no KL).
        return PPO("MlpPolicy", vec, policy_kwargs={
            "net_arch": [64, 64], "features_extractor_class": WindowFeaturesExtractor,
            "features_extractor_kwargs": {"planning": planning}}, **common)
    # "EchoPPO" (any kl/d/k/enc) or the ablation "EchoPPO-noKL" (same policy, lambda_KL = 0)
    return EchoPPO("EchoPolicy", vec, policy_kwargs={"net_arch": [64, 64], "planning": planning}, **common)


def run_one(job: tuple[str, str, int, bool]) -> dict:
    """Train one arm on one env with one seed; returns steps-to-target and curve summary."""
    name, algo, seed, quick = job
    import torch

    torch.set_num_threads(1)
    from echorl_agent.callbacks import LearningCurveCallback
    from echorl_envs.wrappers import make_sb3_env

    task = TASKS[name]
    arm = Arm.parse(algo)
    budget = task.budget // 4 if quick else task.budget
    vec = make_sb3_env(task.env_id, n_envs=8, seed=1000 * seed, history=arm.k, encoder_kwargs={"dim": 128},
                       env_kwargs={"max_episode_steps": task.max_episode_steps})
    model = build_model(arm, vec, seed)
    cb = LearningCurveCallback(target_success=task.target, window=50, stop_at_target=True)
    t0 = time.perf_counter()
    model.learn(budget, callback=cb)
    secs = time.perf_counter() - t0
    reached = cb.steps_to_target is not None
    return {
        "env": name, "algo": algo, "seed": seed, "steps": cb.steps_to_target if reached else budget,
        "reached": reached, "budget": budget, "episodes": len(cb.episodes), "final_success": cb.success_rate(),
        "seconds": secs,
    }


def bootstrap_ratio(echo: np.ndarray, ppo: np.ndarray, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap CI of mean(echo) / mean(ppo), resampling seeds jointly."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(echo), size=(n, len(echo)))
    ratios = echo[idx].mean(1) / ppo[idx].mean(1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed+seeds-1")
    ap.add_argument("--pool", nargs="+", metavar="CSV", help="no training: summarise these per-run CSVs together")
    ap.add_argument("--envs", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--arms", nargs="+", default=["PPO", "EchoPPO"], metavar="ARM",
                    help="KIND[:key=value]... (see the module docstring); PPO is always run (the baseline); "
                         "EchoPPO-noKL ablates the plan-consistency KL, PPO-window the plan")
    ap.add_argument("--sweep", action="store_true", help="run the arms of SWEEP (overrides --arms)")
    ap.add_argument("--reference", default="PPO", metavar="ARM",
                    help="the arm the others are divided by in the summary (default PPO)")
    ap.add_argument("--quick", action="store_true", help="quarter budgets (smoke run)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "learning_efficiency.csv"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    if args.pool:
        rows = _read_rows(args.pool)
        envs = [e for e in TASKS if any(r["env"] == e for r in rows)]
        ref = Arm.parse(args.reference).name
        arms = [ref, *dict.fromkeys(r["algo"] for r in rows if r["algo"] != ref)]
        print(summary_table(rows, envs, arms))
        seeds = sorted({r["seed"] for r in rows})
        print(f"\npooled {len(rows)} runs from {len(args.pool)} files, {len(seeds)} seeds: {seeds}")
        return
    names = [Arm.parse(a).name for a in (SWEEP if args.sweep else args.arms)]
    ref = Arm.parse(args.reference).name
    arms = [ref, *dict.fromkeys(a for a in ["PPO", *names] if a != ref)]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Rows are appended as runs finish, so an interrupted study keeps its runs; rerunning resumes (runs are
    # deterministic, so a run already in the file is not repeated).
    rows = [r for r in _read_rows([str(out)]) if r["seed"] in seeds] if out.exists() else []
    have = {(r["env"], r["algo"], r["seed"]) for r in rows}
    jobs = [(e, a, s, args.quick) for e in args.envs for s in seeds for a in arms if (e, a, s) not in have]
    from concurrent.futures import as_completed

    from tqdm import tqdm

    fields = ["env", "algo", "seed", "steps", "reached", "budget", "episodes", "final_success", "seconds"]
    new_file = not out.exists()
    with ProcessPoolExecutor(args.workers) as pool, out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new_file:
            w.writeheader()
        futs = [pool.submit(run_one, j) for j in jobs]
        for fut in tqdm(as_completed(futs), total=len(futs), desc="runs"):
            row = fut.result()
            w.writerow(row)
            f.flush()
            rows.append(row)
    print(summary_table(rows, args.envs, arms))
    print(f"\n{len(jobs)} runs, seeds {seeds.start}..{seeds.stop - 1}, wall {time.perf_counter() - t0:.0f} s; "
          f"per-run rows in {out}")


def _read_rows(paths: list[str]) -> list[dict]:
    """Per-run rows of several CSVs; a (env, algo, seed) run present twice must agree (it is deterministic)."""
    seen: dict[tuple, dict] = {}
    for p in paths:
        with open(p, newline="") as f:
            for r in csv.DictReader(f):
                row = {**r, "seed": int(r["seed"]), "steps": int(r["steps"]), "reached": r["reached"] == "True",
                       "seconds": float(r["seconds"])}
                key = (row["env"], row["algo"], row["seed"])
                if key in seen and seen[key]["steps"] != row["steps"]:
                    raise ValueError(f"run {key} appears twice with different steps ({seen[key]['steps']} vs "
                                     f"{row['steps']}); pool files from the same code version")
                seen[key] = row
    return list(seen.values())


def summary_table(rows: list[dict], envs: list[str], arms: list[str]) -> str:
    """Arm ÷ reference (``arms[0]``, PPO by default) per env, bootstrap CI over the seeds both ran (paired)."""
    table = []
    ref = arms[0]
    for e in envs:
        task = TASKS[e]
        for arm in arms[1:]:
            by = {(r["algo"], r["seed"]): r for r in rows if r["env"] == e}
            common = sorted(s for (a, s) in by if a == arm and (ref, s) in by)
            if not common:
                continue

            def get(algo: str, key: str, common: list[int] = common, by: dict = by) -> np.ndarray:
                return np.array([by[(algo, s)][key] for s in common], dtype=float)

            ppo, echo = get(ref, "steps"), get(arm, "steps")
            lo, hi = bootstrap_ratio(echo, ppo)
            table.append([
                f"{task.env_id} (success>={task.target:.0%} over 50 ep)", arm,
                f"{ppo.mean():,.0f} ± {ppo.std(ddof=1):,.0f} ({int(get(ref, 'reached').sum())}/{len(ppo)})",
                f"{echo.mean():,.0f} ± {echo.std(ddof=1):,.0f} ({int(get(arm, 'reached').sum())}/{len(echo)})",
                f"{echo.mean() / ppo.mean():.2f} [{lo:.2f}, {hi:.2f}]",
                f"{np.mean(echo / ppo):.2f}",
                f"{get(ref, 'seconds').mean():.0f} / {get(arm, 'seconds').mean():.0f}",
                f"{int((echo < ppo).sum())}/{len(common)}",
            ])
    headers = ["env (target)", "arm", f"{ref} steps (reached)", "arm steps (reached)", f"arm ÷ {ref} [95% CI]",
               "mean per-seed ratio", f"s/run {ref} / arm", "seeds arm faster"]
    return tabulate(table, headers=headers, tablefmt="github")


if __name__ == "__main__":
    main()
