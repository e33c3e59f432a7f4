"""Does the LM itself learn? SmolLM2-135M trained by BC / PPO / BC+PPO / EchoPPO on a text MiniGrid task, CPU only.

Every method starts from the same pretrained SmolLM2-135M-Instruct with LoRA adapters on its top layers
(:class:`~echorl_agent.llm_rl.policy.LLMPolicy`) and is evaluated on the same held-out episode seeds with the same
step budget, stochastic (sampled actions) and deterministic (argmax):

* ``frozen``  -- the pretrained LM scoring the admissible actions, no training;
* ``bc``      -- behaviour cloning on ``--bc-episodes`` expert episodes;
* ``ppo``     -- LLM-PPO from the pretrained LM for ``--train-steps`` env steps;
* ``bc+ppo``  -- BC, then LLM-PPO;
* ``echoppo`` -- BC, then LLM-EchoPPO (m soft plan tokens + lambda_KL plan KL): the plan ablation of ``bc+ppo``;
* ``gigpo``   -- GiGPO from the pretrained LM (``--group-size`` episodes per seed, ``--n-envs`` envs per step);
* ``bc+gigpo`` -- BC, then GiGPO.
* ``bc+gigpo+plan`` / ``bc+gigpo+replay`` / ``bc+echorl`` -- EchoRL on the LM (``method="echorl"``,
  ``bc_warm_start=True``) with only the latent plan (2 plan tokens, lambda_KL 0.01), only the hot/cold replay
  of LLM transitions (capacity 4096, 1024 MB, one replayed per fresh sample), or both: the ablations of
  ``bc+gigpo`` for EchoRL's claim (issue 26; ``--target`` prints env steps to a training success).

Results go to ``--out`` (default under ``runs/``, ignored: one JSON line per evaluated episode in ``episodes.jsonl``,
a run folder per method/seed with curve.csv, model.zip, adapter/, tb/); a study keeps in git its run folders' small
curve.csv/config.json/bc.json and the compact summary of ``episodes.jsonl`` (``benchmarks/summarize_study.py``,
``<out>.jsonl``), which ``--summary`` reads when ``episodes.jsonl`` is not there. ``--summary`` prints the table with Wilson 95% CIs
pooled over seeds, and the env steps each PPO variant needed to reach ``ppo``'s final training success. With
``--reference frozen`` it adds every method's paired difference to the reference (the same held-out episodes): mean
difference with a 95% bootstrap CI over seeds (per-seed mean differences) and over episodes, McNemar's exact p, and
the number of seeds where the method beat / tied / lost to the reference.

Run: ``python benchmarks/llm_rl_learning.py --methods frozen bc ppo bc+ppo echoppo --seeds 0 1 2`` then
``python benchmarks/llm_rl_learning.py --summary``. Runs already in ``episodes.jsonl`` are skipped (resumable;
several processes can share ``--out``: each run is claimed by one process with a ``<method>-seed<seed>.claim`` file).
An interrupted run continues from the checkpoint in its folder (``--checkpoint-every`` iterations or PPO updates;
GiGPO and EchoRL resume exactly, see :mod:`echorl_agent.llm_rl.checkpoint`).
Read what a run does: ``--trace METHOD SEED --trace-mode stochastic`` replays its held-out episodes on the run's own
env options with each chosen action's probability and the expert's action (sampled episodes replay the recorded
ones); rows of ``--reference`` over fewer than 5 seeds are flagged as descriptive.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401
from benchmarks.claims import claim as claim_file  # noqa: E402
from benchmarks.summarize_study import load_rows  # noqa: E402
from echorl_agent.eval.report import wilson_interval as wilson  # noqa: E402
from echorl_agent.eval.stats import mcnemar_exact, paired_bootstrap, ratio_bootstrap, read_jsonl  # noqa: E402
from echorl_agent.llm_rl.heldout import held_out_seed, held_out_seeds, play  # noqa: E402
from echorl_agent.llm_rl.train import LLMTrainConfig, make_llm_env, train_llm  # noqa: E402

METHODS = ("frozen", "bc", "ppo", "bc+ppo", "echoppo", "gigpo", "bc+gigpo", "bc+gigpo+plan", "bc+gigpo+replay",
           "bc+echorl")
ECHORL_ARMS = {"bc+gigpo+plan": {"replay": {"off": True}},
               "bc+gigpo+replay": {"policy_kwargs": {"plan_tokens": 0}},
               "bc+echorl": {}}
"""EchoRL arms: ``method="echorl"`` (GiGPO learner, 2 plan tokens + replay by default) after the BC warm start."""
GROUP_METHODS = ("gigpo", "bc+gigpo", *ECHORL_ARMS)
PPO_METHODS = ("ppo", "bc+ppo", "echoppo")
FEW_SEEDS = 5
"""Paired rows over fewer seeds get a note that their CI over seeds is no test (5: the fewest any registration uses)."""
POLICY = {"length_norm": True, "show_admissible": False, "lora_rank": 8, "train_layers": 2}


def _env_kwargs(args) -> dict:
    return json.loads(args.env_kwargs or "{}")


def _eval_env_kwargs(args) -> dict:
    """The held-out episodes' env options: ``--env-kwargs`` with ``--eval-env-kwargs`` on top (e.g. ALFWorld's
    ``{"split": "valid_unseen"}``: games no run trained on, where the default draws new episodes from the training
    pool)."""
    return {**_env_kwargs(args), **json.loads(args.eval_env_kwargs or "{}")}


def eval_tag(env_kwargs: dict, eval_kwargs: dict) -> str | None:
    """The ``eval_env_kwargs`` tag of held-out rows: None when they use the training options (so older rows keep
    pairing with new ones), else the options as sorted JSON."""
    return None if eval_kwargs == env_kwargs else json.dumps(eval_kwargs, sort_keys=True)


def evaluate(model, args, seed: int) -> list[dict]:
    """Held-out episodes ``100000 + 1000 * seed + ep``, sampled and greedy, played by ``echorl train-llm``'s player
    (:func:`echorl_agent.llm_rl.heldout.play`: one env at a time, torch seeded by the episode seed; a GiGPO trainer
    plays its envs in one batch, envs of ``--eval-env-kwargs`` when they differ from the training options)."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    rows = []
    eval_kwargs = _eval_env_kwargs(args)
    tag = eval_tag(_env_kwargs(args), eval_kwargs)
    seeds = held_out_seeds(seed, args.eval_episodes)
    envs = None  # a GiGPO trainer's own envs carry the training options: it plays the held-out ones in these
    if tag is not None and hasattr(model, "evaluate") and hasattr(model, "envs") and seeds:
        envs = [make_choice_env(args.env, args.history, args.max_steps, eval_kwargs, encode=False)
                for _ in range(min(len(model.envs), len(seeds)))]
    tag = {} if tag is None else {"eval_env_kwargs": tag}
    try:
        for mode, name in (("stochastic", "sampled"), ("deterministic", "greedy")):
            for ep in play(model, seeds, name, lambda: make_llm_env(args.env, args.history, args.max_steps,
                                                                    env_kwargs=eval_kwargs), envs=envs):
                rows.append({"mode": mode, "episode_seed": ep.seed, "won": ep.won, "return": ep.ret,
                             "steps": ep.steps, "actions": ep.actions, **tag})
    finally:
        for env in envs or ():
            env.close()
    return rows


