"""Experts for MiniGrid/BabyAI text envs: minigrid's BabyAI bot, and a BFS planner for goal-square tasks.

The BFS planner searches the true (fully observed) grid for the shortest action sequence that reaches a
goal square, over states ``(x, y, direction, carried key colour, picked-up key, opened doors)``, with
minigrid's own action semantics (``MiniGridEnv.step``): ``left``/``right`` rotate, ``forward`` moves onto a
cell whose object ``can_overlap`` (empty, floor, goal, open door, lava -- lava is avoided), ``pickup`` takes
a key in front when the hands are empty, ``toggle`` opens a closed door or unlocks a locked one when the
carried key has the door's colour (``Door.toggle``). That covers Empty, DoorKey, FourRooms and MultiRoom.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from minigrid.core.actions import Actions

__all__ = ["GoalPlanner", "BabyAIExpert", "ViewPlanner", "bfs_plan", "nav_distances", "view_plan", "visible_cells"]

logger = logging.getLogger(__name__)

_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid DIR_TO_VEC
_OPEN, _CLOSED, _LOCKED, _KEY, _GOAL, _BLOCK = range(6)


def _static_cells(env: Any) -> dict[tuple[int, int], tuple[int, str]]:
    """Non-empty cells of ``env.grid`` as ``pos -> (kind, colour)``; absent positions are empty."""
    cells: dict[tuple[int, int], tuple[int, str]] = {}
    grid = env.grid
    for idx, obj in enumerate(grid.grid):
        if obj is None:
            continue
        pos = (idx % grid.width, idx // grid.width)
        t = obj.type
        if t == "door":
            kind = _OPEN if obj.is_open else (_LOCKED if obj.is_locked else _CLOSED)
        elif t == "key":
            kind = _KEY
        elif t == "goal":
            kind = _GOAL
        elif t == "floor":
            continue
        else:  # wall, lava, ball, box
            kind = _BLOCK
        cells[pos] = (kind, obj.color)
    return cells


def bfs_plan(env: Any, max_states: int = 200_000) -> list[int] | None:
    """Shortest list of minigrid action indices taking the agent onto a goal square, or ``None``.

    Args:
        env: an unwrapped, reset ``MiniGridEnv``.
        max_states: search budget (the registered grids need at most a few thousand states).
    """
    cells = _static_cells(env)
    held = env.carrying
    carry = (
        held.color if held is not None and held.type == "key" else ("<other>" if held is not None else None)
    )
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir), carry, None, frozenset())
    parent: dict[tuple, tuple[tuple, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        x, y, d, carry, picked, opened = state
        fx, fy = x + _VEC[d][0], y + _VEC[d][1]
        kind, color = cells.get((fx, fy), (-1, ""))
        if (kind == _KEY and (fx, fy) == picked) or ((fx, fy) in opened):
            kind = -1
        succ: list[tuple[int, tuple]] = [
            (Actions.left, (x, y, (d - 1) % 4, carry, picked, opened)),
            (Actions.right, (x, y, (d + 1) % 4, carry, picked, opened)),
        ]
        if kind in (-1, _OPEN, _GOAL):
            nxt = (fx, fy, d, carry, picked, opened)
            if kind == _GOAL:
                return _unwind(parent, state, Actions.forward)
            succ.append((Actions.forward, nxt))
        elif kind == _KEY and carry is None and picked is None:
            succ.append((Actions.pickup, (x, y, d, color, (fx, fy), opened)))
        elif kind == _CLOSED or (kind == _LOCKED and carry == color):
            succ.append((Actions.toggle, (x, y, d, carry, picked, opened | {(fx, fy)})))
        for action, nxt in succ:
            if nxt not in parent:
                parent[nxt] = (state, int(action))
                if len(parent) > max_states:
                    return None
                queue.append(nxt)
    return None


def _unwind(parent: dict, state: tuple, last: int) -> list[int]:
    actions = [int(last)]
    link = parent[state]
    while link is not None:
        state, action = link
        actions.append(action)
        link = parent[state]
    actions.reverse()
    return actions


def nav_distances(env: Any) -> dict[tuple[int, int, int], int] | None:
    """Actions-to-goal of every ``(x, y, direction)`` when the level is pure navigation, else ``None``.

    A multi-source reverse BFS from the goal squares over left/right/forward moves. Valid only while no
    door is closed or locked (then toggling or picking up a key can never shorten a path, so these
    distances equal :func:`bfs_plan`'s plan lengths); with a closed door it returns ``None``.
    """
    cells = _static_cells(env)
    if any(kind in (_CLOSED, _LOCKED) for kind, _ in cells.values()):
        return None

    def walkable(pos: tuple[int, int]) -> bool:
        return cells.get(pos, (-1, ""))[0] in (-1, _OPEN)

    dist: dict[tuple[int, int, int], int] = {}
    queue: deque[tuple[int, int, int]] = deque()
    for (gx, gy), (kind, _) in cells.items():
        if kind != _GOAL:
            continue
        for d, (dx, dy) in enumerate(_VEC):
            s = (gx - dx, gy - dy, d)
            if walkable(s[:2]) and s not in dist:
                dist[s] = 1
                queue.append(s)
    while queue:
        x, y, d = s = queue.popleft()
        dx, dy = _VEC[d]
        # predecessors: turning left from d+1 or right from d-1 lands on d; forward from one cell behind
        for p in ((x, y, (d + 1) % 4), (x, y, (d - 1) % 4), (x - dx, y - dy, d)):
            if p not in dist and walkable(p[:2]):
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


class GoalPlanner:
    """Expert for goal-square levels: BFS plans, with an O(1)-per-step distance table for navigation.

    While a door is closed or locked, the cached :func:`bfs_plan` is followed and recomputed only when the
    agent deviates from it. Once the level is pure navigation (no closed doors), a
    :func:`nav_distances` table answers every step, whatever the agent did, until the grid changes.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.nav: dict[tuple[int, int, int], int] | None = None
        self.plan: list[int] | None = None
        self._replan()

    def _replan(self) -> None:
        self.nav = nav_distances(self.env)
        self.plan = None if self.nav is not None else bfs_plan(self.env)

    def next_action(self) -> int | None:
        """The expert's next action index (``None`` when no goal is reachable)."""
        if self.nav is None:
            return self.plan[0] if self.plan else None
        env, nav = self.env, self.nav
        x, y, d = int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir)
        fx, fy = x + _VEC[d][0], y + _VEC[d][1]
        front = env.grid.get(fx, fy)
        if front is not None and front.type == "goal":
            return int(Actions.forward)
        best: tuple[int, int] | None = None
        for action, s in (
            (Actions.forward, (fx, fy, d)),
            (Actions.left, (x, y, (d - 1) % 4)),
            (Actions.right, (x, y, (d + 1) % 4)),
        ):
            if s in nav and (best is None or nav[s] < best[0]):
                best = (nav[s], int(action))
        return None if best is None else best[1]

    def observe(self, action_taken: int, grid_changed: bool = True) -> None:
        """Advance after ``action_taken`` was applied to the env (minigrid is deterministic here).

        Args:
            action_taken: the minigrid action index just applied.
            grid_changed: whether the action changed a cell or the carried object (pickup, drop, toggle
                that did something); ``True`` is always safe.
        """
        if grid_changed and action_taken in (Actions.pickup, Actions.drop, Actions.toggle):
            self._replan()
            return
        if self.nav is not None:
            return
        if self.plan and action_taken == self.plan[0]:
            self.plan.pop(0)
            if self.plan:
                return
        self._replan()


