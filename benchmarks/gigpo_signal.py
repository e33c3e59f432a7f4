"""Does GiGPO's advantage point the right way, and does the policy move toward the expert?

The script behind docs/studies/gotolocal-gigpo-probe.md and the GoToLocal studies after it. Held-out success on a
handful of episodes is too noisy to tell a GiGPO recipe that learns slowly from one that does not learn
(docs/studies/gotolocal-bc-gigpo-1k.md: 6 episodes per seed and mode). BabyAI's envs name the expert's (the BabyAI
bot's) action at every state (``info["expert_action"]``), which gives two lower-variance instruments:

* **signal alignment** of an iteration's advantages: ``sum_i A_i * s_i / sum_i |A_i|`` over the learner's samples,
  with ``s_i = +1`` if the action taken was the expert's and ``-1`` otherwise. +1: every unit of advantage pushes
  toward the expert; 0: the advantages are unrelated to the expert's choice. (The expert is one good policy, not the
  only one, so this is a proxy.) Also the mean advantage of expert and non-expert actions.
* **probe**: a fixed set of states the starting policy visits on held-out seeds (sampled actions), scored after every
  iteration: the mean probability the policy gives the expert's action, and the share of states whose argmax is the
  expert's action.

One run = one seed and one recipe (``--label``): BC warm start as ``benchmarks/llm_rl_learning.py``, held-out
episodes (``--eval-episodes`` per mode), the probe, GiGPO iterations (one JSON line each, with the probe after the
update), the same held-out episodes again; ``--summary`` pairs after with before over seeds. A seed already done for
a label is skipped. Raw rows go to ``--out`` (under ``runs/``, ignored: every episode's actions); a study keeps their
compact summary in git (``benchmarks/summarize_study.py``), which ``--summary`` reads the same way. A run checkpoints after every iteration into ``<out>.<label>-seed<seed>.ckpt/`` (the trainer's
exact state, :func:`echorl_agent.llm_rl.algorithms.gigpo.checkpoint.save_gigpo`, with the probe states), so an interrupted seed
continues from its last iteration and computes what the uninterrupted run computes; the folder is removed when the
seed is done. Example (the setting of docs/studies/gotolocal-bc-gigpo-1k.md)::

    python benchmarks/gigpo_signal.py --seeds 8 --iterations 12 --lr 1e-3 --epochs 4 --minibatch-size 32 \
        --eval-episodes 20 --out runs/gigpo_signal.jsonl
    python benchmarks/gigpo_signal.py --summary --out runs/gigpo_signal.jsonl
    python benchmarks/summarize_study.py runs/gigpo_signal.jsonl --out benchmarks/results/gigpo_signal.jsonl
    python benchmarks/gigpo_signal.py --summary --out benchmarks/results/gigpo_signal_s1070.jsonl  # a committed study
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import echorl_agent.llm_rl.algorithms.gigpo.trainer as gigpo_mod  # noqa: E402
from benchmarks.claims import append_jsonl, claim, drop_rows  # noqa: E402
from benchmarks.summarize_study import load_groups, load_rows  # noqa: E402
from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_agent.eval.stats import read_jsonl  # noqa: E402
from echorl_agent.llm_rl import checkpoint as ckpt  # noqa: E402
from echorl_agent.llm_rl.advantage import gigpo_advantages  # noqa: E402
from echorl_agent.llm_rl.algorithms.bc.warm_start import bc_warm_start  # noqa: E402
from echorl_agent.llm_rl.algorithms.gigpo.checkpoint import load_gigpo, save_gigpo  # noqa: E402
from echorl_agent.llm_rl.algorithms.gigpo.config import gigpo_config  # noqa: E402
from echorl_agent.llm_rl.heldout import held_out_seeds, play  # noqa: E402
from echorl_agent.llm_rl.train import LLMTrainConfig  # noqa: E402
from echorl_envs.wrappers.llm import decode_llm_obs, encode_llm_obs  # noqa: E402

POLICY = {"length_norm": True, "show_admissible": False, "lora_rank": 8, "train_layers": 2}


def _where(info: dict) -> str:
    return f"{info.get('agent_pos')}|{info.get('direction')}|{info.get('carrying')}"


class ExpertTrace(gym.Wrapper):
    """Keeps the episode's observation rows (as bytes, the probe files' format; GiGPO's envs give dicts), the
    expert's action text at each of them, and where the agent was (position, direction, carried object: with the
    seed, the exact state of a BabyAI GoTo task)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.rows, self.experts, self.where = [encode_llm_obs(obs)], [info.get("expert_action")], [_where(info)]
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.rows.append(encode_llm_obs(obs))
        self.experts.append(info.get("expert_action"))
        self.where.append(_where(info))
        return obs, r, term, trunc, info