def evaluate_saved(args) -> None:
    """Evaluate the finished runs of ``--methods`` x ``--seeds`` in ``--out`` again, on ``--eval-env-kwargs``: each
    run's final checkpoint (:func:`~echorl_agent.llm_rl.train.load_trained`, nothing retrained) plays the same
    held-out episode seeds with those env options, and its rows join ``episodes.jsonl`` tagged with them (e.g. ALFWorld
    runs evaluated on ``{"split": "valid_unseen"}`` after training on the ``train`` games). Runs already evaluated
    with these options are skipped; processes sharing ``--out`` each claim a run.

    Raises:
        ValueError: ``--eval-env-kwargs`` adds nothing to the training options (``--env-kwargs``).
    """
    from echorl_agent.llm_rl.train import load_trained

    if _eval_env_kwargs(args) == _env_kwargs(args):
        raise ValueError("--evaluate-saved needs --eval-env-kwargs that change the training options, got "
                         f"--eval-env-kwargs={args.eval_env_kwargs!r} over --env-kwargs={args.env_kwargs!r}")
    tag = eval_tag(_env_kwargs(args), _eval_env_kwargs(args))
    path = Path(args.out) / "episodes.jsonl"
    for seed in args.seeds:
        for method in args.methods:
            held = claim_file(Path(args.out) / f"{method}-seed{seed}-eval.claim")
            if held is None:
                continue  # another process evaluates it now
            rows = [d for d in read_jsonl(path) if d["method"] == method and d["seed"] == seed]
            if not rows:
                print(f"{method} seed {seed}: no finished run in {args.out}, skipped", flush=True)
            elif not any(d.get("eval_env_kwargs") == tag for d in rows):
                got = evaluate(load_trained(Path(args.out) / f"{method}-seed{seed}"), args, seed)
                with open(path, "a") as f:
                    for r in got:
                        f.write(json.dumps({"method": method, "seed": seed, "train_s": rows[0]["train_s"], **r}) + "\n")
                print(f"{method} seed {seed} on {tag}: " + ", ".join(
                    f"{m} {np.mean([r['won'] for r in got if r['mode'] == m]):.2f}"
                    for m in ("stochastic", "deterministic")), flush=True)
            held.unlink(missing_ok=True)