class BabyAIExpert:
    """minigrid's own ``BabyAIBot`` in advising mode (``replan(action_taken)`` after every step).

    The bot raises on the few situations it cannot handle (e.g. ``DisappearedBoxError`` after the agent
    opened a box holding the target); the expert then goes silent for the rest of the episode.
    """

    def __init__(self, env: Any) -> None:
        from minigrid.utils.baby_ai_bot import BabyAIBot

        self.env = env
        self.action: int | None = None
        try:
            self.bot: Any = BabyAIBot(env)
            self.action = int(self.bot.replan())
        except Exception as e:  # the bot's own failure modes are asserts and custom errors
            logger.debug("BabyAIBot failed at reset: %r", e)
            self.bot = None

    def next_action(self) -> int | None:
        return self.action

    def observe(self, action_taken: int, grid_changed: bool = True) -> None:
        if self.bot is None:
            return
        try:
            self.action = int(self.bot.replan(action_taken))
        except Exception as e:
            logger.debug("BabyAIBot failed after action %d: %r", action_taken, e)
            self.bot, self.action = None, None


def visible_cells(env: Any) -> dict[tuple[int, int], tuple[str, str] | None]:
    """The cells of the agent's current view (minigrid's visibility mask, what the text observation describes):
    ``(x, y) -> (type, color)``, or None for an empty cell."""
    vis = env.gen_obs_grid()[1]
    n = env.agent_view_size
    cells: dict[tuple[int, int], tuple[str, str] | None] = {}
    for x in range(env.width):
        for y in range(env.height):
            vx, vy = env.get_view_coords(x, y)
            if 0 <= vx < n and 0 <= vy < n and vis[vx, vy]:
                c = env.grid.get(x, y)
                cells[(x, y)] = None if c is None else (c.type, c.color)
    return cells