def exact_anchors(episodes, envs) -> list:
    """Copies of the episodes whose anchor keys add the agent's exact position and direction to the observation
    text (GiGPO's anchor states are env states; with history 0 the text alone can alias different positions)."""
    return [dataclasses.replace(ep, steps=[dataclasses.replace(st, anchor=st.anchor + "\x00" + env.where[t])
                                           for t, st in enumerate(ep.steps)])
            for ep, env in zip(episodes, envs, strict=True)]


def expert_index(row: np.ndarray, expert: str | None) -> int | None:
    adm = decode_llm_obs(row).get("admissible") or []
    return adm.index(expert) if expert in adm else None


def probe_states(trainer, seeds: list[int], n: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[int]]:
    """Up to ``n`` (row, expert slot) pairs from sampled episodes of the current policy on ``seeds``."""
    pool = []
    for lo in range(0, len(seeds), len(trainer.envs)):
        chunk = seeds[lo : lo + len(trainer.envs)]
        eps = gigpo_mod.collect_groups(trainer.policy, trainer.envs[: len(chunk)], chunk, 1, trainer.generator)
        for env, ep in zip(trainer.envs, eps, strict=False):
            for t in range(len(ep.steps)):
                k = expert_index(env.rows[t], env.experts[t])
                if k is not None:
                    pool.append((env.rows[t], k))
    pick = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
    return [pool[i][0] for i in pick], [pool[i][1] for i in pick]


def probe(policy, rows: list[np.ndarray], experts: list[int]) -> tuple[float, float]:
    """(mean pi(expert | s), share of states whose argmax is the expert's action) under the current weights."""
    policy.clear_store()
    recs = policy.record_many(rows)
    p = [float(r.rollout_logp[k].exp()) for r, k in zip(recs, experts, strict=True)]
    top = [int(torch.argmax(r.rollout_logp)) == k for r, k in zip(recs, experts, strict=True)]
    return float(np.mean(p)), float(np.mean(top))


def oracle_advantages(episodes, envs) -> list[np.ndarray]:
    """The diagnostic's known-good advantages: +1 where the step took the expert's action, -1 where it took another,
    0 where the expert's action is not among the candidates (the agreement ``alignment`` weighs advantages by)."""
    out = []
    for env, ep in zip(envs, episodes, strict=True):
        a = np.zeros(len(ep.steps))
        for t, step in enumerate(ep.steps):
            k = expert_index(env.rows[t], env.experts[t])
            if k is not None:
                a[t] = 1.0 if step.action == k else -1.0
        out.append(a)
    return out


def alignment(episodes, envs, adv) -> dict[str, float]:
    num, den, a_exp, a_other = 0.0, 0.0, [], []
    for signs, ea in zip(oracle_advantages(episodes, envs), adv, strict=True):
        for s, a in zip(signs, ea, strict=True):
            if s == 0 or abs(a) < 1e-12:  # no expert action among the candidates, or no advantage
                continue
            num, den = num + a * s, den + abs(a)
            (a_exp if s > 0 else a_other).append(a)
    return {"alignment": num / den if den else 0.0, "adv_expert": float(np.mean(a_exp)) if a_exp else 0.0,
            "adv_other": float(np.mean(a_other)) if a_other else 0.0, "n_expert": len(a_exp),
            "n_other": len(a_other)}


class OracleGiGPOTrainer(gigpo_mod.GiGPOTrainer):
    """GiGPO's loop with :func:`oracle_advantages` in place of the reward's: how far the learner moves the policy
    when every advantage points the right way (an upper bound for the reward's advantages, which are noisier)."""

    def advantages(self, episodes):
        return oracle_advantages(episodes, self.envs)


VARIANTS = {"gigpo": (0.95, 1.0, "std"), "episode-only (GRPO)": (0.95, 0.0, "std"), "mean-centred": (0.95, 1.0, "mean"),
            "gamma 0.8": (0.8, 1.0, "std"), "gamma 0.99": (0.99, 1.0, "std"), "step x2": (0.95, 2.0, "std")}
