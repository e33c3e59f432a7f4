"""The ``echorl`` command line: list, play, bench, serve.

    echorl list
    echorl play EchoRL/MiniGrid-DoorKey-5x5-v0
    echorl bench --tasks EchoRL/Game24-v0 EchoRL/MiniGrid-Empty-5x5-v0 --agents random expert --seeds 2 --episodes 5
    echorl bench --preset demo
    echorl serve --port 8000 --model smollm2-135m
    echorl serve --help
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
#: Demo agents and the families each plays (None: all). SB3 agents train on MiniGrid only and the SmolLM2 agents
#: play short episodes, so the whole demo stays within ~10 minutes on 2 CPU cores.
DEMO_AGENTS: dict[str, tuple[str, ...] | None] = {
    "random": None,
    "expert": None,
    "ppo": ("minigrid",),
    "echoppo": ("minigrid",),
    "llm-score": ("minigrid",),
    "react": ("math",),
}
DEMO_AGENT_OPTIONS = {"llm-score": {"max_steps": 10}, "react": {"max_steps": 3}}


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
    return BenchConfig(tasks=tasks, agents=agents, out=out, seeds=2, episodes=3, workers=2, train_steps=8192,
                       agent_options={a: o for a, o in DEMO_AGENT_OPTIONS.items() if a in agents}, exclude=exclude)


def cmd_bench(args: argparse.Namespace) -> int:
    import echorl_envs
    from echorl_agent.eval import agents as agent_registry
    from echorl_agent.eval.report import markdown_table, plot_curves, plot_success, summarize, write_summary
    from echorl_agent.eval.runner import BenchConfig, run_bench

    if args.preset == "demo":
        cfg = demo_config(args.out)
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
                          episodes=args.episodes, workers=args.workers, backend=args.backend,
                          train_steps=args.train_steps, max_steps=args.max_steps,
                          price_per_mtok=args.price_per_mtok, agent_options=opts, exclude=args.exclude)
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
    summary = summarize(rows, cfg.price_per_mtok)
    paths = write_summary(summary, cfg.out)
    plot_success(summary, Path(cfg.out) / "success.png")
    curves = plot_curves(cfg.out, Path(cfg.out) / "learning_curves.png")
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"echorl bench ({len(rows)} episodes)")
        for col in ["task", "agent", "n", "Success@1 [95% CI]", "return", "steps", "ep/s", "KV reuse"]:
            table.add_column(col)
        for s in summary:
            table.add_row(s["task"].replace("EchoRL/", ""), s["agent"], str(s["episodes"]),
                          f"{s['success']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]", f"{s['mean_return']:.2f}",
                          f"{s['mean_steps']:.1f}", f"{s['episodes_per_s']:.2f}",
                          "-" if s["kv_reuse"] is None else f"{s['kv_reuse']:.2f}")
        Console(width=max(Console().width, 132)).print(table)
    except ImportError:  # rich is a dependency; tabulate is the fallback for trimmed installs
        print(markdown_table(summary))
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
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--backend", choices=["local", "ray"], default="local")
    s.add_argument("--train-steps", type=int, default=2048, help="budget for SB3-trained agents")
    s.add_argument("--max-steps", type=int, default=None, help="cap on steps per episode")
    s.add_argument("--price-per-mtok", type=float, default=0.0, help="price per million LLM tokens")
    s.add_argument("--agent-options", help='JSON, e.g. \'{"react": {"model": "smollm2-135m"}}\'')
    s.add_argument("--exclude", nargs="*", default=[], help='pairs not to run, e.g. "EchoRL/ALFWorld*:ppo"')
    s.add_argument("--out", default="runs/bench")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_bench)

    from echorl_agent.llm.serve_args import add_serve_arguments

    s = sub.add_parser("serve", help="serve the LLM engine with OpenAI-compatible routes",
                       description="Serve a model with OpenAI-compatible routes (completions, chat, streaming, "
                       "LoRA adapters).")
    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
