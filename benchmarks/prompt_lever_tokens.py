"""Tokens the rollout engine prefills per env step under each prompt lever, on the same GoToLocal states.

The loop benchmark (``llm_rl_loop_speed.py --loops recipe-gotolocal-rl recipe-gotolocal-rl-lean``) runs each recipe's
own rollouts, so its two loops visit different states (a lever changes the policy's scores, hence its samples, hence
how often a group's episodes repeat a state the prefix cache holds). Here one policy with gotolocal-rl's settings
(the pretrained LM) plays ``--groups`` groups of ``--group-size`` episodes, as one GiGPO iteration does (one batched
engine call per step for all active envs), and every variant then scores exactly those batches, in the same order,
from an empty prefix cache: the difference is the lever's alone. Token counts are deterministic for a seed (they do
not depend on the machine's speed or load).

Run: ``python benchmarks/prompt_lever_tokens.py --groups 2 --seed 65``.
"""

from __future__ import annotations

import argparse
import json
import os

VARIANTS = {
    "gotolocal-rl": {},
    "candidate_end_token=False": {"candidate_end_token": False},
    "drop_task_lines=True": {"drop_task_lines": True},
    "gotolocal-rl-lean": {"candidate_end_token": False, "drop_task_lines": True},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=65)
    ap.add_argument("--out", default=None, help="append one JSON row per variant to this file")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    from stable_baselines3.common.utils import ConstantSchedule

    import echorl_envs  # noqa: F401
    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_agent.llm_rl.recipes import load_recipe
    from echorl_agent.llm_rl.rollout import collect_groups, make_choice_env

    cfg = load_recipe("gotolocal-rl").config
    policy_kw = dict(cfg["policy_kwargs"])
    n = args.groups * args.group_size
    envs = [make_choice_env(cfg["env_id"], cfg["history"], cfg["max_episode_steps"], cfg["env_kwargs"])
            for _ in range(n)]
    base = LLMPolicy(envs[0].observation_space, envs[0].action_space, ConstantSchedule(1e-3), **policy_kw)
    # the batches one GiGPO iteration scores: record_many is called once per step with the active envs' rows
    batches: list[list] = []
    record_many = base.record_many
    base.record_many = lambda rows: (batches.append([r.copy() for r in rows]), record_many(rows))[1]
    seeds = [args.seed * 1000 + g for g in range(args.groups)]
    episodes = collect_groups(base, envs, seeds, args.group_size, torch.Generator().manual_seed(args.seed))
    base.record_many = record_many
    steps = sum(len(e.steps) for e in episodes)
    rows = []
    for name, kw in VARIANTS.items():
        policy = LLMPolicy(envs[0].observation_space, envs[0].action_space, ConstantSchedule(1e-3), lm=base.lm,
                           **{**policy_kw, **kw})
        engine = policy.lm.engine
        engine.cache.invalidate()
        c0, k0 = engine.stats.num_computed_tokens, engine.stats.num_cached_tokens
        for batch in batches:
            policy.record_many(batch)
        computed, cached = engine.stats.num_computed_tokens - c0, engine.stats.num_cached_tokens - k0
        row = {"variant": name, "seed": args.seed, "groups": args.groups, "group_size": args.group_size,
               "env_steps": steps, "prefilled_tokens_per_step": computed / steps,
               "cache_hit_rate": cached / max(cached + computed, 1)}
        rows.append(row)
        print(f"{name:28s} {row['prefilled_tokens_per_step']:6.1f} prefilled tok/step  cache hit "
              f"{row['cache_hit_rate']:.3f}  ({steps} env steps)", flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