"""Advantage variants (gamma, omega, normalize) whose alignment is also computed on every iteration's episodes (the
same rollouts: only the training run's own variant shapes the policy)."""


def evaluate(trainer, seed: int, episodes: int, phase: str) -> list[dict]:
    """Held-out success, sampled and greedy, on the episode seeds of ``benchmarks/llm_rl_learning.py``
    (``100000 + 1000 * seed + ep``): the same episodes before and after GiGPO, so they pair up. The player is
    ``echorl train-llm``'s (:func:`echorl_agent.llm_rl.heldout.play`: the trainer's envs in one batch, sampled
    actions from its generator)."""
    seeds = held_out_seeds(seed, episodes)
    rows = []
    for mode, name in (("stochastic", "sampled"), ("deterministic", "greedy")):
        for ep in play(trainer, seeds, name):
            rows.append({"kind": "episode", "phase": phase, "mode": mode, "episode_seed": ep.seed, "won": ep.won,
                         "return": ep.ret, "steps": ep.steps, "actions": ep.actions})
    return rows


RUN_ARGS = ("env", "bc_episodes", "max_steps", "history", "iterations", "train_steps", "lr", "groups", "group_size",
            "epochs", "minibatch_size", "ent_coef", "ref_kl_coef", "target_kl", "temperature", "omega", "normalize",
            "probe_seeds", "probe_states", "probe_file", "eval_episodes", "sample_weighting",
            "center_advantages", "env_kwargs", "prefill_dtype", "positive_advantages",
            "oracle_advantages", "learner_dtype")
"""The arguments a checkpointed run must be resumed with (the trainer's own config is checked by the checkpoint)."""


def ckpt_dir(args, seed: int) -> Path:
    """Where a run of (``--label``, ``seed``) keeps its checkpoint, probe states and arguments until it is done."""
    return Path(f"{args.out}.{args.label}-seed{seed}.ckpt")


def run_args(args) -> dict:
    return {k: getattr(args, k) for k in RUN_ARGS}


def resumable(args, seed: int) -> int | None:
    """The iteration the checkpoint of (``--label``, ``seed``) holds, or None when there is none to continue.

    Raises:
        ValueError: a checkpoint written with other arguments (resume with the same ones, or delete the folder).
    """
    folder = ckpt_dir(args, seed)
    if not (folder / ckpt.CHECKPOINT).is_dir() and not (folder / (ckpt.CHECKPOINT + ".old")).is_dir():
        return None
    saved = {"sample_weighting": "sample", "center_advantages": False, "env_kwargs": None, "prefill_dtype": "float32",
             "learner_dtype": "float32", "positive_advantages": False, "oracle_advantages": False,
             **json.loads((folder / "args.json").read_text())}  # older runs: default
    now = json.loads(json.dumps(run_args(args)))
    for k in sorted(set(saved) | set(now)):
        if saved.get(k) != now.get(k):
            raise ValueError(f"cannot resume {folder}: {k} differs ({k}={saved.get(k)!r} in the checkpoint, "
                             f"{now.get(k)!r} now); rerun with the same arguments or delete that folder")
    try:
        return int(ckpt.read_checkpoint(folder)[1]["iteration"])
    except ValueError as e:  # incomplete or corrupt (e.g. cut off by a lost machine): the seed starts again
        print(f"seed {seed}: {e}; starting the seed again", flush=True)
        return None


