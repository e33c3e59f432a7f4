"""Whole-loop speed of LLM RL (env steps/s of rollouts + updates) on BabyAI-GoToLocal, history 2, and ALFWorld.

GoToLocal loops use 24-step episodes; one loop runs ALFWorld-PickAndPlace.

Loops measured (each a fresh process, alternating A/B/... over ``--rounds``, same seeds):

* ``ppo-1env``   -- ``echorl train-llm --method ppo --n-steps 64 --history 2 --max-steps 24`` as the issue measured
  it (0.45 env steps/s): one env, 2 epochs, batch 16;
* ``ppo-8env``   -- the same PPO with 8 envs (one batched engine call per step, packed learner);
* ``gigpo-2x4``  -- GiGPO, 2 groups x 4 episodes per iteration (one batched engine call per step); an iteration
  runs whole episodes, so it times at least one iteration (up to 8 x 64 steps);
* ``gigpo-2x4-lean`` -- the same without the admissible-action list in the prompt (``show_admissible=False``);
* ``bc+gigpo-2x4-lean`` -- the lean loop from a BC warm start on 8 expert episodes (done in the untimed warm-up): its
  groups have reward variance, so the timed iterations include their updates (from the pretrained LM GoToLocal
  episodes rarely succeed, and an iteration without reward variance runs no update);
* ``gigpo-2x4-lean-bf16``, ``bc+gigpo-2x4-lean-bf16`` -- those two with ``engine_prefill_dtype="bfloat16"`` (the
  frozen layers' prefill in bfloat16; faster only where the CPU has AMX or AVX-512 BF16);
* ``gigpo-2x4-lean-int8``, ``bc+gigpo-2x4-lean-int8`` -- those two with ``engine_prefill_dtype="int8"`` (the frozen
  layers' prefill as SmoothQuant W8A8; ~2x float32's prefill with AVX-512 VNNI, ~1.3x on AVX2 with the package's
  own kernel);
* ``gigpo-2x4-lean-int8-lbf16``, ``bc+gigpo-2x4-lean-int8-lbf16`` -- the int8 loops with the learner's products with
  frozen weights in bfloat16 (``learner_matmul_dtype="bfloat16"``; same CPU caveat as bfloat16 prefill);
* ``recipe-gotolocal-rl``, ``recipe-gotolocal-rl-lean`` -- the shipped recipe's own loop (``echorl train-llm
  --recipe NAME``: GiGPO 8 groups x 4 episodes, history 0, goal line, int8 prefill; no held-out evaluation) with
  ``--steps`` env steps (``--recipe-overrides '{"n_envs": 8}'``: 2 groups, a shorter iteration); ``-lean`` is the
  same with the prompt levers that cut prefilled tokens per step (``candidate_end_token=False``,
  ``drop_task_lines=True``; :class:`~echorl_agent.llm_rl.config.LLMPolicyConfig`). Each loop samples its own
  episodes, so the two visit different states; ``benchmarks/prompt_lever_tokens.py`` scores the same states;
* with ``--baseline-tree DIR`` (a checkout of an older commit, e.g. ``git worktree add /tmp/old 16db19f``), the
  ``--baseline-loops`` (default ``ppo-1env``) of that tree too (``old-<loop>``, each right after the same loop of
  this tree), so the ratio new / old is measured in one run.

* ``alfworld-ppo-8env-int8`` -- PPO on ALFWorld-PickAndPlace (generated games, no "help", history 0, 30-step
  episodes) with §21's update (8 envs, minibatches of 32, 4 epochs, lr 1e-3; an update every 16 steps of the 8 envs)
  from the pretrained LM, int8 prefill: long candidate lists that begin alike ("go to shelf 1", "go to shelf 2").

Each loop runs ``--steps`` env steps (after a warm-up that loads the model) and reports env steps/s, prompt tokens
prefilled per env step, the prefix-cache hit rate and the rollout / learner split. The prefill-bound limit of a loop
is ``prefill tok/s / tokens prefilled per env step`` (prefill tok/s measured on a 512-token prompt in the same
process): a loop can never step faster than its prefill allows.

``--glam`` adds the learner side by side with a GLAM/lamorel-style learner on the same transitions: the HF forward of
every (prompt + candidate) sequence through the whole model, then the backward (no prefix sharing, no activation
reuse), vs ours (packed candidates, captured activations, trained layers only).

Run: ``python benchmarks/llm_rl_loop_speed.py --rounds 2 --threads 1 [--baseline-tree /tmp/old] [--glam]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "EchoRL/BabyAI-GoToLocal-v0"
LOOPS = {
    "ppo-1env": dict(method="ppo", n_envs=1, n_steps=64, batch_size=16, n_epochs=2),
    "ppo-8env": dict(method="ppo", n_envs=8, n_steps=8, batch_size=16, n_epochs=2),
    "gigpo-2x4": dict(method="gigpo", n_envs=8, group_size=4),
    # the same GiGPO without the admissible-action list in every observation turn (the candidates are scored anyway)
    "gigpo-2x4-lean": dict(method="gigpo", n_envs=8, group_size=4, policy={"show_admissible": False}),
    # the lean loop after a BC warm start (8 expert episodes, 20 epochs, lr 2e-3, as §8's harness but 8 episodes; in the
    # untimed warm-up): episodes now succeed sometimes, so groups have reward variance and updates run
    "bc+gigpo-2x4-lean": dict(method="gigpo", n_envs=8, group_size=4, policy={"show_admissible": False},
                              warm="bc+gigpo", bc=dict(bc_episodes=8, bc_epochs=20, bc_learning_rate=2e-3, bc_batch_size=8)),
}
# ALFWorld-PickAndPlace (generated games, no "help" action, history 0, 30-step episodes): PPO with §21's update (8
# envs, minibatches of 32, 4 epochs, lr 1e-3) from the pretrained LM, int8 prefill; updates every 16 steps of 8 envs
# so a short timing includes its learner (per sample the same learner work as §21's 64-step rollouts)
LOOPS["alfworld-ppo-8env-int8"] = dict(
    method="ppo", n_envs=8, n_steps=16, batch_size=32, n_epochs=4, learning_rate=1e-3,
    policy={"show_admissible": False, "engine_prefill_dtype": "int8"},
    env="EchoRL/ALFWorld-PickAndPlace-v0", env_kwargs={"offer_help": False}, history=0, max_episode_steps=30)
# the shipped recipes' own loops (their LLMTrainConfig with --steps env steps, no held-out evaluation)
# (recipe, policy_kwargs on top); "-lean" adds the opt-in prompt levers (LLMPolicyConfig.candidate_end_token=False,
# drop_task_lines=True: fewer prefilled tokens, a different start policy -- not a registered recipe)
RECIPE_LOOPS = {"recipe-gotolocal-rl": ("gotolocal-rl", {}),
                "recipe-gotolocal-rl-lean": ("gotolocal-rl", {"candidate_end_token": False, "drop_task_lines": True})}
# the same loops with the engine's frozen layers prefilled in bfloat16 (fast only on CPUs with AMX / AVX-512 BF16)
# or as SmoothQuant W8A8 (int8 activations x int8 weights; fast only with VNNI / AMX int8 products)
LOOPS.update({f"{name}-{suffix}": {**kw, "policy": {**kw["policy"], "engine_prefill_dtype": dtype}}
              for suffix, dtype in (("bf16", "bfloat16"), ("int8", "int8"))
              for name, kw in list(LOOPS.items()) if name.endswith("-lean")})
# the int8 loops with the learner's products with frozen weights in bfloat16 (learner_matmul_dtype)
LOOPS.update({f"{name}-lbf16": {**kw, "policy": {**kw["policy"], "learner_matmul_dtype": "bfloat16"}}
              for name, kw in list(LOOPS.items()) if name.endswith("-lean-int8")})


def _prefill_tok_s(engine, n: int = 512) -> float:
    ids = list(range(1000, 1000 + n))
    engine.cache.invalidate()
    engine.score(ids[:-1], [[ids[-1]]])  # warm-up
    engine.cache.invalidate()
    t = time.perf_counter()
    engine.score(ids[:-1], [[ids[-1]]])
    return n / (time.perf_counter() - t)


def worker(loop: str, steps: int, seed: int) -> dict:
    """One measurement in this process (the tree on sys.path decides old or new code)."""
    import torch

    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    import echorl_envs  # noqa: F401
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    if loop.removeprefix("old-") in RECIPE_LOOPS:
        return _recipe_worker(loop, steps, seed)
    kw = dict(LOOPS[loop.removeprefix("old-")])
    method = kw.pop("method")
    warm = kw.pop("warm", method)
    extra = {"group_size": kw.pop("group_size")} if "group_size" in kw else {}
    policy = {"lora_rank": 8, "train_layers": 2, **kw.pop("policy", {})}
    common = dict(env_id=kw.pop("env", ENV), method=method, history=kw.pop("history", 2),
                  max_episode_steps=kw.pop("max_episode_steps", 24), seed=seed,
                  learning_rate=kw.pop("learning_rate", 1e-4), policy_kwargs=policy,
                  **{"bc_episodes": 1, **kw.pop("bc", {})}, **kw, **extra)
    # warm-up: load the model and run one short loop (not timed); a BC warm start happens here
    t0 = time.perf_counter()
    model = train_llm(LLMTrainConfig(**{**common, "method": warm,
                                        "train_steps": 0 if method == "gigpo" else kw["n_steps"] * kw["n_envs"]}))
    lm = model.policy.lm
    return _timed(loop, seed, lambda: train_llm(LLMTrainConfig(train_steps=steps, **common), lm=lm), lm,
                  time.perf_counter() - t0)


def _recipe_worker(loop: str, steps: int, seed: int) -> dict:
    """A shipped recipe's loop: its config with ``steps`` env steps, ``seed``, no held-out evaluation and the
    ``--recipe-overrides`` (JSON in ``ECHORL_RECIPE_OVERRIDES``)."""
    import torch

    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    import echorl_envs  # noqa: F401
    from echorl_agent.llm_rl.recipes import load_recipe, train_config
    from echorl_agent.llm_rl.train import train_llm

    name, levers = RECIPE_LOOPS[loop.removeprefix("old-")]
    recipe = load_recipe(name)
    t0 = time.perf_counter()
    over = {"seed": seed, "eval_episodes": 0, "eval_every": 0, "out": None, "progress": False,
            "policy_kwargs": levers,
            **json.loads(os.environ.get("ECHORL_RECIPE_OVERRIDES") or "{}")}
    model = train_llm(train_config(recipe, {**over, "train_steps": 0}))  # warm-up: loads the model (not timed)
    lm = model.policy.lm
    return _timed(loop, seed, lambda: train_llm(train_config(recipe, {**over, "train_steps": steps}), lm=lm), lm,
                  time.perf_counter() - t0)


def _timed(loop: str, seed: int, run, lm, setup: float) -> dict:
    """Time ``run()`` and count the engine's prefilled and cached tokens during it."""
    import torch

    prefill = _prefill_tok_s(lm.engine)
    s0 = lm.engine.stats
    c0, k0 = s0.num_computed_tokens, s0.num_cached_tokens
    t = time.perf_counter()
    model = run()
    wall = time.perf_counter() - t
    n = model.num_timesteps
    s = lm.engine.stats
    computed, cached = s.num_computed_tokens - c0, s.num_cached_tokens - k0
    out = {"loop": loop, "seed": seed, "env_steps": n, "wall_s": wall, "env_steps_per_s": n / wall,
           "prefill_tok_s": prefill, "prefilled_tokens_per_step": computed / n,
           "cache_hit_rate": cached / max(cached + computed, 1), "setup_s": setup,
           "threads": torch.get_num_threads()}
    out["prefill_bound_steps_per_s"] = prefill / out["prefilled_tokens_per_step"]
    hist = getattr(model, "history", None)
    if hist:
        out["rollout_s"] = sum(h["rollout_s"] for h in hist)
        out["learner_s"] = sum(h["learner_s"] for h in hist)
        out["iterations"] = len(hist)
        out["groups_without_variance"] = sum(h["frac_zero_std"] for h in hist) / len(hist)  # 1.0: no update ran
    return out


