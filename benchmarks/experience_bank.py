"""Experience bank: success of a frozen agent as the bank grows (0 / 50 / 100 / 300 rollouts), Wilson 95% CIs.

Run:  .venv/bin/python benchmarks/experience_bank.py [--volumes 0 50 100 300] [--sb3-episodes 100]
                                                     [--llm-episodes 5] [--llm-max-steps 20] [--parts sb3 llm]

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
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from tabulate import tabulate

import echorl_envs  # noqa: F401
from echorl_agent.eval.report import wilson_interval
from echorl_agent.experience import (
    ExperienceBank,
    ExperienceConfig,
    ExperienceGuidedAgent,
    ResidualExperiencePolicy,
)

EVAL_SEED0 = 1_000_000


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


def ci(wins: int, n: int) -> str:
    lo, hi = wilson_interval(wins, n)
    return f"{wins / n:.2f} [{lo:.2f}, {hi:.2f}]"


def sb3_part(args, rollouts) -> list[list]:
    from stable_baselines3 import PPO

    from echorl_envs.wrappers import HashingEncoder, make_sb3_env

    enc = HashingEncoder(dim=256)
    vec = make_sb3_env(args.sb3_env, n_envs=2, seed=0, encoder=enc,
                       env_kwargs={"max_episode_steps": args.sb3_max_steps})
    t0 = time.perf_counter()
    model = PPO("MlpPolicy", vec, n_steps=256, batch_size=128, seed=0, verbose=0)
    model.learn(args.ppo_steps)
    train_s = time.perf_counter() - t0
    env = gym.make(args.sb3_env, max_episode_steps=args.sb3_max_steps)
    actions = env.reset(seed=0)[1]["admissible_actions"]
    rows = []
    variants = [(v, True) for v in args.volumes]
    variants += [(v, False) for v in args.volumes if v > 0 and args.ablation]
    for v, use in variants:
        bank = make_bank(rollouts, v)
        policy = ResidualExperiencePolicy(model, bank, enc, actions, seed=0, use_retrieval=use)
        t0 = time.perf_counter()
        losses = policy.fit(epochs=args.epochs)
        fit_s = time.perf_counter() - t0
        wins = 0
        t0 = time.perf_counter()
        for ep in range(args.sb3_episodes):
            obs, info = env.reset(seed=EVAL_SEED0 + ep)
            done = False
            while not done:
                obs, r, term, trunc, info = env.step(policy.act(obs, info))
                done = term or trunc
            wins += int(info["won"])
        n_succ = sum(r.success for r in bank.rollouts)
        label = "PPO (frozen) + residual head" + ("" if use else ", no retrieval (ablation)")
        rows.append([args.sb3_env.split("/")[1], label, v, n_succ, bank.num_steps,
                     ci(wins, args.sb3_episodes), f"{losses[-1]:.3f}" if losses else "-", f"{fit_s:.1f}",
                     f"{time.perf_counter() - t0:.1f}"])
        print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    print(f"(PPO trained {args.ppo_steps} steps in {train_s:.0f} s)", flush=True)
    return rows


def llm_part(args, rollouts) -> list[list]:
    from echorl_agent.llm.agents import ScoringAgent
    from echorl_agent.llm.engine import LLMEngine

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
                     sum(r.success for r in bank.rollouts), bank.num_steps, ci(wins, args.llm_episodes),
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
    args = ap.parse_args()
    torch.set_num_threads(1)
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