def train_config(args, seed: int) -> LLMTrainConfig:
    """The ``echorl train-llm`` config of one seed of this script's recipe (GiGPO's settings, the BC warm start,
    ``--train-steps``): what it trains with, and what the shipped recipes are checked against
    (tests/test_recipes.py). The script's own loop also stops after ``--iterations``."""
    warm = {"method": "bc+gigpo", "bc_episodes": args.bc_episodes} if args.bc_episodes else {"method": "gigpo"}
    return LLMTrainConfig(env_id=args.env, env_kwargs=json.loads(args.env_kwargs or "{}"),
                         train_steps=args.train_steps, **warm, bc_epochs=20, bc_learning_rate=2e-3,
                         bc_batch_size=8, seed=seed, history=args.history,
                         max_episode_steps=args.max_steps, learning_rate=args.lr,
                         n_envs=args.groups * args.group_size, group_size=args.group_size,
                         policy_kwargs={**POLICY, "temperature": args.temperature,
                                        **({} if args.prefill_dtype == "float32"
                                           else {"engine_prefill_dtype": args.prefill_dtype}),
                                        **({} if args.learner_dtype == "float32"
                                           else {"learner_matmul_dtype": args.learner_dtype}),
                                        **json.loads(args.policy_kwargs or "{}")},
                         step_advantage_weight=args.omega,
                         gigpo_kwargs={"epochs": args.epochs, "minibatch_size": args.minibatch_size,
                                       "ent_coef": args.ent_coef, "normalize": args.normalize,
                                       "ref_kl_coef": args.ref_kl_coef, "target_kl": args.target_kl,
                                       "sample_weighting": args.sample_weighting,
                                       "center_advantages": args.center_advantages,
                                       **({"positive_advantages": True} if args.positive_advantages else {})})


def run_seed(args, seed: int, resume: bool = False) -> None:
    cfg = train_config(args, seed)
    gcfg, _ = gigpo_config(cfg)
    folder = ckpt_dir(args, seed)
    opened = ckpt.open_checkpoint(folder, cfg) if resume else None  # verified before the model loads
    torch.manual_seed(seed)
    trainer = (OracleGiGPOTrainer if args.oracle_advantages else gigpo_mod.GiGPOTrainer)(gcfg)
    trainer.envs = [ExpertTrace(e) for e in trainer.envs]
    if opened is not None:  # the weights after BC and every update so far, the generators, the probe states
        saved = np.load(folder / "probe.npz")
        rows, experts = list(saved["rows"]), [int(k) for k in saved["experts"]]
        load_gigpo(trainer, opened)
    else:
        if args.bc_episodes:  # 0: GiGPO from the pretrained LM
            bc_warm_start(cfg, trainer.policy, None)
        rows, experts = start_probe(args, seed, trainer)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        np.savez_compressed(folder / "probe.npz", rows=np.stack(rows), experts=np.array(experts))
        (folder / "args.json").write_text(json.dumps(run_args(args)))
    base = {"label": args.label, **{k: v for k, v in vars(args).items() if k not in ("out", "seeds", "summary")},
            "seed": seed, "cpu": cpu_name()}  # the host of each row (a resumed seed may change hosts)

    def write(row: dict) -> None:
        append_jsonl(args.out, {**base, **row})

    t_start = time.perf_counter()
    if opened is None:
        if args.eval_episodes:
            for r in evaluate(trainer, seed, args.eval_episodes, "before"):
                write(r)
        p0, top0 = probe(trainer.policy, rows, experts)
        write({"kind": "iteration", "iteration": 0, "timesteps": 0, "probe_p_expert": p0, "probe_top_expert": top0,
               "probe_n": len(rows)})
        print(f"seed {seed} it 0: probe p(expert) {p0:.3f}, argmax = expert {top0:.2f} ({len(rows)} states)",
              flush=True)
        save_gigpo(trainer, cfg, folder)
    else:
        print(f"seed {seed}: resumed at iteration {trainer.num_iterations} ({trainer.num_timesteps} env steps)",
              flush=True)
    while trainer.num_iterations < args.iterations and trainer.num_timesteps < args.train_steps:
        t0 = time.perf_counter()
        s = trainer.iteration()
        eps = trainer.last_episodes
        adv = gigpo_advantages(eps, gcfg.gamma, gcfg.step_advantage_weight, gcfg.normalize)
        al = alignment(eps, trainer.envs, adv)
        others = {name: alignment(eps, trainer.envs, gigpo_advantages(eps, *v))["alignment"]
                  for name, v in VARIANTS.items()}
        others["exact-state anchors"] = alignment(eps, trainer.envs, gigpo_advantages(
            exact_anchors(eps, trainer.envs), gcfg.gamma, gcfg.step_advantage_weight, gcfg.normalize))["alignment"]
        p, top = probe(trainer.policy, rows, experts)
        row = {"kind": "iteration", **{k: s[k] for k in ("iteration", "timesteps", "success_rate", "frac_zero_std",
                                                         "entropy", "clip_fraction", "num_samples", "ref_kl",
                                                         "approx_kl", "optimizer_steps", "stopped_early",
                                                         "rollout_s", "learner_s", "advantage_mean",
                                                         "advantage_mean_raw")},
               **al, "alignment_variants": others, "probe_p_expert": p, "probe_top_expert": top,
               "probe_n": len(rows), "seconds": time.perf_counter() - t0}
        write(row)
        print(f"seed {seed} it {int(s['iteration'])} ({int(s['timesteps'])} steps): success "
              f"{s['success_rate']:.2f}, alignment {al['alignment']:+.2f} (A expert {al['adv_expert']:+.2f} "
              f"n={al['n_expert']}, other {al['adv_other']:+.2f} n={al['n_other']}), probe p(expert) {p:.3f}, "
              f"argmax {top:.2f}, {row['seconds']:.0f}s", flush=True)
        save_gigpo(trainer, cfg, folder)  # also empties the prefix cache, as a resumed run's is
    if args.eval_episodes:
        for r in evaluate(trainer, seed, args.eval_episodes, "after"):
            write(r)
    write({"kind": "done", "timesteps": trainer.num_timesteps, "iterations": trainer.num_iterations,
           "seconds": time.perf_counter() - t_start})
    shutil.rmtree(folder, ignore_errors=True)


