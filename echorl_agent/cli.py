"""The ``echorl`` command line: list, play, bench, record, serve.

    echorl list
    echorl play EchoRL/MiniGrid-DoorKey-5x5-v0
    echorl bench --tasks EchoRL/Game24-v0 EchoRL/MiniGrid-Empty-5x5-v0 --agents random expert --seeds 2 --episodes 5
    echorl bench --preset demo
    echorl train-llm --task EchoRL/MiniGrid-Empty-5x5-v0 --method bc+ppo --train-steps 256 --out runs/llm
    echorl record --task EchoRL/MiniGrid-Empty-5x5-v0 --agent expert --episodes 10 --format minari --out runs/data
    echorl serve --port 8000 --model smollm2-135m
    echorl serve --help
    echorl serve-env --task EchoRL/ALFWorld-v0 --task EchoRL/MiniGrid-DoorKey-5x5-v0 --port 8001 --max-sessions 8
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

__all__ = ["main", "demo_config"]

#: One representative task per family for the demo preset (families not installed are left out).
DEMO_TASKS = {
    "minigrid": "EchoRL/MiniGrid-Empty-5x5-v0",
    "math": "EchoRL/Game24-v0",
    "alfworld": "EchoRL/ALFWorld-PickAndPlace-v0",
    "textworld": "EchoRL/TextWorld-CoinCollector-v0",
    "webshop": "EchoRL/WebShop-v0",
    "cruxeval": "EchoRL/CRUXEval-O-v0",
    "arc": "EchoRL/ARC-v0",
}
#: Demo agents and the families each plays (None: all). SB3 agents train on MiniGrid only.
DEMO_AGENTS: dict[str, tuple[str, ...] | None] = {
    "random": None,
    "expert": None,
    "ppo": ("minigrid",),
    "echoppo": ("minigrid",),
    "llm-score": ("minigrid",),
    "react": ("math",),
}
#: Deliberate unequal budgets, shown in the demo table (columns "max steps" and "n") and its notes: the SmolLM2
#: agents take ~0.5-2 s per step on 2 CPU cores, so they play 4 episodes per seed with a step cap (10 on MiniGrid,
#: 3 attempts on Game24) while every other agent plays all episodes under the env's own limit.
DEMO_AGENT_OPTIONS = {"llm-score": {"max_steps": 10, "episodes": 4}, "react": {"max_steps": 3, "episodes": 4}}
#: 2 training seeds x 20 episodes = 40 paired instances per (task, agent): enough for the expert/random and
#: EchoPPO/PPO-deterministic gaps to be significant; the table marks which differences are.
DEMO_SEEDS, DEMO_EPISODES, DEMO_TRAIN_STEPS = 2, 20, 8192


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
    print(f"Task: {info['task']}\n\n{obs}")
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
    from echorl_agent.eval.report import (
        markdown_table,
        notes,
        plot_curves,
        plot_success,
        summarize,
        write_summary,
    )
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
        opts = json.loads(args.agent_options) if args.agent_options else {}
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
    ref = cfg.reference_agent()
    summary = summarize(rows, cfg.price_per_mtok, reference=ref)
    paths = write_summary(summary, cfg.out)
    plot_success(summary, Path(cfg.out) / "success.png")
    curves = plot_curves(cfg.out, Path(cfg.out) / "learning_curves.png")
    try:
        from rich.console import Console
        from rich.table import Table

        from echorl_agent.eval.report import _diff_cell

        table = Table(title=f"echorl bench ({len(rows)} episodes)")
        for col in ["task", "agent", "mode", "max steps", "n", "Success@1 [95% CI]", f"Δ vs {ref} [95% CI]",
                    "McNemar p", "return", "steps", "ep/s", "KV reuse"]:
            table.add_column(col)
        for s in summary:
            table.add_row(s["task"].replace("EchoRL/", ""), s["agent"], s["mode"], str(s["max_steps"]),
                          str(s["episodes"]), f"{s['success']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
                          _diff_cell(s), "-" if s["mcnemar_p"] is None else f"{s['mcnemar_p']:.2g}",
                          f"{s['mean_return']:.2f}", f"{s['mean_steps']:.1f}", f"{s['episodes_per_s']:.2f}",
                          "-" if s["kv_reuse"] is None else f"{s['kv_reuse']:.2f}")
        Console(width=max(Console().width, 160)).print(table)
    except ImportError:  # rich is a dependency; tabulate is the fallback for trimmed installs
        print(markdown_table(summary))
    print(notes(summary))
    print(f"\nwrote {paths['md']}, {paths['csv']}, {paths['json']}, {Path(cfg.out) / 'success.png'}"
          + (f", {curves}" if curves else ""))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from echorl_agent.llm import server
    except ImportError as e:
        raise SystemExit(
            f"echorl serve needs the LLM engine and the serve extra (pip install 'echorl[llm,serve]'): {e}"
        ) from e
    return int(server.serve(args) or 0)


def cmd_train_llm(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    _check_choices([args.task], echorl_envs.env_ids(), "task")
    try:
        cfg = LLMTrainConfig(
            env_id=args.task, method=args.method, train_steps=args.train_steps, bc_episodes=args.bc_episodes,
            bc_epochs=args.bc_epochs, seed=args.seed, history=args.history, max_episode_steps=args.max_steps,
            n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
            learning_rate=args.learning_rate, policy_kwargs=json.loads(args.policy_kwargs or "{}"),
            grpo_kwargs=json.loads(args.grpo_kwargs or "{}"), env_kwargs=json.loads(args.env_kwargs or "{}"),
            n_envs=args.n_envs, gamma=args.gamma, group_size=args.group_size,
            step_advantage_weight=args.step_advantage_weight, out=args.out, progress=not args.quiet)
        train_llm(cfg)
    except ValueError as e:
        raise SystemExit(f"echorl train-llm: {e}") from e
    print(f"wrote {args.out}/ (curve.csv, model.zip or adapter/, tb/, config.json)")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.eval import agents as agent_registry
    from echorl_agent.eval.record import record_episodes

    _check_choices([args.task], echorl_envs.env_ids(), "task")
    _check_choices([args.agent], agent_registry.agent_names(), "agent")
    opts = json.loads(args.agent_options) if args.agent_options else {}
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
        from echorl_envs.serve import serve
    except ImportError as e:
        raise SystemExit(f"echorl serve-env: {e}") from e
    make_kwargs = json.loads(args.env_kwargs) if args.env_kwargs else None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    serve(args.task, host=args.host, port=args.port, max_sessions=args.max_sessions,
          session_timeout=args.session_timeout or None, web=args.web, make_kwargs=make_kwargs)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echorl", description="echorl: text environments and EchoRL agents.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="list registered environment ids")
    s.add_argument("--family", help="only this family (minigrid, math, alfworld, ...)")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("play", help="play an environment in the terminal (type an action or its number)")
    s.add_argument("id", help="environment id, e.g. EchoRL/MiniGrid-DoorKey-5x5-v0")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_play)

    s = sub.add_parser("bench", help="evaluate agents side by side and write tables and plots")
    s.add_argument("--tasks", nargs="+", help="environment ids")
    s.add_argument("--agents", nargs="+", help="agent names (random, expert, ppo, maskable-ppo, dqn, echoppo, "
                   "react, llm-score, tot, echorl)")
    s.add_argument("--preset", choices=["demo"], help="a predefined run ('demo': what `make demo` runs)")
    s.add_argument("--seeds", type=int, default=2)
    s.add_argument("--episodes", type=int, default=5)
    s.add_argument("--workers", type=int, default=None, help="parallel workers (default 2; also for --preset)")
    s.add_argument("--backend", choices=["local", "ray"], default="local")
    s.add_argument("--train-steps", type=int, default=2048, help="budget for SB3-trained agents")
    s.add_argument("--max-steps", type=int, default=None,
                   help="cap on steps per episode, the same for every agent (default: each id's own limit)")
    s.add_argument("--eval-mode", choices=["deterministic", "stochastic", "both"], default="both",
                   help="how learned agents (ppo, echoppo, dqn, ...) act at evaluation; 'both' gives one row each")
    s.add_argument("--reference", default=None,
                   help="agent the others are compared with on the same instances (default: random when it runs)")
    s.add_argument("--price-per-mtok", type=float, default=0.0, help="price per million LLM tokens")
    s.add_argument("--agent-options", help='JSON, e.g. \'{"react": {"model": "smollm2-135m"}}\'')
    s.add_argument("--exclude", nargs="*", default=[], help='pairs not to run, e.g. "EchoRL/ALFWorld*:ppo"')
    s.add_argument("--out", default="runs/bench")
    s.add_argument("--env-url", action="append", default=[], metavar="URL",
                   help="an `echorl serve-env` server to play on (repeat to spread episodes over several)")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("record", help="write an agent's trajectories as a Minari dataset or SFT-ready JSONL")
    s.add_argument("--task", required=True, help="environment id, e.g. EchoRL/MiniGrid-Empty-5x5-v0")
    s.add_argument("--agent", default="expert", help="agent name (default: expert)")
    s.add_argument("--episodes", type=int, default=10)
    s.add_argument("--format", choices=["jsonl", "minari"], default="jsonl")
    s.add_argument("--out", default="runs/record", help="output folder")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-steps", type=int, default=None, help="cap on steps per episode")
    s.add_argument("--agent-options", help='JSON keyword arguments for the agent factory')
    s.add_argument("--dataset-id", help="Minari dataset id (default echorl/<env>/<agent>-v0)")
    s.set_defaults(func=cmd_record)

    from echorl_agent.llm.serve_args import add_serve_arguments

    s = sub.add_parser("serve", help="serve the LLM engine with OpenAI-compatible routes",
                       description="Serve a model with OpenAI-compatible routes (completions, chat, streaming, "
                       "LoRA adapters).")
    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)
    from echorl_agent.llm_rl.train import METHODS

    s = sub.add_parser("train-llm", help="train the LLM itself by RL (LoRA): BC, PPO, EchoPPO, GiGPO or GRPO")
    s.add_argument("--task", required=True, help="environment id")
    s.add_argument("--method", default="bc+ppo", choices=list(METHODS),
                   help="gigpo / bc+gigpo: critic-free group RL (K episodes per seed); grpo: free-text envs")
    s.add_argument("--train-steps", type=int, default=512, help="PPO env steps / GRPO completions")
    s.add_argument("--bc-episodes", type=int, default=8, help="expert episodes (oracle answers for grpo)")
    s.add_argument("--bc-epochs", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--history", type=int, default=0, help="history window k in the prompt")
    s.add_argument("--max-steps", type=int, default=None, help="per-episode step cap while training")
    s.add_argument("--n-steps", type=int, default=64, help="PPO rollout length per update")
    s.add_argument("--n-envs", type=int, default=1,
                   help="envs stepping together, scored in one engine call per step (GiGPO: groups x group size)")
    s.add_argument("--group-size", type=int, default=4, help="GiGPO: episodes per group (one seed)")
    s.add_argument("--step-advantage-weight", type=float, default=1.0,
                   help="GiGPO: omega, weight of the anchor-state step advantage")
    s.add_argument("--gamma", type=float, default=None, help="discount (default 0.99 PPO, 0.95 GiGPO)")
    s.add_argument("--env-kwargs", help='JSON of extra gym.make arguments, e.g. \'{"env_kwargs": {"max_steps": 32}}\'')
    s.add_argument("--batch-size", type=int, default=16)
    s.add_argument("--n-epochs", type=int, default=2)
    s.add_argument("--learning-rate", type=float, default=1e-4)
    s.add_argument("--policy-kwargs", help='JSON LLMPolicy options, e.g. \'{"lora_rank": 8, "train_layers": 2}\'')
    s.add_argument("--grpo-kwargs", help='JSON GRPOConfig options, e.g. \'{"group_size": 8}\'')
    s.add_argument("--out", default="runs/train-llm")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_train_llm)

    s = sub.add_parser("serve-env", help="serve environments over OpenEnv (HTTP + WebSocket + /web page)")
    s.add_argument("--task", action="append", required=True,
                   help="an env id to serve (repeat for several; clients pick one with reset(task=ID))")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-sessions", type=int, default=8, help="concurrent sessions, one env each")
    s.add_argument("--session-timeout", type=float, default=300.0,
                   help="close a session idle this many seconds (0: never)")
    s.add_argument("--env-kwargs", help='JSON of extra gym.make arguments per id, e.g. '
                   '\'{"EchoRL/GSM8K-v0": {"data_path": "test.jsonl"}}\'')
    s.add_argument("--web", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the browser page at /web (default: on)")
    s.set_defaults(func=cmd_serve_env)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
