"""Tokens the rollout engine prefills per env step under each prompt lever, on the same GoToLocal states.

The loop benchmark (``llm_rl_loop_speed.py --loops recipe-gotolocal-rl recipe-gotolocal-rl-lean``) runs each recipe's
own rollouts, so its two loops visit different states (a lever changes the policy's scores, hence its samples, hence
how often a group's episodes repeat a state the prefix cache holds). Here one policy with gotolocal-rl's settings
(the pretrained LM) plays ``--groups`` groups of ``--group-size`` episodes, as one GiGPO iteration does (one batched
engine call per step for all active envs), and every variant then scores exactly those batches, in the same order,
from an empty prefix cache: the difference is the lever's alone. Token counts are deterministic for a seed (they do
not depend on the machine's speed or load).

Each variant also reports its policy on those states: the mean probability of every action and the mean KL
divergence ``KL(pi_gotolocal-rl || pi_variant)`` per state (0 for an exact lever: the score memo; a prompt lever that
changes what the LM reads changes the start policy by that much). ``gotolocal-rl, no score memo`` is the engine as it
was before :class:`~echorl_agent.llm.engine.score_memo.ScoreMemo` (every repeated state prefilled again).

Run: ``python benchmarks/prompt_lever_tokens.py --groups 2 --seed 65``.
"""

from __future__ import annotations

import argparse
import json
import os

NO_MEMO = "gotolocal-rl, no score memo"
VARIANTS = {
    "gotolocal-rl": {},
    NO_MEMO: {},
    "admissible_in_system=True": {"admissible_in_system": True},
    "candidate_end_token=False": {"candidate_end_token": False},
    "drop_task_lines=True": {"drop_task_lines": True},
    "gotolocal-rl-lean": {"candidate_end_token": False, "drop_task_lines": True},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=65)
    ap.add_argument("--history", type=int, default=None,
                    help="observation turns kept in the prompt (default: the recipe's 0; 2 = the loop benchmark's "
                         "gigpo-2x4 loops, whose prompts grow inside a history chunk)")
    ap.add_argument("--out", default=None, help="append one JSON row per variant to this file")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    from stable_baselines3.common.utils import ConstantSchedule

    import echorl_envs  # noqa: F401
    from echorl_agent.llm.engine.score_memo import ScoreMemo
    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_agent.llm_rl.recipes import load_recipe
    from echorl_agent.llm_rl.rollout import collect_groups, make_choice_env
    from echorl_envs.wrappers.llm import decode_llm_obs

    cfg = load_recipe("gotolocal-rl").config
    policy_kw = dict(cfg["policy_kwargs"])
    n = args.groups * args.group_size
    history = cfg["history"] if args.history is None else args.history
    envs = [make_choice_env(cfg["env_id"], history, cfg["max_episode_steps"], cfg["env_kwargs"])
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
    probs: dict[str, list[torch.Tensor]] = {}
    names = [decode_llm_obs(r)["admissible"] for batch in batches for r in batch]
    for name, kw in VARIANTS.items():
        policy = LLMPolicy(envs[0].observation_space, envs[0].action_space, ConstantSchedule(1e-3), lm=base.lm,
                           **{**policy_kw, **kw})
        engine = policy.lm.engine
        memo = engine.score_memo
        if name == NO_MEMO:
            engine.score_memo = ScoreMemo(0)
        engine.cache.invalidate()  # also empties the score memo
        c0, k0 = engine.stats.num_computed_tokens, engine.stats.num_cached_tokens
        h0 = engine.score_memo.stats.num_hits
        try:
            recs = [rec for batch in batches for rec in policy.record_many(batch)]
        finally:
            engine.score_memo = memo
        computed, cached = engine.stats.num_computed_tokens - c0, engine.stats.num_cached_tokens - k0
        probs[name] = [r.rollout_logp.double().exp() for r in recs]
        base_p = probs["gotolocal-rl"]
        kl = sum(float((a * (a.log() - b.log())).sum()) for a, b in zip(base_p, probs[name], strict=True)) / len(recs)
        mean_p: dict[str, float] = {}
        for adm, pr in zip(names, probs[name], strict=True):
            for a, v in zip(adm, pr.tolist(), strict=False):
                mean_p[a] = mean_p.get(a, 0.0) + v / len(recs)
        row = {"variant": name, "seed": args.seed, "groups": args.groups, "group_size": args.group_size,
               "history": history,
               "env_steps": steps, "prefilled_tokens_per_step": computed / steps,
               "cache_hit_rate": cached / max(cached + computed, 1),
               "memo_hits": engine.score_memo.stats.num_hits - h0 if name != NO_MEMO else 0,
               "kl_from_gotolocal_rl": kl, "mean_action_probs": {a: round(v, 4) for a, v in mean_p.items()}}
        rows.append(row)
        top = ", ".join(f"{a} {v:.2f}" for a, v in sorted(mean_p.items(), key=lambda kv: -kv[1])[:3])
        print(f"{name:28s} {row['prefilled_tokens_per_step']:6.1f} prefilled tok/step  cache hit "
              f"{row['cache_hit_rate']:.3f}  memo hits {row['memo_hits']:3d}  KL {kl:.4f}  ({top}; "
              f"{steps} env steps)", flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
