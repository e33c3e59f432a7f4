"""Experience bank: success of a frozen agent as the bank grows (0 / 50 / 100 / 300 rollouts), Wilson 95% CIs.

Run:  .venv/bin/python benchmarks/experience_bank.py [--volumes 0 50 100 300] [--sb3-episodes 100]
                                                     [--llm-episodes 5] [--llm-max-steps 20] [--parts sb3 llm]
      [--parts sb3 --first-seed 800 --seeds 15 --out FILE.jsonl]   (seed study: see below)

The bank is filled with rollouts of an epsilon-expert (``--epsilon`` of the actions uniform, the rest the env's
expert), successes and failures alike, on env seeds disjoint from the evaluation seeds; each volume is a prefix
of the same rollout sequence. Evaluation seeds are the same for every volume; the bank does not grow during
evaluation (so each row measures one volume).

* **sb3**: a PPO policy trained for ``--ppo-steps`` on ``--sb3-env`` and then frozen; at volume v a residual head
  (:class:`ResidualExperiencePolicy`) is fitted on the bank's successful steps and the frozen policy + head acts
  greedily. Volume 0 is the frozen policy itself (nothing retrieved, zero-initialised head). The ablation rows
  fit the same head with a zero retrieval prior (behaviour cloning on the bank's successes over frozen logits),
  separating what retrieval adds from what the head learns from the data alone.
* **llm**: SmolLM2-135M :class:`ScoringAgent` (weights frozen, sampling at temperature 1) wrapped in
  :class:`ExperienceGuidedAgent`: the retrieved step (observation, action, what happened next, outcome) is appended
  to each observation in the prompt. Volume 0 = no guidance.

With ``--seeds N`` the sb3 part becomes a seed study (docs/studies/experience-bank-gotolocal.md): for each seed s of
``first_seed .. first_seed + N - 1`` the PPO training seed, the head seed, the bank's env seeds
(:func:`bank_seed0`) and the evaluation env seeds (:func:`eval_seed0`) all derive from s; one JSON line per
(seed, volume, retrieval) with per-episode wins goes to ``--out`` (a rerun skips rows already there); then pooled
success per row and paired differences (300 − 0, retrieval − ablation) with 95% bootstrap CIs over seeds.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tabulate import tabulate

import echorl_envs  # noqa: F401
from echorl_agent.agents import ExperienceGuidedAgent
from echorl_agent.eval.stats import bootstrap_text, read_jsonl, success_text
from echorl_agent.experience import (
    ExperienceBank,
    ExperienceConfig,
    ResidualExperiencePolicy,
)

EVAL_SEED0 = 1_000_000
SEED_STRIDE = 10_000  # env seeds per study seed: the bank uses the first 300, evaluation starts at EVAL_SEED0


def bank_seed0(seed: int) -> int:
    """First env seed of study seed ``seed``'s bank rollouts (seed 0 reproduces the one-run table)."""
    return SEED_STRIDE * seed


def eval_seed0(seed: int) -> int:
    """First evaluation env seed of study seed ``seed`` (disjoint from every bank seed while seeds < 100)."""
    return EVAL_SEED0 + SEED_STRIDE * seed