def glam_compare(transitions: int, seed: int) -> dict:
    """Learner time per transition: ours vs a GLAM/lamorel-style HF forward of every candidate + backward."""
    import torch

    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", "1")))
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_agent.llm_rl.rollout import make_choice_env

    env = make_choice_env(ENV, history=2)
    policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-4), lora_rank=8, train_layers=2)
    rows, gen = [], torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    while len(rows) < transitions:
        rows.append(obs)
        a = int(torch.multinomial(policy.record(obs).rollout_logp.exp(), 1, generator=gen))
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            obs, _ = env.reset(seed=seed + len(rows))
    recs = policy.record_many(rows)
    model = policy.lm.model
    pad = policy.lm.tokenizer.pad_token_id or 0

    def ours() -> None:
        policy.optimizer.zero_grad()
        for lo in range(0, len(recs), 16):
            logps = policy.learner_scores_many(recs[lo : lo + 16])[0]
            torch.stack([lp[0] for lp in logps]).sum().backward()

    def glam() -> None:
        policy.optimizer.zero_grad()
        for rec in recs:  # one padded batch of [prompt + candidate] per state, through the whole model
            seqs = [rec.context + c for c in rec.cands]
            width = max(map(len, seqs))
            ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
            att = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            logits = model(input_ids=ids, attention_mask=att).logits.float()
            lp = torch.log_softmax(logits, -1)
            scores = torch.stack([sum(lp[i, len(rec.context) - 1 + j, t] for j, t in enumerate(c))
                                  for i, c in enumerate(rec.cands)])
            torch.log_softmax(scores, -1)[0].backward()

    times = {"ours": [], "glam": []}
    for _ in range(2):
        for name, fn in (("ours", ours), ("glam", glam)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in times.items()}
    return {"transitions": transitions, "ours_s_per_transition": best["ours"] / transitions,
            "glam_s_per_transition": best["glam"] / transitions, "speedup": best["glam"] / best["ours"],
            "context_tokens_mean": sum(len(r.context) for r in recs) / len(recs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=[*LOOPS, *RECIPE_LOOPS])
    ap.add_argument("--steps", type=int, default=128, help="timed env steps per loop")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-tree", help="checkout of an older commit: its --baseline-loops are measured too")
    ap.add_argument("--baseline-loops", nargs="+", default=["ppo-1env"], choices=list(LOOPS),
                    help="loops measured in --baseline-tree too, each right after the same loop of this tree")
    ap.add_argument("--glam", action="store_true", help="also the learner vs a GLAM-style learner")
    ap.add_argument("--glam-transitions", type=int, default=32, help="transitions in the learner comparison")
    ap.add_argument("--recipe-overrides", help="JSON of LLMTrainConfig fields replacing the recipe loops' own, e.g. "
                    "'{\"n_envs\": 8}' (2 groups of 4: one iteration is 8 episodes instead of 32)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--glam-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="benchmarks/results/llm_rl_loop_speed.jsonl")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.seed)), flush=True)
        return
    if args.glam_worker:
        print(json.dumps(glam_compare(args.glam_transitions, args.seed)), flush=True)
        return
    plan = []
    for loop in args.loops:
        plan.append((loop, str(ROOT)))
        if args.baseline_tree and loop in args.baseline_loops:  # old and new of one loop back to back
            plan.append((f"old-{loop}", str(Path(args.baseline_tree).resolve())))
    results = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for threads in args.threads:
        env = {**os.environ, "TORCH_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore",
               "ECHORL_RECIPE_OVERRIDES": args.recipe_overrides or ""}
        for r in range(args.rounds):
            for loop, tree in plan:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", loop, "--steps", str(args.steps),
                       "--seed", str(args.seed + r)]
                res = subprocess.run(cmd, env={**env, "PYTHONPATH": tree}, capture_output=True, text=True,
                                     cwd=tree, check=False)
                if res.returncode:
                    print(f"{loop} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
                    continue
                row = json.loads(res.stdout.strip().splitlines()[-1])
                row.update(round=r, date=time.strftime("%Y-%m-%d %H:%M"), load=os.getloadavg()[0])
                results.append(row)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"[{threads} thr, round {r}] {loop}: {row['env_steps_per_s']:.3f} env steps/s "
                      f"({row['env_steps']} steps, {row['prefilled_tokens_per_step']:.0f} prefilled tok/step, "
                      f"cache hit {row['cache_hit_rate']:.2f}, prefill-bound {row['prefill_bound_steps_per_s']:.2f} "
                      f"steps/s, learner {row.get('learner_s', 0):.1f} s, groups without reward variance "
                      f"{row.get('groups_without_variance', float('nan')):.2f})", flush=True)
            if args.glam:
                res = subprocess.run([sys.executable, __file__, "--glam-worker", "--seed", str(args.seed + r),
                                      "--glam-transitions", str(args.glam_transitions)],
                                     env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=False)
                if res.returncode == 0:
                    g = json.loads(res.stdout.strip().splitlines()[-1])
                    g.update(loop="glam-learner", round=r, threads=threads)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(g) + "\n")
                    print(f"[{threads} thr, round {r}] learner: ours {g['ours_s_per_transition']:.3f} s/transition, "
                          f"GLAM-style {g['glam_s_per_transition']:.3f} ({g['speedup']:.1f}x)", flush=True)
                else:
                    print(f"glam failed:\n{res.stderr[-2000:]}", file=sys.stderr)


if __name__ == "__main__":
    main()