def trace(args) -> None:
    """Replay the first ``--eval-episodes`` held-out episodes of a saved run (``--trace METHOD SEED``) in
    ``--trace-mode`` and print the actions, the probability the policy gave each chosen action and the expert's
    action at that step.

    The run's own options (its ``config.json``: env, env options, history, step budget, policy options) are used, with
    ``--eval-env-kwargs`` on top; a sampled episode reseeds torch as the evaluation did, so it replays the recorded
    one, and each episode says whether its actions match the one recorded in ``episodes.jsonl``.
    """
    from echorl_agent import LLMPPO

    method, seed = args.trace[0], int(args.trace[1])
    run_dir = Path(args.out) / f"{method}-seed{seed}"
    if not (run_dir / "model.zip").is_file():
        raise ValueError(f"--trace: no finished run {method} seed {seed} in --out={args.out!r} "
                         f"(no {run_dir / 'model.zip'})")
    env_id, env_kwargs, history, max_steps = args.env, _env_kwargs(args), args.history, args.max_steps
    policy_kwargs = dict(POLICY)
    if (run_dir / "config.json").is_file():  # the run's own env and policy options, whatever --env says
        cfg = json.loads((run_dir / "config.json").read_text())
        env_id, env_kwargs = cfg["env_id"], cfg.get("env_kwargs") or {}
        history, max_steps = cfg["history"], cfg["max_episode_steps"]
        policy_kwargs = {**policy_kwargs, **(cfg.get("policy_kwargs") or {})}  # e.g. its int8 prefill
    eval_kwargs = {**env_kwargs, **json.loads(args.eval_env_kwargs or "{}")}
    tag = eval_tag(env_kwargs, eval_kwargs)
    recorded = {d["episode_seed"]: d.get("actions")
                for d in read_jsonl(Path(args.out) / "episodes.jsonl") if d["method"] == method
                and d["seed"] == seed and d["mode"] == args.trace_mode and d.get("eval_env_kwargs") == tag}
    print(f"{method} seed {seed}: {args.trace_mode} episodes on {env_id} {json.dumps(eval_kwargs)}, "
          f"history {history}, at most {max_steps} steps", flush=True)
    model = LLMPPO.load(run_dir / "model.zip", custom_objects={"policy_kwargs": policy_kwargs})
    env = make_llm_env(env_id, history, max_steps, env_kwargs=eval_kwargs)
    for ep in range(args.eval_episodes):
        episode_seed = held_out_seed(seed, ep)
        torch.manual_seed(episode_seed)  # as evaluate(): a sampled episode draws the same actions
        obs, info = env.reset(seed=episode_seed)
        done, steps, actions = False, [], []
        while not done:
            expert = info.get("expert_action")
            a, _ = model.predict(obs, deterministic=args.trace_mode == "deterministic")
            index = int(np.asarray(a).reshape(-1)[0])
            probs = model.policy.record(obs).rollout_logp.softmax(-1)  # scoring only: draws no random numbers
            actions.append(env.action_text(index))
            steps.append(f"{actions[-1]} (p={float(probs[index]):.2f}"
                         + ("" if actions[-1] == expert else f"; expert: {expert}") + ")")
            obs, _, term, trunc, info = env.step(index)
            done = term or trunc
        match = ("" if recorded.get(episode_seed) is None else "; as recorded" if recorded[episode_seed] == actions
                 else "; differs from the recorded episode")
        print(f"{method} seed {seed}, episode seed {episode_seed}: won={bool(info.get('won'))} in {len(steps)}"
              f"{match}: " + ", ".join(steps), flush=True)