_VIEW_ORDER = (Actions.forward, Actions.left, Actions.right)


def view_plan(env: Any, views: list[dict], pickup: bool = False) -> int | None:
    """The first action of a shortest path to a pose facing the mission's object, planned on the cells of ``views``
    only (oldest first; the last has the last word): objects block, unseen cells count as free, the room's outer
    wall is known. ``pickup``: the path may pick up one object in its way when the hands are empty (minigrid's
    ``pickup`` takes it off the grid). None when no target is among the cells, or the agent already faces it."""
    known: dict = {}
    for v in views:
        known.update(v)
    desc = env.instrs.desc
    targets = {p for p, c in known.items() if c is not None and c[0] == desc.type
               and (desc.color is None or c[1] == desc.color)}
    if not targets:
        return None
    walls = {(x, y) for x in range(env.width) for y in range(env.height)
             if x in (0, env.width - 1) or y in (0, env.height - 1)}
    walls |= {p for p, c in known.items() if c is not None and c[0] == "wall"}
    objects = {p for p, c in known.items() if c is not None and c[0] != "wall"}
    moves = _VIEW_ORDER + ((Actions.pickup,) if pickup and env.carrying is None else ())
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir), None)
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        x, y, d, lifted = s
        front = (x + _VEC[d][0], y + _VEC[d][1])
        if front in targets:
            if parent[s] is None:
                return None
            while parent[s][0] != start:
                s = parent[s][0]
            return int(parent[s][1])
        for a in moves:
            if a == Actions.forward:
                if front in walls or (front in objects and front != lifted):
                    continue
                nxt = (front[0], front[1], d, lifted)
            elif a == Actions.pickup:
                if lifted is not None or front not in objects:
                    continue
                nxt = (x, y, d, front)
            else:
                nxt = (x, y, (d - 1) % 4 if a == Actions.left else (d + 1) % 4, lifted)
            if nxt not in parent:
                parent[nxt] = (s, a)
                queue.append(nxt)
    return None


class ViewPlanner:
    """A BabyAI expert that sees what the agent sees: :func:`view_plan` on the last ``memory + 1`` views, ``left``
    (turn in place) when no target is among them. With ``memory=0`` its action is a function of the current
    view (and the agent's place in the room, which fixes the unseen outer wall), so a policy prompted with the
    current observation only (``history=0``) can imitate it: over 3,000 GoToLocal episodes no observation text got
    two of its labels, where 31 texts got two of the bot's, which acts on its memory of the room. With ``pickup``
    it clears an object from its path and keeps it (the bot does so in 6 of 1,280 GoToLocal demonstrations, and
    drops it again).

    On the 200 held-out instances of GoToLocal seeds 1310-1314 (goal line, 24 steps) it wins 0.96 (``memory=0,
    pickup=True``), against 0.93 without ``pickup`` and 1.00 for the bot (``benchmarks/gotolocal_memory_ceiling.py``).
    """

    def __init__(self, env: Any, memory: int = 0, pickup: bool = True) -> None:
        if getattr(getattr(env, "instrs", None), "desc", None) is None:
            raise ValueError("ViewPlanner needs a BabyAI mission naming one object (go to / pick up / open)")
        self.env, self.memory, self.pickup = env, int(memory), bool(pickup)
        self.views: list[dict] = []
        self.action: int | None = None
        self.found = False
        """Whether the last plan had a target among its views (False: ``action`` is the search's ``left``)."""
        self._replan()

    def _replan(self) -> None:
        self.views = (self.views + [visible_cells(self.env)])[-(self.memory + 1):]
        a = view_plan(self.env, self.views, self.pickup)
        self.found = a is not None
        self.action = int(Actions.left) if a is None else a

    def next_action(self) -> int | None:
        return self.action

    def observe(self, action_taken: int, grid_changed: bool = True) -> None:
        self._replan()
