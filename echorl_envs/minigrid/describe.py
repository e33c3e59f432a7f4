"""Egocentric language descriptions of a MiniGrid partial view.

The description is computed from the ``image`` minigrid already returns (``Grid.encode`` of the agent's
rotated view: ``image[i, j] = (object index, colour index, state)``, unseen cells encoded as ``unseen``),
so describing costs no extra engine work. In that view the agent stands at ``(view // 2, view - 1)`` facing
"up" (decreasing ``j``): a cell ``(i, j)`` is ``view - 1 - j`` steps ahead and ``i - view // 2`` steps to
the right (negative: to the left) -- minigrid's own convention in ``MiniGridEnv.gen_obs_grid``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, OBJECT_TO_IDX, STATE_TO_IDX

__all__ = [
    "DIRECTION_NAMES",
    "describe_view",
    "object_phrase",
    "position_phrase",
    "with_article",
]

#: minigrid's ``agent_dir`` 0..3 as compass words (``DIR_TO_VEC``: +x, +y, -x, -y; y grows downwards).
DIRECTION_NAMES = ("east", "south", "west", "north")

_UNSEEN = OBJECT_TO_IDX["unseen"]
_EMPTY = OBJECT_TO_IDX["empty"]
_WALL = OBJECT_TO_IDX["wall"]
_FLOOR = OBJECT_TO_IDX["floor"]
_DOOR = OBJECT_TO_IDX["door"]
_GOAL = OBJECT_TO_IDX["goal"]
#: Object indices listed in "You see": doors, keys, balls, boxes, goals, lava (not walls, floor, empty).
_LISTED_MIN = _DOOR
_DOOR_STATE = {v: k for k, v in STATE_TO_IDX.items()}


def with_article(noun_phrase: str) -> str:
    """``"a red key"`` / ``"an open red door"``."""
    return ("an " if noun_phrase[:1] in "aeiou" else "a ") + noun_phrase


@lru_cache(maxsize=512)
def object_phrase(obj_idx: int, color_idx: int, state: int) -> str:
    """Noun phrase (with article) of one encoded cell, e.g. ``"a locked yellow door"``, ``"lava"``.

    Args:
        obj_idx: ``OBJECT_TO_IDX`` value.
        color_idx: ``COLOR_TO_IDX`` value.
        state: door state (``STATE_TO_IDX``: open 0, closed 1, locked 2); ignored for other objects.
    """
    name = IDX_TO_OBJECT[int(obj_idx)]
    if name == "wall":
        return "a wall"
    if name == "lava":
        return "lava"
    if name in ("empty", "unseen"):
        return "nothing"
    color = IDX_TO_COLOR[int(color_idx)]
    if name == "door":
        return with_article(f"{_DOOR_STATE[int(state)]} {color} door")
    if name == "goal":
        return with_article(f"{color} goal square")
    return with_article(f"{color} {name}")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


@lru_cache(maxsize=256)
def position_phrase(ahead: int, right: int) -> str:
    """Relative position words: ``(2, -1)`` -> ``"2 steps ahead and 1 to the left"``."""
    side = ""
    if right:
        side = f"{abs(right)} to the {'right' if right > 0 else 'left'}"
    if ahead and side:
        return f"{_steps(ahead)} ahead and {side}"
    if ahead:
        return f"{_steps(ahead)} ahead"
    if right:
        return f"{_steps(abs(right))} to the {'right' if right > 0 else 'left'}"
    return "where you stand"


def _free(obj_idx: int, state: int) -> bool:
    """Cells a ray passes through: empty, floor, goal and open doors (``WorldObj.can_overlap``).

    Lava is walkable in minigrid but ends the episode, so a ray stops at it and reports it as a warning.
    """
    if obj_idx in (_EMPTY, _FLOOR, _GOAL):
        return True
    return obj_idx == _DOOR and state == STATE_TO_IDX["open"]


def _ray(cells_view: list, cells: list[tuple[int, int]], label: str) -> str:
    free = 0
    for i, j in cells:
        obj, color, state = cells_view[i][j]
        if obj == _UNSEEN:
            end = "then your view is blocked" if free else "your view is blocked"
            return f"{label}: {_steps(free)} free, {end}." if free else f"{label}: {end}."
        if not _free(obj, state) or obj == _GOAL:
            thing = object_phrase(obj, color, state)
            if free == 0:
                return f"{label}: {thing} right next to you."
            return f"{label}: {_steps(free)} free, then {thing}."
        free += 1
    return f"{label}: {_steps(free)} free up to the edge of your view."


@lru_cache(maxsize=8)
def _ray_cells(view: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    c, back = view // 2, view - 1
    ahead = [(c, back - k) for k in range(1, view)]
    left = [(c - k, back) for k in range(1, c + 1)]
    right = [(c + k, back) for k in range(1, c + 1)]
    return ahead, left, right


def _target_line(cells_view: list, found: list, obj_type: str | None, color: str | None) -> str:
    """``"Target: the blue key, 2 steps ahead and 3 to the left."`` for the nearest visible object matching the
    mission's ``(obj_type, color)`` (``found``: :func:`describe_view`'s sorted visible objects), or ``"Target: the
    blue key is not in view."``."""
    name = " ".join(w for w in (color, obj_type or "object") if w)
    for _, ahead, right, _, i, j in found:
        obj, col, _ = cells_view[i][j]
        if (obj_type is None or IDX_TO_OBJECT[obj] == obj_type) and (color is None or IDX_TO_COLOR[col] == color):
            return f"Target: the {name}, {position_phrase(ahead, right)}."
    return f"Target: the {name} is not in view."


