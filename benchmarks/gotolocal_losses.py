"""Why held-out BabyAI episodes are lost: replay a study's episodes in the real env beside BabyAI's bot.

Reads a recipe study's committed summary (``benchmarks/results/<study>.jsonl``, written by
``benchmarks/recipe_study.py summarize``: every held-out episode's actions), replays each episode from its seed in
the env the recipe trains on (``gym.make`` with the recipe's ``env_kwargs`` and step cap), and at every state it
reached asks the bot (``info["expert_action"]``) what it would do. Prints, per phase and mode:

* ``bot agreement``: the share of the policy's steps that take the expert's action (all episodes, then lost ones):
  BabyAI's bot, or the expert the run imitated (``--env-kwargs '{"expert_kind": "view"}'``);
* ``lost``: lost episodes; ``target seen late``: those whose goal line named the target in view at least once in
  their last 12 steps (a navigation failure, not a search one); ``cycle``: those whose last 12 steps revisit a
  (cell, heading) (greedy play of a memoryless policy in a deterministic env then repeats for ever); ``bump``: those
  with a ``go forward`` that did not move (the cell ahead was taken: the next state reads "You cannot move
  forward", a state the bot's own episodes never reach);
* the disagreements of lost episodes by what the state showed: where the target was (``not in view``, ``ahead``,
  ``ahead-left``, ``left``...) and whether the cell ahead is blocked, with the policy's and the bot's action.

The bot's label of a state depends on its own map memory, which replays identically because every action is the
same, so the labels are the ones the bot would have given during the episode.

Run: ``python benchmarks/gotolocal_losses.py --study gotolocal-bc256-grpo-small-step --phase after_bc``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import gymnasium as gym
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import echorl_envs  # noqa: E402,F401  (registers the EchoRL/ ids)
from benchmarks.recipe_study import MODES, RESULTS, load  # noqa: E402

__all__ = ["replay", "relation", "report"]

LATE = 12
"""The last steps of a lost episode read for a sighting of the target and for a revisited (cell, heading)."""


def relation(obs: str) -> str:
    """Where the goal line puts the target (``not in view``, ``ahead``, ``left``, ``ahead-right``, ``here``), and
    ``, blocked`` when the cell ahead is taken (``Ahead: ... right next to you``)."""
    m = re.search(r"^Target: (.*)$", obs, re.M)
    if m is None:
        raise ValueError("relation needs an observation with the goal line (env_kwargs goal_line=True)")
    text = m.group(1)
    if "not in view" in text:
        where = "not in view"
    else:
        parts = [p for p, word in (("ahead", "ahead"), ("left", "to the left"), ("right", "to the right"))
                 if word in text]
        where = "-".join(parts) or "here"
    ahead = re.search(r"^Ahead: (.*)$", obs, re.M)
    blocked = ahead is not None and "right next to you" in ahead.group(1)
    return where + (", blocked" if blocked else "")


def replay(env_id: str, env_kwargs: dict, max_steps: int, seed: int, actions: list[str]) -> dict:
    """Play ``actions`` from ``seed``; per step the state's relation, the bot's action and the (cell, heading)."""
    env = gym.make(env_id, max_episode_steps=max_steps, **env_kwargs)
    try:
        obs, info = env.reset(seed=seed)
        steps, won = [], False
        for a in actions:
            where = relation(obs)
            steps.append({"relation": where, "seen": "not in view" not in where, "bot": info.get("expert_action"),
                          "policy": a,
                          "pose": (tuple(info["agent_pos"]), int(info["direction"]))})
            obs, reward, terminated, truncated, info = env.step(a)
            won = bool(terminated and reward > 0)
            if terminated or truncated:
                break
        return {"won": won, "steps": steps}
    finally:
        env.close()


def _recipe_env(row: dict) -> tuple[str, dict, int]:
    """The env the run trained on (``env_id``, ``env_kwargs``, step cap): its saved ``train-llm`` command read by the
    CLI's own parser and resolved over its recipe as ``train-llm`` resolves it (so ``--env-kwargs`` such as
    ``expert_kind`` and ``--max-steps`` count: the replay's expert is the one the run imitated)."""
    import shlex

    from echorl_agent.cli import add_train_llm_arguments, train_overrides
    from echorl_agent.llm_rl.recipes import resolve_config

    words = shlex.split(row["command"])
    parser = argparse.ArgumentParser(add_help=False)
    add_train_llm_arguments(parser)
    args, _ = parser.parse_known_args(words[words.index("train-llm") + 1:])
    cfg, _ = resolve_config(train_overrides(args), recipe=args.recipe, config_file=args.config)
    return cfg.env_id, dict(cfg.env_kwargs), int(cfg.max_episode_steps)