def start_probe(args, seed: int, trainer) -> tuple[list[np.ndarray], list[int]]:
    """The probe states of a new run: from ``--probe-file`` if it exists, else sampled (and saved there if given)."""
    probe_file = args.probe_file.format(seed=seed) if args.probe_file else None
    if probe_file and Path(probe_file).exists():
        saved = np.load(probe_file)
        return list(saved["rows"]), [int(k) for k in saved["experts"]]
    rows, experts = probe_states(trainer, [300_000 + 1000 * seed + i for i in range(args.probe_seeds)],
                                 args.probe_states, np.random.default_rng(seed))
    if probe_file:
        np.savez_compressed(probe_file, rows=np.stack(rows), experts=np.array(experts))
    return rows, experts


def summary(args) -> None:
    """Per label: paired (after − before) differences over seeds -- probe p(expert), probe argmax agreement and
    held-out success per mode -- each with a 95% percentile bootstrap CI over seeds. With fewer finished seeds than
    the run registered (its rows' ``min_seeds``; ``--min-seeds`` for rows without one) the verdict column says
    "partial" (a registration draws no conclusion early). ``--pool`` labels add a descriptive row set (no verdict)."""

    pooled = "+".join(args.pool)

    def verdict(lo: float, n: int, label: str) -> str:
        if label == pooled:
            return "descriptive (pooled)"
        want = need.get(label, args.min_seeds)
        if n < want:
            return f"partial ({n} of {want} seeds)"
        return "holds" if lo > 0 else "not established"

    from tabulate import tabulate

    from echorl_agent.eval.stats import bootstrap_text, paired_bootstrap

    data = pooled_rows([r for path in (args.out, *args.also) for r in load_rows(path)], args.pool)
    groups = pooled_rows([g for path in (args.out, *args.also) for g in load_groups(path)], args.pool)
    done = {(d["label"], d["seed"]) for d in data if d.get("kind") == "done"}
    need: dict[str, int] = {}  # each run's registered seed count (its rows' min_seeds); --min-seeds without one
    for d in data:
        if d.get("min_seeds"):
            need[d["label"]] = max(need.get(d["label"], 0), d["min_seeds"])
    lines = []
    for label in sorted({lab for lab, _ in done}):
        seeds = sorted(s for lab, s in done if lab == label)
        its = {s: sorted((d for d in data if d.get("kind") == "iteration" and d["label"] == label and d["seed"] == s),
                         key=lambda d: d["iteration"]) for s in seeds}
        for name, key in (("probe p(expert)", "probe_p_expert"), ("probe argmax = expert", "probe_top_expert")):
            diffs = [its[s][-1][key] - its[s][0][key] for s in seeds]
            lines.append([label, name, len(seeds), f"{np.mean([its[s][0][key] for s in seeds]):.3f}",
                          f"{np.mean([its[s][-1][key] for s in seeds]):.3f}", bootstrap_text(diffs, signed=True),
                          verdict(paired_bootstrap(diffs)[1], len(seeds), label)])
        for mode in ("stochastic", "deterministic"):
            per_seed = []
            for s in seeds:
                eps = held_out([d for d in data if d["label"] == label and d["seed"] == s], mode)
                if eps["before"] and eps["after"]:
                    per_seed.append((np.mean(eps["before"]), np.mean(eps["after"])))
            if per_seed:
                diffs = [a - b for b, a in per_seed]
                lines.append([label, f"success ({mode})", len(per_seed), f"{np.mean([b for b, _ in per_seed]):.3f}",
                              f"{np.mean([a for _, a in per_seed]):.3f}", bootstrap_text(diffs, signed=True),
                              verdict(paired_bootstrap(diffs)[1], len(per_seed), label)])
    print(tabulate(lines, headers=["recipe", "measure", "seeds", "before (start)", "after (start + GiGPO)",
                                   "after − before [95% CI over seeds]", "CI above 0"], tablefmt="github"))
    print("\nupdate dynamics per seed (all iteration rows, finished or not): the steps' mean advantage (loss-weighted "
          "when the row has advantage_mean, else step-weighted from adv_expert/adv_other) and the policy entropy")
    own = [d for d in data if d["label"] != pooled]  # per-seed tables: each seed once, under its own label
    print(tabulate(dynamics(own), headers=["recipe", "seed", "updates", "mean advantage", "negative updates",
                                            "entropy first 3", "entropy last 3"], tablefmt="github"))
    print("\nper finished seed: env steps, updates, probe, held-out wins before → after, and the host its rows ran on")
    print(tabulate(seed_table(own), headers=["recipe", "seed", "env steps", "updates", "probe p(expert)",
                                            "wins, stochastic", "wins, deterministic", "host"], tablefmt="github"))
    print("\nwhat the policy does on the held-out episodes (finished seeds): share of each action among all steps, "
          "and the mean episode length")
    print(tabulate(action_shares(data, groups), headers=["recipe", "mode", "phase", "seeds", "episodes", "mean steps",
                                                 "actions (share of steps)"], tablefmt="github"))