def train_config(method: str, seed: int, args, out: Path | None = None) -> LLMTrainConfig:
    """The ``echorl train-llm`` config of ``method`` on ``seed`` with this script's arguments (what :func:`run`
    trains, and what the shipped recipes are checked against, tests/test_recipes.py)."""
    arm = ECHORL_ARMS.get(method)
    group = method in GROUP_METHODS
    return LLMTrainConfig(
        env_id=args.env, env_kwargs=_env_kwargs(args), method="ppo" if method == "frozen" else "echorl" if arm is not None else method,
        train_steps=0 if method in ("frozen", "bc") else args.train_steps, bc_episodes=args.bc_episodes,
        bc_epochs=args.bc_epochs, bc_learning_rate=args.bc_lr, bc_batch_size=args.bc_batch_size, seed=seed,
        history=args.history, max_episode_steps=args.max_steps,
        n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs, learning_rate=args.lr,
        n_envs=args.n_envs if group else args.ppo_envs if method in PPO_METHODS else 1,
        group_size=args.group_size, step_advantage_weight=args.omega,
        policy_kwargs={**POLICY, **json.loads(args.policy_kwargs or "{}"), **(arm or {}).get("policy_kwargs", {})},
        gigpo_kwargs=json.loads(args.gigpo_kwargs or "{}") if group else {},
        ppo_kwargs=json.loads(args.ppo_kwargs or "{}") if method in PPO_METHODS else {},
        bc_warm_start=arm is not None, replay=(arm or {}).get("replay"), out=None if out is None else str(out),
        **({} if args.checkpoint_every is None else {"checkpoint_every": args.checkpoint_every}))


def run(method: str, seed: int, args) -> None:
    out = Path(args.out) / f"{method}-seed{seed}"
    t0 = time.perf_counter()
    cfg = train_config(method, seed, args, out)
    resume = cfg.train_steps > 0 and any((out / name).is_dir() for name in ("checkpoint", "checkpoint.old"))
    if resume:
        from echorl_agent.llm_rl.checkpoint import read_checkpoint

        try:
            read_checkpoint(out)
            print(f"{method} seed {seed}: continuing from the checkpoint in {out}", flush=True)
        except ValueError as e:  # incomplete or corrupt (e.g. cut off by a lost machine): the run starts again
            print(f"{method} seed {seed}: {e}; starting the run again", flush=True)
            for name in ("checkpoint", "checkpoint.old"):
                shutil.rmtree(out / name, ignore_errors=True)
            resume = False
    model = train_llm(cfg, resume=resume)
    train_s = time.perf_counter() - t0
    # with --eval-episodes 0 one row of mode "none" still marks the run finished (resume skips it, --target counts
    # its curve); the success tables read the two evaluation modes only
    rows = evaluate(model, args, seed) or [{"mode": "none"}]
    with open(Path(args.out) / "episodes.jsonl", "a") as f:
        for r in rows:
            # a resumed run's train_s counts only the time since the resume: marked, the table prints it as a bound
            f.write(json.dumps({"method": method, "seed": seed, "train_s": train_s, **({"resumed": True} if resume
                                                                                     else {}), **r}) + "\n")
    wins = {m: [r["won"] for r in rows if r["mode"] == m] for m in ("stochastic", "deterministic")}
    print(f"{method} seed {seed}: train {train_s:.0f}s"
          + "".join(f", {m} {np.mean(w):.2f}" for m, w in wins.items() if w), flush=True)  # none: --eval-episodes 0


