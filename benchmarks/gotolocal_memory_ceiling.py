"""How well can a policy that sees only the last k observations play BabyAI-GoToLocal? Planners, not the LM.

The GoToLocal recipes prompt the LM with the current observation only (``history=0``), and every imitation study
so far ends near 0.82 greedy held-out success whatever the data (BC-256, BC-1024, DAgger, DART), with greedy losses
that cycle (``benchmarks/gotolocal_losses.py``). This script asks how much of that a memoryless policy must lose. It
plays the held-out instances of a recipe study (``100000 + 1000 * seed + ep``, 24-step cap, goal line) in the real
env with:

* ``bot``: minigrid's ``BabyAIBot`` with its memory of everything seen (it labels the demonstrations);
* ``bot-fresh``: a new ``BabyAIBot`` every step, so it knows only the current view (a memoryless planner);
* ``plan-k``: a breadth-first search over (cell, heading) to a pose facing the target, on the cells seen in the last
  ``k + 1`` observations (objects block; unseen cells count as free; the room's border walls are known, as
  GoToLocal is always one 8x8 room). ``k = 0`` sees what a ``history=0`` prompt shows: the cells of the current
  view, which the observation text lists (objects with offsets, free steps ahead / left / right). Ties go to
  ``go forward``, then ``turn left``. With no target in the cells it knows, it searches: ``spin`` turns left;
  ``walk`` goes forward when 2 or more steps ahead are free, else turns left;
* ``plan-k+pickup``: the same search, also allowed to pick up one object in its way (empty-handed; minigrid's
  ``pick up`` takes the object off the grid). The bot never does; RL from BC-1024 learned to.

Every policy here is deterministic, so each instance is one episode (greedy play). A planner's figure is a lower
bound on what the best policy with that memory achieves, not the bound itself.

Run: ``python benchmarks/gotolocal_memory_ceiling.py --seeds 1310 1311 1312 1313 1314`` (rows appended to
``benchmarks/results/gotolocal_memory_ceiling.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
from collections import deque
from pathlib import Path

import gymnasium as gym
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import echorl_envs  # noqa: E402,F401  (registers the EchoRL/ ids)

__all__ = ["visible_cells", "plan_action", "play"]

ENV_ID = "EchoRL/BabyAI-GoToLocal-v0"
MAX_STEPS = 24
DIRS = [(1, 0), (0, 1), (-1, 0), (0, -1)]  # minigrid's headings: east, south, west, north
ORDER = ("go forward", "turn left", "turn right")
BOT_ACTIONS = {0: "turn left", 1: "turn right", 2: "go forward", 3: "pick up", 4: "drop", 5: "toggle", 6: "done"}
RESULTS = Path(__file__).resolve().parent / "results" / "gotolocal_memory_ceiling.jsonl"


def visible_cells(raw) -> dict[tuple[int, int], tuple[str, str] | None]:
    """The cells of the agent's current view (minigrid's visibility mask): ``(x, y) -> (type, color)`` or None."""
    vis = raw.gen_obs_grid()[1]
    n = raw.agent_view_size
    cells = {}
    for x in range(raw.width):
        for y in range(raw.height):
            vx, vy = raw.get_view_coords(x, y)
            if 0 <= vx < n and 0 <= vy < n and vis[vx, vy]:
                c = raw.grid.get(x, y)
                cells[(x, y)] = None if c is None else (c.type, c.color)
    return cells


def plan_action(raw, views: list[dict], pickup: bool = False) -> str | None:
    """The first action of a shortest path to a pose facing the target, on the cells in ``views``; None when no
    target is among them. ``pickup``: the path may also pick up one object in its way (empty-handed only; the object
    leaves the grid, as minigrid's ``pick up`` does), which the bot never does."""
    known: dict = {}
    for v in views:  # oldest first: the current view has the last word
        known.update(v)
    want_type, want_color = raw.instrs.desc.type, raw.instrs.desc.color
    targets = {p for p, c in known.items() if c is not None and c[0] == want_type
               and (want_color is None or c[1] == want_color)}
    if not targets:
        return None
    walls = {(x, y) for x in range(raw.width) for y in range(raw.height)
             if x in (0, raw.width - 1) or y in (0, raw.height - 1)}
    walls |= {p for p, c in known.items() if c is not None and c[0] == "wall"}
    objects = {p for p, c in known.items() if c is not None and c[0] != "wall"}
    can_lift = pickup and raw.carrying is None
    start = (int(raw.agent_pos[0]), int(raw.agent_pos[1]), int(raw.agent_dir), None)
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        x, y, d, lifted = s
        front = (x + DIRS[d][0], y + DIRS[d][1])
        if front in targets:
            if parent[s] is None:
                return None  # already facing it: the episode has ended
            while parent[s][0] != start:
                s = parent[s][0]
            return parent[s][1]
        for a in ORDER + (("pick up",) if can_lift else ()):
            if a == "go forward":
                if front in walls or (front in objects and front != lifted):
                    continue
                nxt = (front[0], front[1], d, lifted)
            elif a == "pick up":
                if lifted is not None or front not in objects:
                    continue
                nxt = (x, y, d, front)
            else:
                nxt = (x, y, (d - 1) % 4 if a == "turn left" else (d + 1) % 4, lifted)
            if nxt not in parent:
                parent[nxt] = (s, a)
                queue.append(nxt)
    return None


def _free_ahead(obs: str) -> int:
    m = re.search(r"^Ahead: (\d+) steps? free", obs, re.M)
    return int(m.group(1)) if m else 0


def play(policy: str, seed: int, memory: int = 0, search: str = "spin", pickup: bool = False) -> tuple[bool, int]:
    """One greedy episode of ``policy`` (``bot``, ``bot-fresh`` or ``plan``) from ``seed``: ``(won, steps)``.
    ``pickup``: the planner may pick up an object in its way (:func:`plan_action`)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = gym.make(ENV_ID, goal_line=True, max_episode_steps=MAX_STEPS, expert=policy == "bot")
    try:
        obs, info = env.reset(seed=seed)
        raw = env.unwrapped.raw
        views: list[dict] = []
        for t in range(MAX_STEPS):
            if policy == "bot":
                a = info["expert_action"]
            elif policy == "bot-fresh":
                a = BOT_ACTIONS[int(BabyAIBot(raw).replan())]
            else:
                views = (views + [visible_cells(raw)])[-(memory + 1):]
                a = plan_action(raw, views, pickup)
                if a is None:
                    a = "go forward" if search == "walk" and _free_ahead(obs) >= 2 else "turn left"
            obs, reward, terminated, truncated, info = env.step(a)
            if terminated or truncated:
                return bool(terminated and reward > 0), t + 1
        return False, MAX_STEPS
    finally:
        env.close()


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        meta = {"date": datetime.date.today().isoformat(), "machine": _cpu(),
                "command": "python benchmarks/gotolocal_memory_ceiling.py " + " ".join(argv or sys.argv[1:]),
                "study_seeds": args.seeds}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with open(RESULTS, "a") as f:
            for r in rows:
                f.write(json.dumps({**meta, **r}) + "\n")


if __name__ == "__main__":
    main()