def describe_view(
    image: np.ndarray,
    direction: int,
    carrying: str | None,
    mission: str,
    target: tuple[str | None, str | None] | None = None,
) -> str:
    """The text observation of one MiniGrid state.

    Args:
        image: minigrid's ``obs["image"]``, shape ``[view, view, 3]`` (object, colour, state).
        direction: ``agent_dir`` (0 east, 1 south, 2 west, 3 north).
        carrying: noun phrase of the carried object (``"a red key"``) or ``None``.
        mission: the mission string.
        target: ``(object type, colour)`` of the one object the mission names (``None`` in either place: any),
            e.g. ``("key", "blue")``; adds a line saying where the nearest matching visible object is.

    Returns:
        Lines: mission; heading and carried object; with ``target``, where the mission's object is; every
        visible door/key/ball/box/goal/lava with its relative position (nearest first); what lies straight
        ahead, to the left and to the right.
    """
    view = image.shape[0]
    c, back = view // 2, view - 1
    cells_view = image.tolist()  # plain ints: far cheaper to index than numpy scalars
    ii, jj = np.nonzero(image[:, :, 0] >= _LISTED_MIN)
    found: list[tuple[int, int, int, str]] = []
    for i, j in zip(ii.tolist(), jj.tolist(), strict=True):
        if i == c and j == back:  # the agent's own cell shows the carried object
            continue
        ahead, right = back - j, i - c
        phrase = object_phrase(*cells_view[i][j])
        found.append((ahead + abs(right), ahead, right, f"{phrase} {position_phrase(ahead, right)}", i, j))
    found.sort()
    lines = [f"Mission: {mission}."] if not mission.endswith(".") else [f"Mission: {mission}"]
    held = f"You are carrying {carrying}." if carrying else "You are not carrying anything."
    lines.append(f"You are facing {DIRECTION_NAMES[direction]}. {held}")
    if target is not None:
        lines.append(_target_line(cells_view, found, *target))
    if found:
        lines.append("You see " + "; ".join(f[3] for f in found) + ".")
    else:
        lines.append("You see no objects.")
    ahead_cells, left_cells, right_cells = _ray_cells(view)
    lines.append(_ray(cells_view, ahead_cells, "Ahead"))
    lines.append(_ray(cells_view, left_cells, "Left"))
    lines.append(_ray(cells_view, right_cells, "Right"))
    return "\n".join(lines)