def steps_to(curve: Path, target: float) -> float | None:
    if not curve.exists():
        return None
    with open(curve) as f:
        for row in csv.DictReader(f):
            if float(row["success_rate"]) >= target:
                return float(row["timesteps"])
    return None


def steps_to_target(curve: Path, target: float, window: int = 20) -> tuple[float | None, float] | None:
    """``(env steps at which the training success over the last ``window`` episodes first reached ``target``, or
    None if it never did; the run's final env steps)`` from a GiGPO ``curve.csv`` (its ``success_rate`` is the mean
    over the last 20 finished episodes; rows before the ``window``-th episode are skipped, so one lucky first
    episode is no crossing). None when the run has no curve."""
    if not curve.exists():
        return None
    rows = list(csv.DictReader(open(curve)))
    if not rows:
        return None
    for i, row in enumerate(rows):
        if i + 1 >= window and float(row["success_rate"]) >= target:
            return float(row["timesteps"]), float(rows[-1]["timesteps"])
    return None, float(rows[-1]["timesteps"])


def target_table(args) -> None:
    """Env steps to ``--target`` training success, every group method vs ``--target-reference`` (issue 26's claim:
    the ratio's 95% bootstrap CI over seeds must lie below 0.7). A run that never reaches the target counts with
    its final env steps (censored: the ratio is then a bound, reported with the number of censored runs)."""
    ref = args.target_reference
    # finished runs only: a run still training (or cut off) has a curve.csv but no evaluation rows yet
    done = {(d["method"], d["seed"]) for d in load_rows(args.out)}
    runs = {}
    for method in GROUP_METHODS:
        for d in sorted(Path(args.out).glob(f"{method}-seed*")):
            if not d.is_dir() or d.name.rsplit("-seed", 1)[0] != method:
                continue
            if (method, int(d.name.rsplit("seed", 1)[1])) not in done:
                continue
            got = steps_to_target(d / "curve.csv", args.target)
            if got is not None:
                runs[method, int(d.name.rsplit("seed", 1)[1])] = got
    lines = []
    for method in GROUP_METHODS:
        seeds = sorted(s for m, s in runs if m == method and (ref, s) in runs)
        if method == ref or not seeds:
            continue
        steps = [runs[method, s][0] if runs[method, s][0] is not None else runs[method, s][1] for s in seeds]
        base = [runs[ref, s][0] if runs[ref, s][0] is not None else runs[ref, s][1] for s in seeds]
        ratio, lo, hi = ratio_bootstrap(steps, base)
        lines.append([f"{method} ÷ {ref}", len(seeds), f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]",
                      sum(runs[method, s][0] is None for s in seeds), sum(runs[ref, s][0] is None for s in seeds),
                      (f"partial ({len(seeds)} of {args.target_seeds} seeds)" if len(seeds) < args.target_seeds
                       else "holds" if hi < 0.7 else "not established"),
                      ", ".join(f"{s}: {a:.0f}/{b:.0f}" for s, a, b in zip(seeds, steps, base, strict=True))])
    print(f"\nenv steps to a training success >= {args.target} over the last 20 episodes, vs {ref} "
          "(censored runs count with their final env steps):")
    print(tabulate(lines, headers=["ratio", "seeds", "steps ratio [95% CI over seeds]", "censored", f"{ref} censored",
                                   "claim (CI < 0.7)", "per seed: steps / reference steps"], tablefmt="github"))