def pooled_rows(data: list[dict], labels: Sequence[str]) -> list[dict]:
    """``data`` plus a copy of every row of ``labels`` relabelled ``"+".join(labels)``: the seeds of several runs of one
    recipe reported together (descriptive: the runs were registered apart). Raises ValueError if a label has no rows
    or two labels share a seed (the pooled row would pair one seed's episodes twice)."""
    if not labels:
        return data
    if len(labels) < 2:
        raise ValueError(f"--pool needs at least two labels, got {list(labels)}")
    name = "+".join(labels)
    seeds: dict[str, set[int]] = {lab: {d["seed"] for d in data if d.get("label") == lab} for lab in labels}
    for lab, got in seeds.items():
        if not got:
            raise ValueError(f"--pool label {lab!r} has no rows in --out or --also")
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if seeds[a] & seeds[b]:
                raise ValueError(f"--pool labels {a!r} and {b!r} share seeds {sorted(seeds[a] & seeds[b])}")
    return data + [{**d, "label": name} for d in data if d.get("label") in labels]


def _mean_advantage(d: dict) -> float | None:
    if d.get("advantage_mean") is not None:
        return float(d["advantage_mean"])
    n = (d.get("n_expert") or 0) + (d.get("n_other") or 0)
    if not n or d.get("adv_expert") is None:
        return None
    return (d["adv_expert"] * d["n_expert"] + d["adv_other"] * d["n_other"]) / n


def dynamics(data: list[dict]) -> list[list]:
    """Per (recipe, seed): updates (iterations with samples), their mean advantage, how many were negative, and the
    entropy of the first and last three updates."""
    out = []
    for label, seed in sorted({(d["label"], d["seed"]) for d in data if d.get("kind") == "iteration"}):
        its = [d for d in data if d.get("kind") == "iteration" and d["label"] == label and d["seed"] == seed
               and (d.get("num_samples") or 0) > 0]
        its.sort(key=lambda d: d["iteration"])
        adv = [a for a in map(_mean_advantage, its) if a is not None]
        ent = [d["entropy"] for d in its if d.get("entropy")]
        if adv and ent:
            out.append([label, seed, len(its), f"{np.mean(adv):+.3f}", f"{sum(a < 0 for a in adv)} of {len(adv)}",
                        f"{np.mean(ent[:3]):.2f}", f"{np.mean(ent[-3:]):.2f}"])
    return out


