"""The ``echorl`` command line: list, play, bench, train-llm, eval-llm, recipes, record, serve, serve-env.

    echorl list                                      # registered ids: family, actions, data, max steps
    echorl play EchoRL/MiniGrid-DoorKey-5x5-v0       # type an action or its number; 'history', 'quit'
    echorl bench --tasks EchoRL/Game24-v0 EchoRL/MiniGrid-Empty-5x5-v0 --agents random expert --seeds 2 --episodes 5
    echorl bench --preset demo
    echorl train-llm --task EchoRL/MiniGrid-Empty-5x5-v0 --method bc+ppo --train-steps 256 --out runs/llm
    echorl train-llm --task EchoRL/MiniGrid-Empty-5x5-v0 --method bc+ppo --train-steps 512 --out runs/llm --resume
    echorl train-llm --recipe gotolocal-rl --seed 1200 --out runs/gotolocal-rl   # a published result, again
    echorl eval-llm runs/llm --episodes 40           # a finished run's held-out success, again
    echorl recipes                                   # the shipped recipes: task, method, budget, expected, time
    echorl record --task EchoRL/MiniGrid-Empty-5x5-v0 --agent expert --episodes 10 --format minari --out runs/data
    echorl serve --port 8000 --model smollm2-135m     # the LLM engine, OpenAI-compatible routes
    echorl serve-env --task EchoRL/ALFWorld-v0 --task EchoRL/MiniGrid-DoorKey-5x5-v0 --port 8001 --max-sessions 8

Every subcommand's ``--help`` shows its defaults; the agent, method and family lists in it are generated from the
registries (:data:`echorl_agent.eval.agents.AGENTS`, :data:`echorl_agent.llm_rl.algorithms.registry.METHODS`,
:data:`echorl_envs.ENVS`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

from echorl_agent.argtypes import again_prefix, json_object

__all__ = ["main", "demo_config"]

#: One representative task per family for the demo preset (families not installed are left out). MiniGrid is
#: Empty-Random-5x5 (random start cell and heading), so its 40 instances differ and the LM rows can be read against
#: docs/studies/minigrid-frozen-vs-bc.md and docs/studies/minigrid-gigpo-from-pretrained.md.
DEMO_TASKS = {
    "minigrid": "EchoRL/MiniGrid-Empty-Random-5x5-v0",
    "math": "EchoRL/Game24-v0",
    "alfworld": "EchoRL/ALFWorld-PickAndPlace-v0",
    "textworld": "EchoRL/TextWorld-CoinCollector-v0",
    "webshop": "EchoRL/WebShop-v0",
    "cruxeval": "EchoRL/CRUXEval-O-v0",
    "arc": "EchoRL/ARC-v0",
}
#: Demo agents and the families each plays (None: all). SB3 agents and the three SmolLM2 policies (frozen, BC,
#: BC + GiGPO: the same LLMPolicy, prompt and scoring) play MiniGrid only.
DEMO_AGENTS: dict[str, tuple[str, ...] | None] = {
    "random": None,
    "expert": None,
    "ppo": ("minigrid",),
    "echoppo": ("minigrid",),
    "llm-frozen": ("minigrid",),
    "llm-bc": ("minigrid",),
    "llm-gigpo": ("minigrid",),
    "react": ("math",),
}
#: The three SmolLM2 policy rows share one budget: 1 training seed, its first 8 episodes in both evaluation modes,
#: 16 steps per episode (the budget of the MiniGrid studies), length-normalised action scores without the action list
#: in the prompt; their actions are kept in episodes.jsonl.
_DEMO_LM = {"seeds": 1, "episodes": 8, "max_steps": 16, "record_actions": True,
            "policy_kwargs": {"length_norm": True, "show_admissible": False}}
#: BC of the MiniGrid frozen-vs-BC study (12 expert episodes, 20 epochs, lr 2e-3, batch 8): llm-gigpo starts from
#: exactly llm-bc's weights (same seed, same BC), then runs GiGPO for 128 env steps (2 groups x K = 4 episodes per
#: iteration).
_DEMO_BC = {"bc_episodes": 12, "bc_epochs": 20, "bc_learning_rate": 2e-3, "bc_batch_size": 8, "max_episode_steps": 16}
#: Deliberate unequal budgets, shown in the demo table (columns "max steps" and "n") and its notes: the SmolLM2
#: agents take ~0.2-2 s per step on 2 CPU cores, so the LM policies play 8 episodes of at most 16 steps (above) and
#: ReAct 4 episodes per seed with 3 attempts on Game24, while every other agent plays all episodes under the env's
#: own limit.
DEMO_AGENT_OPTIONS: dict[str, dict] = {
    "llm-frozen": _DEMO_LM,
    "llm-bc": {**_DEMO_LM, **_DEMO_BC, "train_steps": 0},  # BC only: no RL steps (run.json says so)
    "llm-gigpo": {**_DEMO_LM, **_DEMO_BC, "bc_warm_start": True, "train_steps": 128, "learning_rate": 1e-3},
    "react": {"max_steps": 3, "episodes": 4},
}
#: 2 training seeds x 20 episodes = 40 paired instances per (task, agent): enough for the expert/random and
#: EchoPPO/PPO-deterministic gaps to be significant; the table marks which differences are.
DEMO_SEEDS, DEMO_EPISODES, DEMO_TRAIN_STEPS = 2, 20, 8192
#: Default ports: ``echorl serve`` (the LLM engine; the usual OpenAI-compatible port) and ``echorl serve-env``
#: (environments), distinct so both can run on one machine with their defaults.
SERVE_PORT, SERVE_ENV_PORT = 8000, 8001


def _check_choices(values: list[str], known: list[str], what: str) -> None:
    for v in values:
        if v not in known:
            hint = difflib.get_close_matches(v, known, n=2, cutoff=0.4)
            raise SystemExit(
                f"echorl: unknown {what} {v!r}" + (f"; did you mean {' or '.join(map(repr, hint))}?" if hint else "")
                + f"\n(known {what}s: {', '.join(known)})"
            )


def cmd_list(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    import echorl_envs

    rows = [[e.id, e.family, e.action_type, e.data, e.max_episode_steps] for e in echorl_envs.ENVS
            if args.family is None or e.family == args.family]
    print(tabulate(rows, headers=["id", "family", "actions", "data", "max steps"], tablefmt="github"))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import echorl_envs

    _check_choices([args.id], echorl_envs.env_ids(), "task")
    env = gym.make(args.id)
    obs, info = env.reset(seed=args.seed)
    history: list[str] = []
    print(f"Task: {info['task']}\n\n{obs}\n\n(type an action or its number; 'history' lists your moves, 'quit' stops)")
    while True:
        adm = info["admissible_actions"]
        if adm:
            print("\nAdmissible actions:\n" + "\n".join(f"  {i}. {a}" for i, a in enumerate(adm)))
        try:
            line = input("\n> ").strip()
        except EOFError:
            break
        if line in ("quit", "exit"):
            break
        if line == "history":
            print("\n".join(history) or "(empty)")
            continue
        action = adm[int(line)] if adm and line.isdigit() and int(line) < len(adm) else line
        obs, r, term, trunc, info = env.step(action)
        history.append(f"{info['step']}: {action} -> reward {r}")
        print(f"\n{obs}\n[reward {r} | step {info['step']}{' | invalid' if info['invalid_action'] else ''}]")
        if term or trunc:
            print("Episode over: " + ("won" if info["won"] else "not won"))
            break
    env.close()
    return 0


def demo_config(out: str):
    """The ``make demo`` preset: one task per family × the agents available here (see :data:`DEMO_AGENTS`)."""
    import echorl_envs
    from echorl_agent.eval.agents import availability
    from echorl_agent.eval.runner import BenchConfig

    ids = set(echorl_envs.env_ids())
    tasks = [t for t in DEMO_TASKS.values() if t in ids]
    agents = [a for a in DEMO_AGENTS if availability(a) is None]
    exclude = [f"{t}:{a}" for a in agents for t in tasks
               if DEMO_AGENTS[a] is not None and echorl_envs.entry(t).family not in DEMO_AGENTS[a]]
    return BenchConfig(tasks=tasks, agents=agents, out=out, seeds=DEMO_SEEDS, episodes=DEMO_EPISODES, workers=2,
                       train_steps=DEMO_TRAIN_STEPS, eval_mode="both", reference="random" if "random" in agents else None,
                       agent_options={a: o for a, o in DEMO_AGENT_OPTIONS.items() if a in agents}, exclude=exclude)


def cmd_bench(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.eval import agents as agent_registry
    from echorl_agent.eval.plots import plot_curves, plot_success
    from echorl_agent.eval.report import markdown_table, notes, reference_of, summarize, write_summary
    from echorl_agent.eval.runner import BenchConfig, run_bench

    if args.preset == "demo":
        cfg = demo_config(args.out)
        if args.workers is not None:  # results do not depend on the number of workers, only wall time does
            cfg.workers = args.workers
        skipped = {a: agent_registry.availability(a) for a in DEMO_AGENTS}
        for a, why in skipped.items():
            if why:
                print(f"[demo] agent {a!r} unavailable here: {why}", file=sys.stderr)
    else:
        if not args.tasks or not args.agents:
            raise SystemExit("echorl bench: give --tasks and --agents (or --preset demo)")
        _check_choices(args.tasks, echorl_envs.env_ids(), "task")
        _check_choices(args.agents, agent_registry.agent_names(), "agent")
        opts = args.agent_options or {}
        cfg = BenchConfig(tasks=args.tasks, agents=args.agents, out=args.out, seeds=args.seeds,
                          episodes=args.episodes, workers=args.workers or 2, backend=args.backend,
                          train_steps=args.train_steps, max_steps=args.max_steps,
                          price_per_mtok=args.price_per_mtok, agent_options=opts, exclude=args.exclude,
                          eval_mode=args.eval_mode, reference=args.reference)
    cfg.env_urls = list(args.env_url or [])  # play on `echorl serve-env` servers instead of in-process envs
    from echorl_agent.eval.runner import skipped_pairs

    skipped = skipped_pairs(cfg)
    for (t, a), why in skipped.items():
        if not why.startswith("excluded"):
            print(f"[bench] skipping {a} on {t}: {why}", file=sys.stderr)
    if any(why.startswith("excluded") for why in skipped.values()):
        n = sum(why.startswith("excluded") for why in skipped.values())
        print(f"[bench] {n} (task, agent) pairs excluded by --exclude / the preset", file=sys.stderr)
    try:
        rows = run_bench(cfg, progress=not args.quiet)
    except ValueError as e:
        raise SystemExit(f"echorl bench: {e}") from e
    summary = summarize(rows, cfg.price_per_mtok, reference=cfg.reference_agent())
    ref = reference_of(summary)  # None when no agent could be paired with it (e.g. it ran on no task)
    out = Path(cfg.out)
    run = json.loads((out / "run.json").read_text())
    run["reference"] = ref  # the reference the summary actually used
    (out / "run.json").write_text(json.dumps(run, indent=2))
    paths = write_summary(summary, cfg.out)
    plot_success(summary, out / "success.png")
    curves = plot_curves(cfg.out, out / "learning_curves.png")
    try:
        from rich.console import Console
        from rich.table import Table

        from echorl_agent.eval.report import _diff_cell

        table = Table(title=f"echorl bench ({len(rows)} episodes)")
        paired = [f"Δ vs {ref} [95% CI]", "McNemar p"] if ref else []
        for col in ["task", "agent", "mode", "max steps", "n", "Success@1 [95% CI]", *paired, "return", "steps",
                    "ep/s", "KV reuse"]:
            table.add_column(col)
        for s in summary:
            diff = [_diff_cell(s), "-" if s["mcnemar_p"] is None else f"{s['mcnemar_p']:.2g}"] if ref else []
            table.add_row(s["task"].replace("EchoRL/", ""), s["agent"], s["mode"], str(s["max_steps"]),
                          str(s["episodes"]), f"{s['success']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
                          *diff, f"{s['mean_return']:.2f}", f"{s['mean_steps']:.1f}", f"{s['episodes_per_s']:.2f}",
                          "-" if s["kv_reuse"] is None else f"{s['kv_reuse']:.2f}")
        Console(width=max(Console().width, 160)).print(table)
    except ImportError:  # rich is a dependency; tabulate is the fallback for trimmed installs
        print(markdown_table(summary))
    print(notes(summary))
    files = [out / "episodes.jsonl", out / "run.json", paths["md"], paths["csv"], paths["json"],
             out / "success.png", *([curves] if curves else [])]
    print(f"\nwrote {', '.join(map(str, files))}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from echorl_agent.llm.serving import server
    except ImportError as e:
        raise SystemExit(
            f"echorl serve needs the LLM engine and the serve extra (pip install 'echorl[llm,serve]'): {e}"
        ) from e
    return int(server.serve(args) or 0)


#: ``train-llm`` flags -> LLMTrainConfig fields (JSON flags are parsed, store_true flags give True).
TRAIN_FLAGS = {"task": "env_id", "method": "method", "train_steps": "train_steps", "bc_episodes": "bc_episodes",
               "bc_epochs": "bc_epochs", "bc_learning_rate": "bc_learning_rate", "bc_batch_size": "bc_batch_size",
               "bc_dagger_rounds": "bc_dagger_rounds", "bc_dagger_episodes": "bc_dagger_episodes",
               "bc_noise": "bc_noise", "bc_noise_actions": "bc_noise_actions",
               "bc_lr_scheduler": "bc_lr_scheduler", "init_from": "init_from",
               "seed": "seed", "history": "history", "max_steps": "max_episode_steps", "n_steps": "n_steps",
               "n_envs": "n_envs", "group_size": "group_size", "step_advantage_weight": "step_advantage_weight",
               "echorl_learner": "echorl_learner", "bc_warm_start": "bc_warm_start", "gamma": "gamma",
               "env_kwargs": "env_kwargs", "eval_env_kwargs": "eval_env_kwargs", "batch_size": "batch_size", "n_epochs": "n_epochs",
               "learning_rate": "learning_rate", "policy_kwargs": "policy_kwargs", "grpo_kwargs": "grpo_kwargs",
               "gigpo_kwargs": "gigpo_kwargs", "ppo_kwargs": "ppo_kwargs", "method_kwargs": "method_kwargs",
               "checkpoint_every": "checkpoint_every", "eval_episodes": "eval_episodes", "eval_every": "eval_every",
               "eval_before": "eval_before", "env_url": "env_urls", "backend": "backend",
               "rollout_workers": "rollout_workers", "max_policy_lag": "max_policy_lag"}


def train_overrides(args: argparse.Namespace) -> dict:
    """The LLMTrainConfig fields the command line set explicitly (every train-llm flag defaults to None, so a flag
    that was not given never overrides a recipe)."""
    # JSON flags arrive parsed (argtypes.json_object)
    return {name: v for dest, name in TRAIN_FLAGS.items() if (v := getattr(args, dest, None)) is not None}


def cmd_train_llm(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.llm_rl.algorithms.options import given_options, method_options
    from echorl_agent.llm_rl.progress import describe, used
    from echorl_agent.llm_rl.recipes import resolve_config
    from echorl_agent.llm_rl.train import train_llm

    overrides = train_overrides(args)
    if "env_id" in overrides:
        _check_choices([overrides["env_id"]], echorl_envs.env_ids(), "task")
    try:
        cfg, how = resolve_config({**overrides, "out": args.out, "progress": not args.quiet}, recipe=args.recipe,
                                  config_file=args.config)
        routed = method_options(given_options(args), cfg)  # the generated flags, to the resolved learner's dict
        if routed:
            for name, opts in routed.items():
                overrides[name] = {**overrides.get(name, {}), **opts}
            cfg, how = resolve_config({**overrides, "out": args.out, "progress": not args.quiet},
                                      recipe=args.recipe, config_file=args.config)
        if not args.quiet:
            print(f"[train-llm] {cfg.method} on {cfg.env_id}, seed {cfg.seed} ({how}): {describe(cfg)}",
                  file=sys.stderr, flush=True)
        started = time.time()
        model = train_llm(cfg, resume=args.resume)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"echorl train-llm: {e}") from e
    took = time.time() - started
    written = written_since(Path(args.out), started)
    if cfg.eval_episodes and (Path(args.out) / "eval.json").exists() and "eval.json" in written:
        from echorl_agent.eval.verdict import finish

        _, line = finish(args.out)
    else:
        line = None
    if written:
        print(f"trained {used(model, cfg)} in {took:.0f} s")
    print(f"wrote {args.out}/: {', '.join(written)}" if written else
          f"{args.out}/: nothing to do, the run there is finished (raise --train-steps to train on)")
    if line:
        print(line)
    return 0


def cmd_eval_llm(args: argparse.Namespace) -> int:
    from echorl_agent.eval.verdict import finish
    from echorl_agent.llm_rl.heldout import HeldOutEval, read_episodes
    from echorl_agent.llm_rl.progress import RunProgress
    from echorl_agent.llm_rl.train import LLMTrainConfig, load_trained

    run = Path(args.run_dir)
    try:
        saved = json.loads((run / "config.json").read_text())
        model = load_trained(run)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"echorl eval-llm: {e}") from e
    episodes = args.episodes if args.episodes is not None else saved.get("eval_episodes") or 20
    over = {"eval_episodes": episodes, "eval_every": 0, "progress": not args.quiet}
    if args.eval_env_kwargs is not None:
        over["eval_env_kwargs"] = args.eval_env_kwargs
    cfg = LLMTrainConfig(**{**saved, **over})
    stage = None
    if args.bc_start:
        from echorl_agent.llm_rl.algorithms.bc.stage import open_stage

        try:  # checked against the run's own config: the one the stage was written under
            stage = open_stage(run, LLMTrainConfig(**saved))
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"echorl eval-llm --bc-start: {e} (the run's BC stage keeps its imitation start)") from e
    prog = RunProgress(not args.quiet)
    if hasattr(model, "policy"):
        prog.attach(model.policy)
    prefix = args.prefix
    ev = HeldOutEval(cfg, run, progress=prog, prefix=prefix)
    if (run / "eval_episodes.csv").exists() and args.eval_env_kwargs is None:
        # the run's own "before" (and, without --bc-start, "after_bc") episodes are on these instances: they pair
        ev.episodes = [e for e in read_episodes(run / "eval_episodes.csv") if e.seed in set(ev.seeds)
                       and (e.phase == "before" or (e.phase == "after_bc" and stage is None))]
    ev.run(model, "after", keep_rng=True)
    if stage is not None:
        from echorl_agent.llm_rl.checkpoint import load_policy

        load_policy(model.policy, stage[0], None)  # the weights at the end of BC
        ev.run(model, "after_bc", keep_rng=True)
    prog.close()
    ev.write()
    _, line = finish(run, prefix=prefix)
    print(f"wrote {run}/: {prefix}.json, {prefix}_episodes.csv")
    print(line)
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from echorl_agent.llm_rl.recipes import load_recipe, recipe_names

    if args.name:
        try:
            r = load_recipe(args.name)
        except ValueError as e:
            raise SystemExit(f"echorl recipes: {e}") from e
        print(f"{r.name}: {' '.join(r.description.split())}\nstudy: {r.study}\nexpected: {r.expected}\n"
              f"time on 2 cores: {r.time}\nregistered command: {' '.join(r.command.split())}\nsettings:")
        for k, v in r.config.items():
            print(f"  {k}: {json.dumps(v)}")
        print(f"\nrun it: echorl train-llm --recipe {r.name} --seed {r.seeds[0] if r.seeds else 0} --out runs/{r.name}")
        return 0
    rows = []
    for name in recipe_names():
        r = load_recipe(name)
        rows.append([name, r.config["env_id"].replace("EchoRL/", ""), r.config.get("method"), r.budget, r.expected,
                     r.time])
    print(tabulate(rows, headers=["recipe", "task", "method", "budget", "expected held-out success", "time on 2 cores"],
                   tablefmt="github"))
    print("\nrun one: echorl train-llm --recipe NAME [--seed S] [any flag to override]; details: echorl recipes "
          "--name NAME")
    return 0


def add_train_llm_arguments(s: argparse.ArgumentParser) -> None:
    """The train-llm flags: every one defaults to None (its help names the default) so that only flags given on the
    command line override a recipe."""
    from echorl_agent.llm_rl.algorithms.echorl.config import ECHORL_LEARNERS
    from echorl_agent.llm_rl.algorithms.registry import method_names

    s.add_argument("--recipe", help="a shipped recipe (see `echorl recipes`); flags given override its fields")
    s.add_argument("--config", metavar="FILE", help="your own recipe: a YAML or TOML file of LLMTrainConfig fields "
                   "(or a recipe file with a config: section); flags given override it")
    s.add_argument("--task", help="environment id (default: the recipe's)")
    s.add_argument("--method", choices=list(method_names()),
                   help="gigpo / bc+gigpo: critic-free group RL (K episodes per seed); grpo: free-text envs "
                        "(default: the recipe's, else bc+ppo)")
    s.add_argument("--train-steps", type=int,
                   help="RL budget in env steps (GRPO: completions), rounded UP to whole iterations: a GiGPO run "
                        "stops at the end of the first iteration at or past it, PPO collects whole rollouts of "
                        "n-steps x n-envs; the run reports the env steps it used (default: the recipe's, else 512)")
    s.add_argument("--bc-episodes", type=int, help="expert episodes (oracle answers for grpo) (default: 8)")
    s.add_argument("--bc-epochs", type=int, help="behaviour-cloning epochs over those episodes (default: 3)")
    s.add_argument("--bc-learning-rate", type=float, help="learning rate of behaviour cloning (default: --learning-rate)")
    s.add_argument("--bc-batch-size", type=int, help="minibatch of behaviour cloning (default: --batch-size)")
    s.add_argument("--bc-dagger-rounds", type=int,
                   help="DAgger rounds after BC: the cloned policy plays, the env's expert labels the states it "
                        "reached, BC again on all of them (default: 0)")
    s.add_argument("--bc-dagger-episodes", type=int, help="episodes the policy plays per DAgger round (default: 32)")
    s.add_argument("--bc-noise", type=float,
                   help="DART: probability that a step of an expert episode executes another admissible action; "
                        "the state keeps the expert's label (default: 0)")
    s.add_argument("--bc-lr-scheduler", choices=["constant", "linear", "cosine"],
                   help="the BC learning rate over each clone's optimizer steps (default: constant)")
    s.add_argument("--bc-noise-actions", nargs="+", metavar="ACTION",
                   help="the actions --bc-noise may execute, e.g. 'go forward' (default: any other admissible one)")
    s.add_argument("--init-from", metavar="RUN_DIR",
                   help="start from the LoRA adapter of an earlier run's output folder instead of the BC warm start "
                        "(or the pretrained LM): BC once, RL variants from it")
    s.add_argument("--seed", type=int, help="random seed; also picks the held-out instances (default: 0)")
    s.add_argument("--history", type=int, help="history window k in the prompt (default: 0)")
    s.add_argument("--max-steps", type=int, help="per-episode step cap, training and evaluation (default: the env's)")
    s.add_argument("--n-steps", type=int, help="PPO rollout length per env and update (default: 64)")
    s.add_argument("--n-envs", type=int,
                   help="envs stepping together, scored in one engine call per step (GiGPO: groups x group size) "
                        "(default: 1)")
    s.add_argument("--group-size", type=int, help="GiGPO: episodes per group (one seed) (default: 4)")
    s.add_argument("--step-advantage-weight", type=float,
                   help="GiGPO: omega, weight of the anchor-state step advantage; 0 = episode-level GRPO (default: 1)")
    s.add_argument("--echorl-learner", choices=list(ECHORL_LEARNERS),
                   help="echorl: the learner under the plan and the replay (gigpo: critic-free groups; ppo: echoppo "
                        "with the value head) (default: gigpo)")
    s.add_argument("--bc-warm-start", action="store_true", default=None,
                   help="echorl with the gigpo learner: behaviour-clone --bc-episodes expert episodes first")
    s.add_argument("--gamma", type=float, help="discount (default 0.99 PPO, 0.95 GiGPO)")
    s.add_argument("--env-kwargs", type=json_object('{"goal_line": true}'),
                   help='JSON of extra gym.make arguments, e.g. \'{"goal_line": true}\'')
    s.add_argument("--eval-env-kwargs", type=json_object('{"split": "valid_unseen"}'),
                   help="JSON of gym.make arguments of the held-out env, merged over --env-kwargs, e.g. "
                        "'{\"split\": \"valid_unseen\"}' (default: the training env's)")
    s.add_argument("--batch-size", type=int, help="PPO minibatch size (default: 16)")
    s.add_argument("--n-epochs", type=int, help="PPO epochs per update (default: 2)")
    s.add_argument("--learning-rate", type=float, help="optimizer learning rate (default: 1e-4)")
    s.add_argument("--policy-kwargs", type=json_object('{"lora_rank": 8, "train_layers": 2}'),
                   help='JSON LLMPolicy options, e.g. \'{"lora_rank": 8, "train_layers": 2}\'')
    s.add_argument("--grpo-kwargs", type=json_object('{"group_size": 8}'),
                   help='JSON GRPOConfig options, e.g. \'{"group_size": 8}\'')
    s.add_argument("--gigpo-kwargs", type=json_object('{"epochs": 4, "minibatch_size": 32}'),
                   help='JSON GiGPO learner options (gigpo, bc+gigpo, echorl), e.g. \'{"epochs": 4, "minibatch_size": 32}\'')
    s.add_argument("--ppo-kwargs", type=json_object('{"target_kl": 0.02}'),
                   help='JSON PPO options (ppo, bc+ppo, echoppo, echorl --echorl-learner ppo): clip_range, '
                   'target_kl, gae_lambda, vf_coef, max_grad_norm, e.g. \'{"target_kl": 0.02}\'')
    s.add_argument("--method-kwargs", type=json_object('{"discount": 0.9}'),
                   help="JSON options of a method registered after the built-in ones (its Config's "
                   "fields; each also has its own flag below)")
    s.add_argument("--eval-episodes", type=int,
                   help="held-out instances per mode (sampled and greedy) played before and after training, seeds "
                        "100000 + 1000 x seed + ep (free text: 500000 + ep); 0: no evaluation (default: the "
                        "recipe's, else 20)")
    s.add_argument("--eval-every", type=int, metavar="K",
                   help="also evaluate the held-out instances every K iterations (curve.csv heldout_* columns, "
                        "TensorBoard eval/*) (default: 0, before and after only)")
    s.add_argument("--no-eval-before", dest="eval_before", action="store_false", default=None,
                   help="skip the pretrained LM's held-out point of a run with a BC warm start (its RL start, after "
                        "BC, is still played; the verdict reads BC -> RL)")
    s.add_argument("--env-url", action="append", metavar="URL",
                   help="an `echorl serve-env --task TASK` server the training episodes play on (repeat: env i on "
                        "server i mod N; a server that fails has its episodes replayed on another from their seeds; "
                        "OUT/servers.json has env steps/s per server; docs/scaling.md) (default: in-process)")
    s.add_argument("--backend", choices=["local", "ray"],
                   help="where the training groups play: local (this process) or ray (--rollout-workers Ray actors, "
                        "each with an engine replica, weights pushed after every update; GiGPO methods; "
                        "docs/scaling.md) (default: local)")
    s.add_argument("--rollout-workers", type=int, metavar="N",
                   help="with --backend ray: rollout workers, each playing a share of every iteration's groups "
                        "(default: 1)")
    s.add_argument("--max-policy-lag", type=int, metavar="K",
                   help="with --backend ray: iterations the workers play ahead of the learner; their episodes are "
                        "played by weights up to K versions old, corrected by the truncated importance weights "
                        "(default: 0, on-policy)")
    s.add_argument("--out", default="runs/train-llm", help="output folder")
    s.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="write OUT/checkpoint/ every N iterations (GiGPO iterations, PPO updates) and at the end; "
                        "0: at the end only (not for grpo) (default: 10)")
    s.add_argument("--resume", action="store_true",
                   help="continue the run in OUT from OUT/checkpoint/ (same options; --train-steps counts from the "
                        "run's start and may grow); a missing or corrupt checkpoint is an error")
    s.add_argument("--quiet", action="store_true", help="no progress bars and no progress lines")
    import dataclasses

    from echorl_agent.llm_rl.algorithms.options import add_method_options
    from echorl_agent.llm_rl.train import LLMTrainConfig

    add_method_options(s, exclude={a.dest for a in s._actions} | {f.name for f in dataclasses.fields(LLMTrainConfig)})


def written_since(folder: Path, since: float) -> list[str]:
    """The entries of ``folder`` this run wrote (a folder counts when anything inside it was written), sorted;
    folders end with "/"."""
    def newest(p: Path) -> float:
        if not p.is_dir():
            return p.stat().st_mtime
        return max([p.stat().st_mtime, *(q.stat().st_mtime for q in p.rglob("*"))])

    # file systems with coarse timestamps may round an mtime down; one second of slack covers them
    return sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir() if newest(p) >= since - 1.0)


def cmd_record(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.eval import agents as agent_registry
    from echorl_agent.eval.record import record_episodes

    _check_choices([args.task], echorl_envs.env_ids(), "task")
    _check_choices([args.agent], agent_registry.agent_names(), "agent")
    opts = args.agent_options or {}
    try:
        path = record_episodes(args.task, agent=args.agent, episodes=args.episodes, out=args.out, format=args.format,
                               seed=args.seed, max_steps=args.max_steps, agent_options=opts,
                               dataset_id=args.dataset_id)
    except ValueError as e:
        raise SystemExit(f"echorl record: {e}") from e
    print(f"wrote {args.episodes} episodes of {args.task} ({args.agent}) to {path}")
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    import logging

    import echorl_envs

    _check_choices(args.task, echorl_envs.env_ids(), "task")
    try:
        from echorl_envs.service.server import serve
    except ImportError as e:
        raise SystemExit(f"echorl serve-env: {e}") from e
    make_kwargs = args.env_kwargs or None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    serve(args.task, host=args.host, port=args.port, max_sessions=args.max_sessions,
          session_timeout=args.session_timeout or None, web=args.web, make_kwargs=make_kwargs)
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter (each option's help ends with its default), keeping the epilog's
    line breaks; an option whose default is None, False or empty has no default worth printing, so none is added."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _agents_epilog() -> str:
    """The agent registry as a help section: one line per agent with its description."""
    from echorl_agent.eval.agents import AGENTS

    width = max(map(len, AGENTS))
    return "agents:\n" + "\n".join(f"  {name:<{width}}  {s.description}" for name, s in AGENTS.items())


def _families() -> list[str]:
    import echorl_envs

    return list(dict.fromkeys(e.family for e in echorl_envs.ENVS))


def build_parser() -> argparse.ArgumentParser:
    from echorl_agent.eval.agents import EVAL_MODES, agent_names
    from echorl_agent.llm_rl.algorithms.registry import method_names

    p = argparse.ArgumentParser(prog="echorl", description="echorl: text environments and EchoRL agents.",
                                epilog=__doc__.split("\n\n")[1], formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str, **kwargs) -> argparse.ArgumentParser:  # noqa: A002 - argparse's own name
        return sub.add_parser(name, help=help, description=kwargs.pop("description", help),
                              formatter_class=HelpFormatter, **kwargs)

    s = add("list", "list registered environment ids (family, actions, data source, max steps)")
    s.add_argument("--family", choices=_families(), help="only this family")
    s.set_defaults(func=cmd_list)

    s = add("play", "play an environment in the terminal",
            description="Play an environment in the terminal: type an action or its number;\n'history' shows "
            "the actions so far, 'quit' (or 'exit', or Ctrl-D) stops.")
    s.add_argument("id", help="environment id, e.g. EchoRL/MiniGrid-DoorKey-5x5-v0")
    s.add_argument("--seed", type=int, default=0, help="reset seed (picks the task instance)")
    s.set_defaults(func=cmd_play)

    s = add("bench", "evaluate agents side by side and write tables and plots", epilog=_agents_epilog())
    s.add_argument("--tasks", nargs="+", metavar="ID", help="environment ids (see `echorl list`)")
    s.add_argument("--agents", nargs="+", metavar="AGENT",
                   help="agent names: " + ", ".join(agent_names()) + "; NAME@LABEL runs NAME again under its own "
                        "--agent-options (e.g. backbones side by side)")
    s.add_argument("--preset", choices=["demo"], help="a predefined run ('demo': what `make demo` runs)")
    s.add_argument("--seeds", type=int, default=2,
                   help="training/evaluation seeds per (task, agent); each plays --episodes episodes")
    s.add_argument("--episodes", type=int, default=5, help="evaluation episodes per seed")
    s.add_argument("--workers", type=int, default=None, help="parallel workers (default 2; also for --preset)")
    s.add_argument("--backend", choices=["local", "ray"], default="local", help="where the workers run")
    s.add_argument("--train-steps", type=int, default=2048, help="training budget (env steps) of learned agents")
    s.add_argument("--max-steps", type=int, default=None,
                   help="cap on steps per episode, the same for every agent (default: each id's own limit)")
    s.add_argument("--eval-mode", choices=list(EVAL_MODES), default="both",
                   help="how learned agents (ppo, echoppo, dqn, ...) act at evaluation; 'both' gives one row each")
    s.add_argument("--reference", default=None,
                   help="agent the others are compared with on the same instances (default: random when it runs)")
    s.add_argument("--price-per-mtok", type=float, default=0.0, help="price per million LLM tokens (cost/success)")
    s.add_argument("--agent-options", type=json_object('{"react": {"model": "smollm2-135m"}}'),
                   help='JSON, e.g. \'{"react": {"model": "smollm2-135m"}}\'; an LLM agent on an '
                   'OpenAI-compatible endpoint: {"react@vllm": {"base_url": "http://host:8000/v1", "model": NAME}} '
                   '(API key from ECHORL_API_KEY or OPENAI_API_KEY; docs/remote-rollouts.md)')
    s.add_argument("--exclude", nargs="*", default=[], help='pairs not to run, e.g. "EchoRL/ALFWorld*:ppo"')
    s.add_argument("--out", default="runs/bench", help="output folder")
    s.add_argument("--env-url", action="append", default=[], metavar="URL",
                   help="an `echorl serve-env` server to play on (repeat to spread episodes over several)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_bench)

    s = add("record", "write an agent's trajectories as a Minari dataset or SFT-ready JSONL", epilog=_agents_epilog())
    s.add_argument("--task", required=True, help="environment id, e.g. EchoRL/MiniGrid-Empty-5x5-v0")
    s.add_argument("--agent", default="expert", help="agent name (see 'agents' below)")
    s.add_argument("--episodes", type=int, default=10, help="episodes to record")
    s.add_argument("--format", choices=["jsonl", "minari"], default="jsonl", help="dataset format")
    s.add_argument("--out", default="runs/record", help="output folder")
    s.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    s.add_argument("--max-steps", type=int, default=None, help="cap on steps per episode")
    s.add_argument("--agent-options", type=json_object('{"max_steps": 3}'),
                   help='JSON keyword arguments for the agent factory, e.g. \'{"max_steps": 3}\'')
    s.add_argument("--dataset-id", help="Minari dataset id (default echorl/<env>/<agent>-v0)")
    s.set_defaults(func=cmd_record)

    from echorl_agent.llm.serving.args import add_serve_arguments

    s = add("serve", "serve the LLM engine with OpenAI-compatible routes",
            description="Serve a model with OpenAI-compatible routes (completions, chat, streaming, LoRA adapters).")
    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)

    s = add("train-llm", "train the LLM itself by RL (LoRA): " + ", ".join(method_names()),
            description="Train the LLM itself (LoRA) and end with its held-out verdict (sampled and greedy success "
            "before -> after, paired 95% CI).\nSettings, later wins: LLMTrainConfig's defaults; the method's defaults "
            "(its best recipe's learner settings); --recipe NAME, --config FILE, or the shipped recipe on --task; the "
            "flags given (JSON flags merge key by key). `echorl recipes` lists the recipes. A flag's \"default\" below is "
            "LLMTrainConfig's; the recipe in use, or the method's best recipe, may set another (the first line of "
            "the run names the source).")
    add_train_llm_arguments(s)
    s.set_defaults(func=cmd_train_llm)

    s = add("eval-llm", "evaluate a finished train-llm run again on its held-out instances",
            description="Play a finished train-llm run's held-out instances again (sampled and greedy), paired with "
            "the run's own 'before' episodes when it has them; writes RUN_DIR/eval_again.json and "
            "eval_again_episodes.csv.")
    s.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a finished train-llm run")
    s.add_argument("--episodes", type=int, default=None,
                   help="held-out instances per mode (default: the run's --eval-episodes, else 20)")
    s.add_argument("--eval-env-kwargs", type=json_object('{"split": "valid_unseen_templates"}'),
                   help="JSON of gym.make arguments of the held-out env, merged over the run's --env-kwargs "
                        "(default: the run's own held-out env); the run's own episodes then pair with nothing")
    s.add_argument("--bc-start", action="store_true",
                   help="also play the run's imitation start (the weights at the end of its BC warm start, kept in "
                        "RUN_DIR/bc_stage/) as 'after_bc' on the same instances: the verdict reads BC -> RL")
    s.add_argument("--prefix", default="eval_again", type=again_prefix,
                   help="name of the files written into RUN_DIR (default: eval_again)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_eval_llm)

    s = add("recipes", "list the shipped train-llm recipes (task, method, budget, expected held-out figure, time)")
    s.add_argument("--name", help="show one recipe's settings and registered command")
    s.set_defaults(func=cmd_recipes)

    s = add("serve-env", "serve environments over OpenEnv (HTTP + WebSocket + /web page)")
    s.add_argument("--task", action="append", required=True, metavar="ID",
                   help="an env id to serve (repeat for several; clients pick one with reset(task=ID))")
    s.add_argument("--host", default="127.0.0.1", help="interface to bind")
    s.add_argument("--port", type=int, default=SERVE_ENV_PORT,
                   help=f"TCP port (`echorl serve` uses {SERVE_PORT}, so both can run side by side)")
    s.add_argument("--max-sessions", type=int, default=8, help="concurrent sessions, one env each")
    s.add_argument("--session-timeout", type=float, default=300.0,
                   help="close a session idle this many seconds (0: never)")
    s.add_argument("--env-kwargs", type=json_object('{"EchoRL/GSM8K-v0": {"data_path": "test.jsonl"}}'),
                   help='JSON of extra gym.make arguments per id, e.g. '
                   '\'{"EchoRL/GSM8K-v0": {"data_path": "test.jsonl"}}\'')
    s.add_argument("--web", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the browser page at /web")
    s.set_defaults(func=cmd_serve_env)
    return p


#: Deprecation warnings that third-party code raises on our behalf and that we cannot fix at our call: peft's
#: ``PeftModel.__init__`` reads transformers' deprecated ``is_gradient_checkpointing`` property (peft 0.21 with
#: transformers 5), printed once per LLM policy. Filtered for ``echorl`` commands and the worker processes they
#: spawn (through ``PYTHONWARNINGS``), each by its exact message and category.
THIRD_PARTY_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    ("`is_gradient_checkpointing` is deprecated", FutureWarning),
)


def quiet_third_party_warnings() -> None:
    """Ignore :data:`THIRD_PARTY_WARNINGS` in this process and in the processes it starts."""
    specs = [s for s in os.environ.get("PYTHONWARNINGS", "").split(",") if s]
    for message, category in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)
        spec = f"ignore:{message}:{category.__name__}"
        if spec not in specs:
            specs.append(spec)
    os.environ["PYTHONWARNINGS"] = ",".join(specs)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_third_party_warnings()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