def paired(data: list[dict], method: str, reference: str, mode: str) -> dict | None:
    """``method`` − ``reference`` success on the episodes both played in ``mode`` (paired by seed, episode seed and
    the held-out env options, ``eval_env_kwargs``).

    Returns None when no episode pairs up; otherwise the seed-level mean difference and its bootstrap CI (seeds are
    the independent units: each trains its own model), the episode-level CI, McNemar's exact p and the counts of
    seeds where ``method``'s success is above / equal to / below the reference's.
    """
    episode = lambda d: (d["seed"], d["episode_seed"], d.get("eval_env_kwargs"))  # noqa: E731
    ref = {episode(d): bool(d["won"]) for d in data if d["method"] == reference and d["mode"] == mode}
    pairs: dict[int, list[tuple[bool, bool]]] = {}
    for d in sorted((d for d in data if d["method"] == method and d["mode"] == mode),
                    key=lambda d: (d["seed"], d["episode_seed"])):
        if episode(d) in ref:
            pairs.setdefault(d["seed"], []).append((bool(d["won"]), ref[episode(d)]))
    if not pairs:
        return None
    per_seed = [float(np.mean([a for a, _ in ps]) - np.mean([b for _, b in ps])) for ps in pairs.values()]
    flat = [p for ps in pairs.values() for p in ps]
    seed_diff, seed_lo, seed_hi = paired_bootstrap(per_seed)
    _, ep_lo, ep_hi = paired_bootstrap([float(a) - float(b) for a, b in flat])
    return {"seeds": len(pairs), "episodes": len(flat), "diff": seed_diff, "seed_ci": (seed_lo, seed_hi),
            "episode_ci": (ep_lo, ep_hi), "mcnemar_p": mcnemar_exact([a for a, _ in flat], [b for _, b in flat]),
            "better": sum(d > 0 for d in per_seed), "tied": sum(d == 0 for d in per_seed),
            "worse": sum(d < 0 for d in per_seed)}


def signal_rows(path: str | Path, label: str, seeds: set[int]) -> list[dict]:
    """The held-out episodes of ``benchmarks/gigpo_signal.py``'s finished runs of recipe ``label`` on ``seeds``, as
    rows of two extra methods ``<label>:before`` (its start, e.g. BC-2) and ``<label>:after`` (after its RL): they
    pair with this script's methods by seed and episode seed (both scripts play ``100000 + 1000 * seed + ep``), for
    a descriptive side-by-side (the two scripts evaluate differently, so it is no paired comparison of one run).

    Raises:
        ValueError: the file has no finished run of ``label`` on any of ``seeds``.
    """
    data = load_rows(path)
    done = {d["seed"] for d in data if d.get("kind") == "done" and d.get("label") == label and d["seed"] in seeds}
    if not done:
        raise ValueError(f"--signal: {path} has no finished run of label {label!r} on the seeds of --out "
                         f"({sorted(seeds)})")
    return [{"method": f"{label}:{d['phase']}", "seed": d["seed"], "mode": d["mode"], "episode_seed": d["episode_seed"],
             "won": bool(d["won"]), "steps": d["steps"], "train_s": float("nan")}
            for d in data if d.get("kind") == "episode" and d.get("label") == label and d["seed"] in done]


def summary(args) -> None:
    path = Path(args.out) / "episodes.jsonl"
    data = load_rows(args.out)  # episodes.jsonl, else the study's committed summary
    if args.signal:
        data = data + signal_rows(args.signal[0], args.signal[1], {d["seed"] for d in data})
    if not any(d["mode"] in ("stochastic", "deterministic") for d in data):
        print(f"no evaluated episodes in {path} (runs with --eval-episodes 0 only write curve.csv)")
        return
    options = sorted({d.get("eval_env_kwargs") or "" for d in data if d["mode"] != "none"})
    for tag in options:  # one set of tables per held-out env options: episodes on other options never pool
        if len(options) > 1:
            print(f"\nheld-out episodes on {tag or 'the training options (--env-kwargs)'}:")
        success_tables([d for d in data if (d.get("eval_env_kwargs") or "") == tag], args)
    ppo_steps_table(args)