def held_out(rows: list[dict], mode: str) -> dict[str, list]:
    """``{"before": [won, ...], "after": [...]}``: the held-out episodes of ``mode`` among one seed's rows."""
    return {ph: [d["won"] for d in rows if d.get("kind") == "episode" and d["mode"] == mode and d["phase"] == ph]
            for ph in ("before", "after")}


def seed_table(data: list[dict]) -> list[list]:
    """Per (recipe, finished seed): env steps, updates, probe p(expert) start -> end, held-out wins before -> after in
    each mode, and the host(s) its rows ran on (the CPU's model name; "not recorded" for rows written before rows
    carried it) -- what an outcome section quotes seed by seed."""
    done = sorted({(d["label"], d["seed"]) for d in data if d.get("kind") == "done"})
    out = []
    for label, seed in done:
        rows = [d for d in data if d["label"] == label and d["seed"] == seed]
        its = sorted((d for d in rows if d.get("kind") == "iteration"), key=lambda d: d["iteration"])
        wins = {}
        for mode in ("stochastic", "deterministic"):
            got = held_out(rows, mode)
            wins[mode] = (f"{sum(map(bool, got['before']))} → {sum(map(bool, got['after']))} of {len(got['after'])}"
                          if got["before"] and got["after"] else "–")
        hosts = sorted({d.get("cpu") or "not recorded" for d in rows})
        probe = f"{its[0]['probe_p_expert']:.3f} → {its[-1]['probe_p_expert']:.3f}" if its else "–"
        out.append([label, seed, int(its[-1].get("timesteps", 0)) if its else 0,
                    sum(1 for d in its if (d.get("num_samples") or 0) > 0), probe, wins["stochastic"],
                    wins["deterministic"], ", ".join(hosts)])
    return out