def report(rows: list[dict], phase: str, top: int = 10) -> tuple[list[list], Counter]:
    """One line per mode (the columns of the module docstring) and the disagreements of lost episodes."""
    lines, confusions = [], Counter()
    for mode in MODES:
        agree = agree_lost = n = n_lost = lost = seen_late = cycles = bumps = 0
        for row in rows:
            point = row.get("phases", {}).get(phase, {}).get(mode)
            if point is None:
                continue
            env_id, env_kwargs, max_steps = _recipe_env(row)
            for ep, codes in enumerate(point["actions"]):
                got = replay(env_id, env_kwargs, max_steps, point["episode_seed0"] + ep,
                             [row["vocab"][c] for c in codes])
                if got["won"] != (point["won"][ep] == "1"):
                    raise SystemExit(f"seed {row['seed']} {phase} {mode} episode {ep}: the replay's outcome differs "
                                     "from the summary's (env or recipe changed since the run)")
                same = sum(s["policy"] == s["bot"] for s in got["steps"])
                agree, n = agree + same, n + len(got["steps"])
                if got["won"]:
                    continue
                lost += 1
                agree_lost, n_lost = agree_lost + same, n_lost + len(got["steps"])
                tail = got["steps"][-LATE:]
                seen_late += any(s["seen"] for s in tail)
                cycles += len({s["pose"] for s in tail}) < len(tail)
                st = got["steps"]
                bumps += any(a["policy"] == "go forward" and a["pose"] == b["pose"] for a, b in zip(st, st[1:], strict=False))
                confusions.update((mode, s["relation"], s["policy"], s["bot"]) for s in got["steps"]
                                  if s["policy"] != s["bot"])
        if n:
            lines.append([phase, mode, f"{agree / n:.2f}", f"{agree_lost / n_lost:.2f}" if n_lost else "-", lost,
                          seen_late, cycles, bumps])
    return lines, confusions


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", required=True)
    p.add_argument("--phase", default="after", choices=("before", "after_bc", "after"))
    p.add_argument("--seeds", type=int, nargs="*", help="only these seeds (default: every seed in the summary)")
    p.add_argument("--top", type=int, default=12, help="disagreement kinds printed per mode")
    args = p.parse_args(argv)
    if not (RESULTS / f"{args.study}.jsonl").is_file():
        raise SystemExit(f"no summary of {args.study}: run `python benchmarks/recipe_study.py summarize --study "
                         f"{args.study}` first")
    rows = [r for r in load(args.study) if not args.seeds or r["seed"] in args.seeds]
    lines, confusions = report(rows, args.phase)
    print(tabulate(lines, headers=["phase", "mode", "bot agreement", "in lost", "lost", "target seen late",
                                   "cycle", "bump"]))
    for mode in MODES:
        mine = Counter({k[1:]: v for k, v in confusions.items() if k[0] == mode})
        if mine:
            print(f"\n{mode}: disagreements in lost episodes (state, policy, bot)")
            print(tabulate([[*k, v] for k, v in mine.most_common(args.top)],
                           headers=["target", "policy", "bot", "steps"]))


if __name__ == "__main__":
    main()