def success_tables(data: list[dict], args) -> None:
    """Success per method and mode (Wilson CI pooled over seeds) and, with ``--reference``, the paired differences.

    "train s/seed" is a lower bound ("≥") where a run resumed from a checkpoint (it counts the time since the resume).
    """
    table = []
    methods = [*METHODS, *sorted({d["method"] for d in data} - set(METHODS))]  # then --signal's
    for method in methods:
        for mode in ("stochastic", "deterministic"):
            rs = [d for d in data if d["method"] == method and d["mode"] == mode]
            if not rs:
                continue
            k, n = sum(d["won"] for d in rs), len(rs)
            lo, hi = wilson(k, n)
            seeds = sorted({d["seed"] for d in rs})
            train = np.mean([d["train_s"] for d in rs])
            bound = "≥ " if any(d.get("resumed") for d in rs) else ""  # resumed runs: time since the resume only
            table.append([method, mode, len(seeds), n, f"{k / n:.2f} [{lo:.2f}, {hi:.2f}]",
                          f"{np.mean([d['steps'] for d in rs]):.1f}", "–" if np.isnan(train) else f"{bound}{train:.0f}"])
    print(tabulate(table, headers=["method", "eval", "seeds", "episodes", "success [95% CI]", "steps",
                                   "train s/seed"], tablefmt="github"))
    if args.reference:
        lines = []
        for method in methods:
            for mode in ("stochastic", "deterministic"):
                p = None if method == args.reference else paired(data, method, args.reference, mode)
                if p is not None:
                    lines.append([f"{method} − {args.reference}", mode, p["seeds"], p["episodes"],
                                  f"{p['diff']:+.2f} [{p['seed_ci'][0]:+.2f}, {p['seed_ci'][1]:+.2f}]",
                                  f"[{p['episode_ci'][0]:+.2f}, {p['episode_ci'][1]:+.2f}]", f"{p['mcnemar_p']:.2g}",
                                  f"{p['better']}/{p['tied']}/{p['worse']}"])
        if lines:
            print(f"\npaired difference in success vs {args.reference} (same held-out episodes):")
            print(tabulate(lines, headers=["difference", "eval", "seeds", "episodes", "diff [95% CI over seeds]",
                                           "95% CI over episodes", "McNemar p", "seeds better/tied/worse"],
                           tablefmt="github"))
            few = sorted({line[2] for line in lines if line[2] < FEW_SEEDS})
            if few:
                print(f"note: rows over {' or '.join(map(str, few))} seed(s) resample so few per-seed differences that "
                      "their CI over seeds is no test (over 2 seeds it is the range of the two, over 1 a point); "
                      f"read them as descriptive until {FEW_SEEDS} or more seeds are in")


def ppo_steps_table(args) -> None:
    """Env steps each PPO variant needed to reach ``ppo``'s final training success, per seed (from curve.csv)."""
    finals = {}
    for d in Path(args.out).glob("ppo-seed*/curve.csv"):
        rows = list(csv.DictReader(open(d)))
        if rows:
            finals[d.parent.name.split("seed")[1]] = float(rows[-1]["success_rate"])
    if finals:
        lines = []
        for method in PPO_METHODS:
            vals = [steps_to(Path(args.out) / f"{method}-seed{s}" / "curve.csv", t) for s, t in finals.items()]
            lines.append([method, ", ".join("-" if v is None else f"{v:.0f}" for v in vals)])
        print("\nenv steps to reach ppo's final training success (per seed "
              f"{', '.join(finals)}; targets {', '.join(f'{v:.2f}' for v in finals.values())}):")
        print(tabulate(lines, headers=["method", "steps"], tablefmt="github"))