def action_shares(data: list[dict], groups: list[dict] | None = None) -> list[list]:
    """Per (recipe, mode, phase) over the finished seeds' held-out episodes: seeds, episodes, mean episode length and
    every action's share of all steps taken (most frequent first) -- what reward did to the policy's behaviour, e.g.
    a collapse onto one action, shows here before any success rate does. ``groups``: the episodes' summary rows
    (:func:`benchmarks.summarize_study.load_groups`), whose ``action_counts`` sum each group's actions; None: each
    episode row of ``data`` with its ``actions`` is a group of one."""
    if groups is None:
        groups = [{**d, "steps": [d["steps"]], "action_counts": Counter(d["actions"])} for d in data
                  if d.get("kind") == "episode" and d.get("actions")]
    done = {(d["label"], d["seed"]) for d in data if d.get("kind") == "done"}
    eps = [g for g in groups if g.get("kind") == "episode" and (g["label"], g["seed"]) in done and g["action_counts"]]
    out = []
    for label in sorted({g["label"] for g in eps}):
        for mode in ("stochastic", "deterministic"):
            for phase in ("before", "after"):
                sel = [g for g in eps if g["label"] == label and g["mode"] == mode and g["phase"] == phase]
                if not sel:
                    continue
                counts = Counter()
                for g in sel:
                    counts.update(g["action_counts"])
                total = sum(counts.values()) or 1
                shares = ", ".join(f"{a} {c / total:.0%}" for a, c in counts.most_common())
                out.append([label, mode, phase, len({g["seed"] for g in sel}), sum(len(g["steps"]) for g in sel),
                            f"{np.mean([s for g in sel for s in g['steps']]):.1f}", shares])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="EchoRL/BabyAI-GoToLocal-v0")
    ap.add_argument("--env-kwargs", help='JSON gym.make options of the env, e.g. \'{"goal_line": true}\'')
    ap.add_argument("--prefill-dtype", default="float32", choices=("float32", "bfloat16", "int8"),
                    help="rollout engine's prefill of the frozen layers (LLMPolicyConfig.engine_prefill_dtype)")
    ap.add_argument("--policy-kwargs", default=None,
                    help="JSON of further LLMPolicyConfig fields, e.g. the prompt levers "
                         "'{\"candidate_end_token\": false, \"drop_task_lines\": true}'")
    ap.add_argument("--learner-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="learner's products with frozen weights (LLMPolicyConfig.learner_matmul_dtype)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[8])
    ap.add_argument("--bc-episodes", type=int, default=2, help="expert episodes of the BC warm start (0: none, "
                    "GiGPO starts from the pretrained LM)")
    ap.add_argument("--max-steps", type=int, default=24)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=12, help="GiGPO iterations (at most)")
    ap.add_argument("--train-steps", type=int, default=10**9,
                    help="stop at the end of the first iteration at or past this many env steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatch-size", type=int, default=32)
    ap.add_argument("--ent-coef", type=float, default=0.0)
    ap.add_argument("--ref-kl-coef", type=float, default=0.0, help="KL(pi || pi_ref) to the policy after BC")
    ap.add_argument("--target-kl", type=float, default=None,
                    help="stop an update once the exact KL(pi_old || pi) of a minibatch exceeds 1.5x this")
    ap.add_argument("--temperature", type=float, default=1.0, help="policy temperature (rollouts and learner)")
    ap.add_argument("--omega", type=float, default=1.0, help="step_advantage_weight")
    ap.add_argument("--normalize", default="std", choices=("std", "mean"))
    ap.add_argument("--sample-weighting", default="sample", choices=("sample", "episode"),
                    help="GiGPO loss weight per step ('sample') or per episode ('episode')")
    ap.add_argument("--center-advantages", nargs="?", const=True, default=False, choices=["signal"],
                    help="subtract each iteration's loss-weighted mean advantage from every step; '--center-advantages "
                         "signal': from the steps with a non-zero advantage only (GiGPOConfig.center_advantages)")
    ap.add_argument("--oracle-advantages", action="store_true",
                    help="diagnostic: learn from +1 (the expert's action) / -1 (another) instead of the reward's "
                         "advantages; the rows' alignment still scores the reward's")
    ap.add_argument("--positive-advantages", action="store_true",
                    help="learn only from steps whose (centred) advantage is > 0 (GiGPOConfig.positive_advantages)")
    ap.add_argument("--probe-seeds", type=int, default=8, help="held-out episodes whose states form the probe")
    ap.add_argument("--probe-states", type=int, default=64)
    ap.add_argument("--probe-file", help="load the probe states from this .npz if it exists, else save them to it "
                    "('{seed}' is replaced; to score another start, e.g. more demonstrations, on the same states)")
    ap.add_argument("--eval-episodes", type=int, default=0,
                    help="held-out episodes per mode before and after GiGPO (0: none)")
    ap.add_argument("--label", default="", help="recipe name written with every row")
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", action="store_true", help="only print the paired table of what is in --out")
    ap.add_argument("--also", nargs="*", default=[], metavar="FILE",
                    help="--summary: further JSON-lines files read with --out (e.g. an earlier study of the recipe)")
    ap.add_argument("--pool", nargs="*", default=[], metavar="LABEL",
                    help="--summary: also report these labels' finished seeds together, as recipe 'A+B' (descriptive, "
                         "no verdict: e.g. --pool s16 s18 with --also gigpo_signal_s1050.jsonl)")
    ap.add_argument("--min-seeds", type=int, default=10,
                    help="seeds a verdict needs (fewer: 'partial'); recorded in the rows, which --summary reads first")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.summary:
        summary(args)
        return
    torch.set_num_threads(1)
    for seed in args.seeds:
        held = claim(f"{args.out}.{args.label}-seed{seed}.claim")
        if held is None:
            continue  # another live process on the same --out runs this seed now
        finished = any(d.get("kind") == "done" and d["label"] == args.label and d["seed"] == seed
                       for d in read_jsonl(args.out))
        if not finished:  # a finished seed is skipped, an interrupted one continues from its last checkpoint
            at = resumable(args, seed)

            def stale(d, seed=seed, at=at) -> bool:  # rows the checkpoint does not cover (all of them without one)
                if d.get("label") != args.label or d.get("seed") != seed:
                    return False
                if at is None:
                    return True
                return (d.get("kind") == "iteration" and d["iteration"] > at) or d.get("phase") == "after" \
                    or d.get("kind") == "done"

            n = drop_rows(args.out, stale)
            if n:
                print(f"seed {seed}: removed {n} rows of an interrupted run"
                      + ("" if at is None else f" written after its checkpoint (iteration {at})"), flush=True)
            run_seed(args, seed, resume=at is not None)
        held.unlink(missing_ok=True)
    summary(args)


if __name__ == "__main__":
    main()
