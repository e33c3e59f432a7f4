"""Scoring a rollout step's candidates with their common tokens computed once vs once per candidate, alternating.

The rollout engine scores every admissible action of every env's state in one batched call
(:func:`~echorl_agent.llm.engine.scoring.score_batch`). ALFWorld's actions begin alike ("go to shelf 1", "go to
shelf 2", "go to sidetable 1", "take book 1 from ..."), and the engine now computes each distinct prefix of the
candidates' inputs once (a prefix tree, one batched forward per level) instead of every candidate's tokens on their
own. The baseline here is the per-candidate scoring it replaced (the tree with no shared prefixes, patched in). This
times :meth:`LLMPolicy.record_many` on the states of ``--envs`` envs in random episodes, both ways on the same
states (prompts already in the prefix cache, as in a rollout), and compares the policies: the largest log-probability
difference and the mean KL per state, next to the KL the old scoring shows when only the batch composition changes
(one state per call).

With ``--rollout GROUPS GROUP_SIZE MAX_STEPS`` it also times whole sampled rollouts (:func:`collect_groups`, env
steps included) both ways on the same seeds; in float32 both ways take the same actions.

Run: ``python benchmarks/candidate_tree.py`` (``--env``, ``--envs 16``, ``--prefill-dtype float32 int8``,
``--repeats 5``, ``--threads 1``, ``--rollout 4 4 30``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3.common.utils import ConstantSchedule  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401
from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_agent.llm.engine import scoring  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402
from echorl_agent.llm_rl.policy import LLMPolicy  # noqa: E402
from echorl_agent.llm_rl.rollout import collect_groups, make_choice_env  # noqa: E402

ENV_KWARGS = {"EchoRL/ALFWorld-PickAndPlace-v0": {"offer_help": False, "expert": False}}


def states(env_id: str, n: int, steps: int, seed: int) -> list[np.ndarray]:
    """The observations of ``n`` envs after ``steps`` uniformly random actions (env ``i`` on seed ``seed + i``)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        env = make_choice_env(env_id, history=0, max_episode_steps=50, env_kwargs=ENV_KWARGS.get(env_id))
        obs, info = env.reset(seed=seed + i)
        for _ in range(int(rng.integers(steps + 1))):
            obs, _, term, trunc, info = env.step(int(rng.integers(len(info["admissible_actions"]))))
            if term or trunc:
                obs, info = env.reset(seed=seed + 1000 + i)
        out.append(obs)
        env.close()
    return out


def per_candidate(enabled: bool):
    """The engine as it runs (``enabled``) or with no prefix shared between candidates (the old scoring)."""
    return nullcontext() if enabled else patch.object(scoring, "common_prefix_len", lambda a, b: 0)


def rollouts(lm: TrainableLM, env_id: str, groups: int, group_size: int, max_steps: int, repeats: int,
             seed: int) -> dict:
    """Whole rollouts (:func:`collect_groups`: ``groups`` x ``group_size`` envs, sampled actions) both ways,
    alternating, each repeat on new seeds and the same generator seed both ways; seconds per env step."""
    envs = [make_choice_env(env_id, history=0, max_episode_steps=max_steps, env_kwargs=ENV_KWARGS.get(env_id))
            for _ in range(groups * group_size)]
    pol = LLMPolicy(envs[0].observation_space, envs[0].action_space, ConstantSchedule(1e-4), lm=lm,
                    show_admissible=False)
    per_step: dict[bool, list[float]] = {False: [], True: []}
    same = True
    for i in range(repeats + 1):  # the first round warms the envs (game generation) and is not timed
        seeds = [seed + 100 * i + g for g in range(groups)]
        actions = {}
        for enabled in ((False, True) if i % 2 == 0 else (True, False)):
            pol.clear_store()
            with per_candidate(enabled):
                t = time.perf_counter()
                eps = collect_groups(pol, envs, seeds, group_size, torch.Generator().manual_seed(i))
                s = time.perf_counter() - t
            n = sum(len(e.steps) for e in eps)
            actions[enabled] = [[st.action for st in e.steps] for e in eps]
            if i:
                per_step[enabled].append(s / n)
        same &= actions[False] == actions[True]
    for env in envs:
        env.close()
    old, new = float(np.median(per_step[False])), float(np.median(per_step[True]))
    return {"s_per_step_old": old, "s_per_step_new": new, "speedup": old / new, "same_actions": same}


