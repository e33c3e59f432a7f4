"""How well can a policy that sees only the last k observations play BabyAI-GoToLocal? Planners, not the LM.

The GoToLocal recipes prompt the LM with the current observation only (``history=0``), and every imitation study
so far ends near 0.82 greedy held-out success whatever the data (BC-256, BC-1024, DAgger, DART), with greedy losses
that cycle (``benchmarks/gotolocal_losses.py``). This script asks how much of that a memoryless policy must lose. It
plays the held-out instances of a recipe study (``100000 + 1000 * seed + ep``, 24-step cap, goal line) in the real
env with:

* ``bot``: minigrid's ``BabyAIBot`` with its memory of everything seen (it labels the demonstrations);
* ``bot-fresh``: a new ``BabyAIBot`` every step, so it knows only the current view (a memoryless planner);
* ``plan-k``: :func:`echorl_envs.minigrid.planner.view_plan`, a breadth-first search over (cell, heading) to a pose facing the target, on the cells seen in the last
  ``k + 1`` observations (objects block; unseen cells count as free; the room's border walls are known, as
  GoToLocal is always one 8x8 room). ``k = 0`` sees what a ``history=0`` prompt shows: the cells of the current
  view, which the observation text lists (objects with offsets, free steps ahead / left / right). Ties go to
  ``go forward``, then ``turn left``. With no target in the cells it knows, it searches: ``spin`` turns left;
  ``walk`` goes forward when 2 or more steps ahead are free, else turns left;
* ``plan-k+pickup``: the same search, also allowed to pick up one object in its way (empty-handed; minigrid's
  ``pick up`` takes the object off the grid). The bot does in 6 of 1,280 demonstration episodes (and drops it again); RL from
  BC-1024 learned to. ``plan-0+pickup``
  with ``spin`` is the env's ``expert_kind="view"`` expert (:class:`~echorl_envs.minigrid.planner.ViewPlanner`).

Every policy here is deterministic, so each instance is one episode (greedy play). A planner's figure is a lower
bound on what the best policy with that memory achieves, not the bound itself.

Run: ``python benchmarks/gotolocal_memory_ceiling.py --seeds 1310 1311 1312 1313 1314`` (rows appended to
``benchmarks/results/gotolocal_memory_ceiling.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

import gymnasium as gym
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import echorl_envs  # noqa: E402,F401  (registers the EchoRL/ ids)
from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_envs.minigrid.env import ACTION_WORDS  # noqa: E402
from echorl_envs.minigrid.planner import ViewPlanner  # noqa: E402

__all__ = ["play"]

ENV_ID = "EchoRL/BabyAI-GoToLocal-v0"
MAX_STEPS = 24
RESULTS = Path(__file__).resolve().parent / "results" / "gotolocal_memory_ceiling.jsonl"


def _free_ahead(obs: str) -> int:
    m = re.search(r"^Ahead: (\d+) steps? free", obs, re.M)
    return int(m.group(1)) if m else 0


def play(policy: str, seed: int, memory: int = 0, search: str = "spin", pickup: bool = False) -> tuple[bool, int]:
    """One greedy episode of ``policy`` (``bot``, ``bot-fresh`` or ``plan``) from ``seed``: ``(won, steps)``.
    ``pickup``: the planner may pick up an object in its way (:class:`echorl_envs.minigrid.planner.ViewPlanner`)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = gym.make(ENV_ID, goal_line=True, max_episode_steps=MAX_STEPS, expert=policy == "bot")
    try:
        obs, info = env.reset(seed=seed)
        raw = env.unwrapped.raw
        planner = ViewPlanner(raw, memory, pickup) if policy == "plan" else None
        for t in range(MAX_STEPS):
            if policy == "bot":
                a = info["expert_action"]
            elif policy == "bot-fresh":
                a = ACTION_WORDS[int(BabyAIBot(raw).replan())]
            elif search == "walk" and not planner.found and _free_ahead(obs) >= 2:
                a = "go forward"
            else:
                a = ACTION_WORDS[planner.action]  # its search when no target is known: turn left
            obs, reward, terminated, truncated, info = env.step(a)
            if planner is not None:
                planner.observe(ACTION_WORDS.index(a))
            if terminated or truncated:
                return bool(terminated and reward > 0), t + 1
        return False, MAX_STEPS
    finally:
        env.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="study seeds: their held-out instances")
    p.add_argument("--episodes", type=int, default=40, help="held-out episodes per study seed")
    p.add_argument("--memory", type=int, nargs="+", default=[0, 1, 2], help="plan-k: observations remembered")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    instances = [100000 + 1000 * s + ep for s in args.seeds for ep in range(args.episodes)]
    policies = [("bot", "bot", 0, "-", False), ("bot-fresh", "bot-fresh", 0, "-", False)]
    policies += [(f"plan-{k}{'+pickup' * lift}", "plan", k, search, lift) for lift in (False, True)
                 for k in args.memory for search in ("spin", "walk")]
    rows = []
    for name, kind, k, search, lift in policies:
        got = [play(kind, s, k, search, lift) for s in instances]
        won = [w for w, _ in got]
        rows.append({"policy": name, "memory": "all" if name == "bot" else k, "search": search, "pickup": lift,
                     "success": round(sum(won) / len(won), 4), "episodes": len(won),
                     "mean_steps": round(sum(n for _, n in got) / len(got), 2)})
    print(tabulate([[r["policy"], r["memory"], r["search"], f"{r['success']:.3f}", r["episodes"], r["mean_steps"]]
                    for r in rows], headers=["policy", "observations remembered", "search", "success", "episodes",
                                             "mean steps"]))
    if not args.no_write:
        meta = {"date": datetime.date.today().isoformat(), "machine": cpu_name(),
                "command": "python benchmarks/gotolocal_memory_ceiling.py " + " ".join(argv or sys.argv[1:]),
                "study_seeds": args.seeds}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with open(RESULTS, "a") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")


if __name__ == "__main__":
    main()