def fill_bank(env_id: str, n: int, epsilon: float, max_steps: int, seed: int = 0, **bank_kw) -> list[tuple]:
    """``n`` epsilon-expert rollouts (instruction, steps, success) on seeds seed..seed+n-1."""
    env = gym.make(env_id, max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        obs, info = env.reset(seed=seed + i)
        steps, done = [], False
        while not done:
            adm = info["admissible_actions"]
            a = info.get("expert_action") if rng.random() >= epsilon else None
            a = a if a is not None else adm[int(rng.integers(len(adm)))]
            nxt, r, term, trunc, info = env.step(a)
            steps.append((obs, a, nxt, r))
            obs, done = nxt, term or trunc
        out.append((info["task"], steps, bool(info["won"])))
    env.close()
    return out


def make_bank(rollouts: list[tuple], volume: int, **kw) -> ExperienceBank:
    bank = ExperienceBank("hash", ExperienceConfig(top_n=16, top_k=5), dim=512)
    for instr, steps, won in rollouts[:volume]:
        bank.add_rollout(instr, steps, won)
    return bank


def sb3_runs(args, rollouts, seed: int = 0, skip: set[tuple[int, bool]] = frozenset()) -> list[dict]:
    """Train PPO (seed ``seed``), freeze it, fit a head per (volume, retrieval) and evaluate it greedily."""
    from stable_baselines3 import PPO

    from echorl_envs.wrappers import HashingEncoder, make_sb3_env

    variants = [(v, True) for v in args.volumes]
    variants += [(v, False) for v in args.volumes if v > 0 and args.ablation]
    variants = [x for x in variants if x not in skip]
    if not variants:
        return []
    enc = HashingEncoder(dim=256)
    vec = make_sb3_env(args.sb3_env, n_envs=2, seed=seed, encoder=enc,
                       env_kwargs={"max_episode_steps": args.sb3_max_steps})
    t0 = time.perf_counter()
    model = PPO("MlpPolicy", vec, n_steps=256, batch_size=128, seed=seed, verbose=0)
    model.learn(args.ppo_steps)
    train_s = time.perf_counter() - t0
    env = gym.make(args.sb3_env, max_episode_steps=args.sb3_max_steps)
    actions = env.reset(seed=0)[1]["admissible_actions"]
    out = []
    for v, use in variants:
        bank = make_bank(rollouts, v)
        policy = ResidualExperiencePolicy(model, bank, enc, actions, seed=seed, use_retrieval=use)
        t0 = time.perf_counter()
        losses = policy.fit(epochs=args.epochs)
        fit_s = time.perf_counter() - t0
        won = []
        t0 = time.perf_counter()
        for ep in range(args.sb3_episodes):
            obs, info = env.reset(seed=eval_seed0(seed) + ep)
            done = False
            while not done:
                obs, r, term, trunc, info = env.step(policy.act(obs, info))
                done = term or trunc
            won.append(bool(info["won"]))
        out.append({"seed": seed, "volume": v, "retrieval": use, "won": won, "env": args.sb3_env,
                    "bank_successful": sum(r.success for r in bank.rollouts), "bank_steps": bank.num_steps,
                    "fit_loss": losses[-1] if losses else None, "fit_s": fit_s,
                    "eval_s": time.perf_counter() - t0, "ppo_steps": args.ppo_steps, "ppo_train_s": train_s})
    env.close()
    vec.close()
    return out


def sb3_part(args, rollouts) -> list[list]:
    rows = []
    for r in sb3_runs(args, rollouts):
        label = "PPO (frozen) + residual head" + ("" if r["retrieval"] else ", no retrieval (ablation)")
        rows.append([args.sb3_env.split("/")[1], label, r["volume"], r["bank_successful"], r["bank_steps"],
                     success_text(sum(r["won"]), len(r["won"])), "-" if r["fit_loss"] is None else f"{r['fit_loss']:.3f}",
                     f"{r['fit_s']:.1f}", f"{r['eval_s']:.1f}"])
        print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    return rows


def seed_study(args) -> list[dict]:
    """The sb3 part once per study seed, appending one JSON line per (seed, volume, retrieval) to ``args.out``."""
    out = Path(args.out)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        skip = {(r["volume"], r["retrieval"]) for r in read_jsonl(out) if r["seed"] == seed}
        t0 = time.perf_counter()
        rollouts = fill_bank(args.sb3_env, max(args.volumes), args.epsilon, args.sb3_max_steps, seed=bank_seed0(seed))
        runs = sb3_runs(args, rollouts, seed=seed, skip=skip)
        with out.open("a") as f:
            for r in runs:
                f.write(json.dumps(r) + "\n")
        print(f"seed {seed}: " + ", ".join(f"v{r['volume']}{'' if r['retrieval'] else '-abl'} "
                                          f"{sum(r['won'])}/{len(r['won'])}" for r in runs)
              + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return read_jsonl(out)


def seed_summary(rows: list[dict]) -> str:
    """Pooled success per row and paired differences, 95% bootstrap over the seeds that have both rows."""
    by = {(r["seed"], r["volume"], r["retrieval"]): r for r in rows}
    keys = sorted({(v, u) for _, v, u in by}, key=lambda k: (k[0], not k[1]))
    seeds = sorted({s for s, _, _ in by})
    table = []
    for v, u in keys:
        ss = [s for s in seeds if (s, v, u) in by]
        won = [w for s in ss for w in by[s, v, u]["won"]]
        table.append([f"bank {v}" + ("" if u else ", no retrieval (ablation)"), len(ss), len(won),
                      bootstrap_text([float(np.mean(by[s, v, u]["won"])) for s in ss]),
                      success_text(sum(won), len(won), digits=3)])
    diffs = []
    top = max(v for v, _ in keys)
    pairs = [(f"bank {top} - bank 0 (retrieval)", (top, True), (0, True))]
    pairs += [(f"retrieval - ablation at bank {v}", (v, True), (v, False)) for v, u in keys if v > 0 and not u]
    for name, a, b in pairs:
        ss = [s for s in seeds if (s, *a) in by and (s, *b) in by]
        if ss:
            d = [float(np.mean(by[(s, *a)]["won"]) - np.mean(by[(s, *b)]["won"])) for s in ss]
            diffs.append([name, len(ss), bootstrap_text(d, signed=True), f"{sum(x > 0 for x in d)}/{sum(x < 0 for x in d)}"])
    return (tabulate(table, ["row", "seeds", "episodes", "success [95% CI over seeds]",
                             "success [Wilson 95%, episodes]"], tablefmt="github") + "\n\n"
            + tabulate(diffs, ["paired difference", "seeds", "mean [95% CI over seeds]", "seeds up/down"],
                       tablefmt="github"))


def llm_part(args, rollouts) -> list[list]:
    from echorl_agent.agents.chat import ScoringAgent
    from echorl_agent.llm import LLMEngine

    engine = LLMEngine("smollm2-135m")
    env = gym.make(args.llm_env, max_episode_steps=args.llm_max_steps)
    rows = []
    for v in args.volumes:
        bank = make_bank(rollouts, v)
        wins, steps = 0, 0
        t0 = time.perf_counter()
        for ep in range(args.llm_episodes):
            seed = EVAL_SEED0 + ep
            inner = ScoringAgent(engine, temperature=1.0, seed=seed)
            agent = ExperienceGuidedAgent(inner, bank, grow=False, guide=v > 0)
            obs, info = env.reset(seed=seed)
            agent.reset(args.llm_env, obs, info, seed)
            done = False
            while not done:
                a = agent.act(obs, info)
                obs, r, term, trunc, info = env.step(a)
                done = term or trunc
                agent.observe(a, obs, r, done, info)
                steps += 1
            wins += int(info["won"])
        rows.append([args.llm_env.split("/")[1], "SmolLM2 scoring (frozen) + prompt guidance", v,
                     sum(r.success for r in bank.rollouts), bank.num_steps, success_text(wins, args.llm_episodes),
                     steps, f"{time.perf_counter() - t0:.0f}"])
        print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--volumes", type=int, nargs="+", default=[0, 50, 100, 300])
    ap.add_argument("--parts", nargs="+", default=["sb3", "llm"], choices=["sb3", "llm"])
    ap.add_argument("--epsilon", type=float, default=0.3, help="random-action share of the bank's behaviour")
    ap.add_argument("--sb3-env", default="EchoRL/BabyAI-GoToLocal-v0")
    ap.add_argument("--sb3-max-steps", type=int, default=64)
    ap.add_argument("--sb3-episodes", type=int, default=100)
    ap.add_argument("--ppo-steps", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--ablation", type=int, default=1, help="1: also fit heads with a zero retrieval prior")
    ap.add_argument("--llm-env", default="EchoRL/MiniGrid-Empty-5x5-v0")
    ap.add_argument("--llm-max-steps", type=int, default=20)
    ap.add_argument("--llm-episodes", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=800, help="seed study (sb3 part): first seed")
    ap.add_argument("--seeds", type=int, default=0, help="seed study over this many seeds (0: the one-run table)")
    ap.add_argument("--out", default="benchmarks/results/experience_bank_seeds.jsonl", help="seed study: JSON lines")
    args = ap.parse_args()
    if args.seeds < 0:
        raise ValueError(f"--seeds must be >= 0, got --seeds {args.seeds}")
    torch.set_num_threads(1)
    if args.seeds:
        if args.parts != ["sb3"]:
            raise ValueError(f"--seeds runs the sb3 part only, got --parts {' '.join(args.parts)}; pass --parts sb3")
        rows = seed_study(args)
        print(f"\n## Seed study: frozen PPO + residual head, {args.sb3_env}\n")
        print(seed_summary(rows))
        return
    head = ["env", "agent", "bank rollouts", "successful", "bank steps", "success [95% CI]"]
    if "sb3" in args.parts:
        t0 = time.perf_counter()
        rollouts = fill_bank(args.sb3_env, max(args.volumes), args.epsilon, args.sb3_max_steps)
        print(f"bank source: {len(rollouts)} rollouts in {time.perf_counter() - t0:.0f} s, "
              f"{sum(r[2] for r in rollouts)} successful", flush=True)
        rows = sb3_part(args, rollouts)
        print("\n## Frozen SB3 policy + residual head\n")
        print(tabulate(rows, head + ["final fit loss", "fit s", "eval s"], tablefmt="github"))
    if "llm" in args.parts:
        rollouts = fill_bank(args.llm_env, max(args.volumes), args.epsilon, args.llm_max_steps)
        print(f"bank source: {len(rollouts)} rollouts, {sum(r[2] for r in rollouts)} successful", flush=True)
        rows = llm_part(args, rollouts)
        print("\n## Frozen LLM agent + retrieved step in the prompt\n")
        print(tabulate(rows, head + ["env steps", "wall s"], tablefmt="github"))


if __name__ == "__main__":
    main()