def mean_kl(p: list[torch.Tensor], q: list[torch.Tensor]) -> float:
    """Mean over states of KL(p || q) between the policies over each state's candidates (log-probabilities in)."""
    kls = [float((a.softmax(-1) * (a.log_softmax(-1) - b.log_softmax(-1))).sum()) for a, b in zip(p, q, strict=True)]
    return float(np.mean(kls))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", nargs="+", default=["EchoRL/ALFWorld-PickAndPlace-v0", "EchoRL/BabyAI-GoToLocal-v0"])
    ap.add_argument("--envs", type=int, default=16, help="states scored per call (one per env)")
    ap.add_argument("--steps", type=int, default=10, help="random steps before a state is taken (at most)")
    ap.add_argument("--prefill-dtype", nargs="+", default=["float32", "int8"], choices=("float32", "int8", "bfloat16"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollout", type=int, nargs=3, metavar=("GROUPS", "GROUP_SIZE", "MAX_STEPS"),
                    help="also time whole sampled rollouts (collect_groups) both ways, e.g. 4 4 30")
    ap.add_argument("--json", help="also append the rows to this JSONL file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    table, ro = [], []
    for dtype in args.prefill_dtype:
        lm = TrainableLM(LLMPolicyConfig(lora_rank=8, train_layers=2, max_kv_tokens=32768,
                                         engine_prefill_dtype=dtype))
        for env_id in args.env:
            rows = states(env_id, args.envs, args.steps, args.seed)
            env = make_choice_env(env_id, history=0, max_episode_steps=50, env_kwargs=ENV_KWARGS.get(env_id))
            pol = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-4), lm=lm,
                            show_admissible=False)
            stats = lm.engine.stats
            times: dict[bool, list[float]] = {False: [], True: []}
            computed: dict[bool, int] = {}
            lps = {}
            pol.record_many(rows)  # the prompts into the prefix cache, as after a rollout's first step
            for i in range(args.repeats):
                for enabled in ((False, True) if i % 2 == 0 else (True, False)):
                    pol.clear_store()
                    before = stats.num_computed_tokens
                    with per_candidate(enabled):
                        t = time.perf_counter()
                        recs = pol.record_many(rows)
                        times[enabled].append(time.perf_counter() - t)
                    computed[enabled] = stats.num_computed_tokens - before
                    lps[enabled] = [r.rollout_logp for r in recs]
            diff = max(float((a - b).abs().max()) for a, b in zip(lps[False], lps[True], strict=True))
            kl = mean_kl(lps[False], lps[True])
            # the reference for that shift: the old scoring with another batch composition (one state per call);
            # float32 is batch-invariant to rounding, int8 prefill is not (its activation codes round differently)
            with per_candidate(False):
                pol.clear_store()
                alone = [pol.record_many([r])[0].rollout_logp for r in rows]
            kl_alone = mean_kl(lps[False], alone)
            n_cands = float(np.mean([len(r.cands) for r in recs]))
            old, new = float(np.median(times[False])), float(np.median(times[True]))
            row = {"env": env_id, "prefill": dtype, "envs": args.envs, "candidates": n_cands,
                   "tokens_per_state_old": computed[False] / args.envs, "tokens_per_state_new": computed[True] / args.envs,
                   "s_old": old, "s_new": new, "speedup": old / new, "max_dlogp": diff,
                   "kl_tree": kl, "kl_one_state_per_call": kl_alone, "threads": args.threads,
                   "cpu": cpu_name()}
            table.append([env_id.split("/")[-1], dtype, f"{n_cands:.1f}", f"{row['tokens_per_state_old']:.0f}",
                          f"{row['tokens_per_state_new']:.0f}", f"{old:.3f}", f"{new:.3f}", f"{old / new:.2f}x",
                          f"{diff:.1e}", f"{kl:.1e}", f"{kl_alone:.1e}"])
            if args.rollout:
                r = rollouts(lm, env_id, *args.rollout, args.repeats, args.seed + 5000)
                row["rollout"] = r
                ro.append([env_id.split("/")[-1], dtype, f"{r['s_per_step_old']:.3f}", f"{r['s_per_step_new']:.3f}",
                           f"{r['speedup']:.2f}x", r["same_actions"]])
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
            env.close()
    print(f"{args.envs} states per call, prompts cached, {args.threads} thread(s), median of {args.repeats}, "
          f"{cpu_name()}")
    print(tabulate(table, headers=["env", "prefill", "candidates per state", "tokens computed per state, per candidate",
                                   "with the tree", "per candidate s", "tree s", "speed-up", "max |dlog pi|",
                                   "KL per state, tree", "KL per state, one state per call"],
                   tablefmt="github"))
    if ro:
        g, k, m = args.rollout
        print(f"\nWhole rollouts: {g} groups x {k} envs, up to {m} steps, sampled, median of {args.repeats}")
        print(tabulate(ro, headers=["env", "prefill", "per candidate s / env step", "tree s / env step", "speed-up",
                                    "same actions"], tablefmt="github"))


if __name__ == "__main__":
    main()