def claim(out: Path, method: str, seed: int) -> Path | None:
    """Claim the run ``(method, seed)`` in ``out`` for this process: the claim file to remove after the run, or None
    if another live process holds it (processes sharing ``--out`` each create ``<method>-seed<seed>.claim``; a
    stale claim is taken over, so an interrupted study resumes: :func:`benchmarks.claims.claim`)."""
    return claim_file(out / f"{method}-seed{seed}.claim")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="EchoRL/MiniGrid-Empty-Random-5x5-v0")
    ap.add_argument("--env-kwargs", help='JSON gym.make options of the env, e.g. \'{"goal_line": true}\'')
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--train-steps", type=int, default=128)
    ap.add_argument("--bc-episodes", type=int, default=12)
    ap.add_argument("--bc-epochs", type=int, default=20)
    ap.add_argument("--bc-lr", type=float, default=2e-3)
    ap.add_argument("--bc-batch-size", type=int, default=8)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=16, help="step budget per episode, training and evaluation")
    ap.add_argument("--n-steps", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--n-epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--n-envs", type=int, default=8, help="GiGPO: envs per iteration (groups x group size)")
    ap.add_argument("--ppo-envs", type=int, default=1,
                    help="PPO methods (ppo, bc+ppo, echoppo): envs stepping together, their candidates scored in one "
                    "engine call per step (each update: --n-steps x this many env steps)")
    ap.add_argument("--group-size", type=int, default=4, help="GiGPO: episodes per seed")
    ap.add_argument("--omega", type=float, default=1.0,
                    help="GiGPO: weight of the step-level (anchor-state) advantage; 0 = episode-level GRPO")
    ap.add_argument("--policy-kwargs", help="JSON LLMPolicy options added to the defaults (e.g. temperature)")
    ap.add_argument("--gigpo-kwargs", help='JSON GiGPO learner options, e.g. \'{"epochs": 4, "minibatch_size": 32}\'')
    ap.add_argument("--ppo-kwargs", help='JSON PPO options of the PPO methods (bc+ppo, ...), e.g. \'{"target_kl": 0.02}\'')
    ap.add_argument("--eval-episodes", type=int, default=6)
    ap.add_argument("--eval-env-kwargs", help="JSON env options of the held-out episodes only, over --env-kwargs "
                    '(e.g. \'{"split": "valid_unseen"}\' for ALFWorld games no run trained on)')
    ap.add_argument("--evaluate-saved", action="store_true",
                    help="evaluate the finished runs in --out again on --eval-env-kwargs (their final checkpoints, "
                    "not retrained), adding rows tagged with those options")
    ap.add_argument("--checkpoint-every", type=int, default=None,
                    help="checkpoint every N iterations / PPO updates (default: train-llm's); an interrupted run "
                    "continues from its last checkpoint")
    ap.add_argument("--out", default="runs/llm_rl_learning",
                    help="results folder (a committed study's: benchmarks/results/<study>, read from its summary)")
    ap.add_argument("--summary", action="store_true", help="only print the table of what is in --out")
    ap.add_argument("--reference", default=None,
                    help=f"also print every method's paired success difference to this method ({', '.join(METHODS)}, "
                    "or --signal's LABEL:before / LABEL:after)")
    ap.add_argument("--signal", nargs=2, metavar=("FILE", "LABEL"),
                    help="--summary: add the held-out episodes of benchmarks/gigpo_signal.py's finished runs of "
                    "recipe LABEL in FILE on the same seeds, as methods LABEL:before and LABEL:after (descriptive)")
    ap.add_argument("--target", type=float, default=None,
                    help="also print env steps to this training success (last 20 episodes) vs --target-reference")
    ap.add_argument("--target-reference", default="bc+gigpo", choices=GROUP_METHODS)
    ap.add_argument("--target-seeds", type=int, default=10,
                    help="seeds the registration needs before the claim column says holds / not established")
    ap.add_argument("--trace", nargs=2, metavar=("METHOD", "SEED"),
                    help="replay --eval-episodes held-out episodes of a saved run on its own env options, printing "
                    "its actions, their probabilities and the expert's")
    ap.add_argument("--trace-mode", choices=("deterministic", "stochastic"), default="deterministic",
                    help="--trace: greedy or sampled episodes (sampled ones replay the recorded evaluation)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    extra = {f"{args.signal[1]}:before", f"{args.signal[1]}:after"} if args.signal else set()
    if args.reference is not None and args.reference not in (*METHODS, *extra):
        raise ValueError(f"--reference must be one of {(*METHODS, *sorted(extra))}, got --reference={args.reference!r}")
    torch.set_num_threads(1)
    if args.trace:
        trace(args)
        return
    if args.summary:
        summary(args)
        if args.target is not None:
            target_table(args)
        return
    if args.evaluate_saved:
        evaluate_saved(args)
        summary(args)
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "episodes.jsonl"
    for seed in args.seeds:
        for method in args.methods:
            held = claim(Path(args.out), method, seed)
            if held is None:
                continue  # another process on the same --out runs it now
            # read after claiming: another process on the same --out may have finished it meanwhile
            done = {(d["method"], d["seed"]) for d in map(json.loads, open(path))} if path.exists() else set()
            if (method, seed) not in done:
                run(method, seed, args)
            held.unlink(missing_ok=True)
    summary(args)


if __name__ == "__main__":
    main()
