"""Offline ALFWorld game generator: writes games in alfworld's own ``tw-pddl`` format.

``alfworld-download`` fetches ~3.5k ALFRED scenes converted to ``game.tw-pddl`` files. Where that download is
impossible we write equivalent games ourselves from the files alfworld ships: the PDDL domain
(``alfworld/data/alfred.pddl``), the text grammar (``alfred.twl2``) and the goal library
(``alfworld/gen/goal_library.py``, the same PDDL goals and task templates ALFRED used). Each game directory
mirrors the json_2.1.1 layout (``<split>/<task_type>-<Obj>-<Mrecep>-<Parent>-<scene>/trial_<id>/``) with a
``traj_data.json`` (``task_type`` + ``pddl_params``, read by alfworld's handcoded expert) and a
``game.tw-pddl`` (``pddl_domain``, ``grammar``, ``pddl_problem``, ``solvable``, ``walkthrough``) exactly like
``alfworld-generate`` writes.

Two upstream gotchas are handled by construction: sinks are named ``Sink|...|SinkBasin`` (alfworld's
``Demangler`` derives the name ``sinkbasin`` from that id; other spellings crash the expert) and no instance of
the target object starts inside a goal receptacle (or a heat/cool appliance), so no game is won at step 0.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from echorl_envs.alfworld.scenes import (
    HELD_OUT_ROOMS_FOR_TASK,
    LAMP_HOLDERS,
    NEVER_GOAL,
    OPENABLE,
    ROOMS_FOR_TASK,
    TASK_TYPES,
    RoomTemplate,
    has_prefix_clash,
)

__all__ = ["GeneratorConfig", "GameSpec", "DIFFICULTIES", "make_game_spec", "write_game", "pddl_name"]


@dataclass(frozen=True)
class GeneratorConfig:
    """Difficulty knobs of generated ALFWorld rooms."""

    #: fewest receptacles in a room (the task's required appliances always count)
    min_receptacles: int = 8
    #: most receptacles in a room
    max_receptacles: int = 14
    #: distractor objects (not the target class) scattered in the room
    num_distractors: int = 6
    #: probability that an openable receptacle (cabinet, drawer, fridge, microwave, safe) starts open
    open_prob: float = 0.0
    #: extra instances of the target class beyond what the task needs
    extra_targets: int = 0

    def __post_init__(self) -> None:
        if self.min_receptacles < 4:
            raise ValueError(f"min_receptacles must be >= 4, got min_receptacles={self.min_receptacles}")
        if self.max_receptacles < self.min_receptacles:
            raise ValueError(
                "max_receptacles must be >= min_receptacles, got "
                f"max_receptacles={self.max_receptacles}, min_receptacles={self.min_receptacles}"
            )
        if self.num_distractors < 0:
            raise ValueError(f"num_distractors must be >= 0, got num_distractors={self.num_distractors}")
        if not 0.0 <= self.open_prob <= 1.0:
            raise ValueError(f"open_prob must be in [0, 1], got open_prob={self.open_prob}")
        if self.extra_targets < 0:
            raise ValueError(f"extra_targets must be >= 0, got extra_targets={self.extra_targets}")


#: Named presets for the ``difficulty=`` argument of the env.
DIFFICULTIES: dict[str, GeneratorConfig] = {
    "easy": GeneratorConfig(min_receptacles=5, max_receptacles=8, num_distractors=3, open_prob=0.5),
    "medium": GeneratorConfig(),
    "hard": GeneratorConfig(min_receptacles=14, max_receptacles=22, num_distractors=12, open_prob=0.0),
}


def pddl_name(alfred_id: str) -> str:
    """ALFRED object id -> PDDL constant, as alfworld's ``PlannedGameState.fix_pddl_str_chars`` does."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_id = alfred_id.replace(a, b)
    return alfred_id


@dataclass
class GameSpec:
    """A generated room and task, before it is written as PDDL."""

    task_type: str
    scene: str
    scene_num: int
    object_target: str
    parent_target: str
    toggle_target: str
    #: receptacle id -> class
    receptacles: dict[str, str]
    #: object id -> class
    objects: dict[str, str]
    #: object id -> receptacle id
    placement: dict[str, str]
    opened: list[str]
    task_desc: str

    @property
    def dir_name(self) -> str:
        parent = self.parent_target or ""
        mrecep = ""
        return f"{self.task_type}-{self.object_target}-{mrecep or 'None'}-{parent or 'None'}-{self.scene_num}"


def _coord(rng: random.Random) -> str:
    x, y, z = (rng.uniform(-3, 3), rng.uniform(0, 2), rng.uniform(-3, 3))
    return "|".join(f"{v:+06.2f}" for v in (x, y, z))


def _recep_id(cls: str, rng: random.Random) -> str:
    if cls == "SinkBasin":  # the Demangler turns "Sink|...|SinkBasin" into "sinkbasin N"
        return f"Sink|{_coord(rng)}|SinkBasin"
    return f"{cls}|{_coord(rng)}"


def _choose_room(rng: random.Random, room: RoomTemplate, cfg: GeneratorConfig, required: set[str]) -> list[str]:
    """Receptacle classes of a room (with repeats), containing every class in ``required``."""
    classes: list[str] = []
    optional: list[str] = []
    for cls, lo, hi in room.receptacles:
        n = max(lo, 1 if cls in required else 0)
        classes += [cls] * n
        optional += [cls] * (hi - n)
    rng.shuffle(optional)
    target = rng.randint(cfg.min_receptacles, cfg.max_receptacles)
    while len(classes) < target and optional:
        classes.append(optional.pop())
    return classes


def make_game_spec(task_type: str, seed: int, cfg: GeneratorConfig | None = None,
                   held_out_templates: bool = False) -> GameSpec:
    """Draw a room, a task and an object layout for ``task_type`` (deterministic in ``seed``).

    Args:
        held_out_templates: draw the room from :data:`~echorl_envs.alfworld.scenes.HELD_OUT_ROOMS_FOR_TASK` (the
            ``valid_unseen_templates`` split) instead of the four training templates.
    """
    import alfworld.gen.constants as C
    import alfworld.gen.goal_library as glib

    if task_type not in TASK_TYPES.values():
        raise ValueError(f"task_type must be one of {sorted(TASK_TYPES.values())}, got task_type={task_type!r}")
    cfg = cfg or GeneratorConfig()
    rng = random.Random(f"echorl-alfworld-{task_type}-{seed}")
    room = rng.choice((HELD_OUT_ROOMS_FOR_TASK if held_out_templates else ROOMS_FOR_TASK)[task_type])
    holds = C.VAL_RECEPTACLE_OBJECTS
    acts = C.VAL_ACTION_OBJECTS
    required: set[str] = set()
    toggle = ""
    if task_type == "pick_heat_then_place_in_recep":
        pool, required = [o for o in room.objects if o in acts["Heatable"]], {"Microwave"}
    elif task_type == "pick_cool_then_place_in_recep":
        pool, required = [o for o in room.objects if o in acts["Coolable"]], {"Fridge"}
    elif task_type == "pick_clean_then_place_in_recep":
        pool, required = [o for o in room.objects if o in acts["Cleanable"]], {"SinkBasin"}
    elif task_type == "look_at_obj_in_light":
        pool, toggle = list(room.objects), "DeskLamp"
        required = {rng.choice([h for h in LAMP_HOLDERS if any(h == c for c, _, _ in room.receptacles)])}
    else:
        pool = list(room.objects)
    appliance = next(iter(required)) if task_type.startswith("pick_") and required else ""

    for _attempt in range(200):
        obj = rng.choice(pool)
        classes = _choose_room(rng, room, cfg, required)
        present = sorted(set(classes))
        # Where the target may start: any receptacle that can hold it, except the task's appliance.
        starts = [c for c in present if obj in holds.get(c, ()) and c != appliance]
        if task_type == "look_at_obj_in_light":
            parent = ""
            goals: list[str] = []
        else:
            goals = [c for c in present if obj in holds.get(c, ()) and c not in NEVER_GOAL and c != appliance]
            if not goals:
                continue
            parent = rng.choice(goals)
            starts = [c for c in starts if c != parent]
        if not starts:
            continue
        break
    else:  # pragma: no cover - every template offers a valid task within a few draws
        raise RuntimeError(f"could not draw a {task_type} game for seed {seed}")

    receptacles = {_recep_id(c, rng): c for c in classes}
    by_class: dict[str, list[str]] = {}
    for rid, c in receptacles.items():
        by_class.setdefault(c, []).append(rid)

    objects: dict[str, str] = {}
    placement: dict[str, str] = {}

    def place(cls: str, allowed: list[str]) -> None:
        oid = f"{cls}|{_coord(rng)}"
        objects[oid] = cls
        placement[oid] = rng.choice([r for c in allowed for r in by_class[c]])

    n_targets = (2 if task_type == "pick_two_obj_and_place" else 1) + cfg.extra_targets
    for _ in range(n_targets):
        place(obj, starts)
    if toggle:
        place(toggle, sorted(required))
    names = {obj, *present}
    distract_pool = [o for o in room.objects if o != obj and not has_prefix_clash(names | {o})]
    for _ in range(cfg.num_distractors):
        if not distract_pool:
            break
        d = rng.choice(distract_pool)
        where = [c for c in present if d in holds.get(c, ())]
        if where:
            place(d, where)
            names.add(d)
            distract_pool = [o for o in distract_pool if not has_prefix_clash(names | {o})]

    opened = sorted(r for r, c in receptacles.items() if c in OPENABLE and rng.random() < cfg.open_prob)
    template = rng.choice(glib.gdict[task_type]["templates"])
    task_desc = template.format(obj=obj.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    return GameSpec(
        task_type=task_type,
        scene=room.name,
        scene_num=room.scene_base + 1 + rng.randrange(30),
        object_target=obj,
        parent_target=parent,
        toggle_target=toggle,
        receptacles=receptacles,
        objects=objects,
        placement=placement,
        opened=opened,
        task_desc=task_desc,
    )


def _pddl_problem(spec: GameSpec, rng: random.Random) -> str:
    """The ALFRED-style PDDL problem (objects, init facts, goal from alfworld's goal library)."""
    import alfworld.gen.constants as C
    import alfworld.gen.goal_library as glib

    holds = C.VAL_RECEPTACLE_OBJECTS
    acts = C.VAL_ACTION_OBJECTS
    rlocs = {r: f"loc|{i + 1}|{rng.randint(-9, 9)}|{rng.choice((0, 1, 2, 3))}|{rng.choice((0, 30, 45, 60))}"
             for i, r in enumerate(spec.receptacles)}
    start = f"loc|0|{rng.randint(-9, 9)}|0|30"
    otypes = sorted(set(spec.objects.values()) | {"Knife", "ButterKnife"})
    rtypes = sorted(set(spec.receptacles.values()) | {"SinkBasin", "Microwave", "Fridge"})
    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{pddl_name(o)} - object" for o in spec.objects]
    decl += [f"{pddl_name(r)} - receptacle" for r in spec.receptacles]
    decl += [f"{pddl_name(loc)} - location" for loc in sorted(set(rlocs.values()) | {start})]
    init = [f"(atLocation agent1 {pddl_name(start)})"]
    for r, c in spec.receptacles.items():
        init.append(f"(receptacleType {pddl_name(r)} {c}Type)")
        init.append(f"(receptacleAtLocation {pddl_name(r)} {pddl_name(rlocs[r])})")
        if c in OPENABLE:
            init.append(f"(openable {pddl_name(r)})")
    init += [f"(opened {pddl_name(r)})" for r in spec.opened]
    for rt in sorted(set(spec.receptacles.values())):
        init += [f"(canContain {rt}Type {ot}Type)" for ot in otypes if ot in holds.get(rt, ())]
    for o, c in spec.objects.items():
        n = pddl_name(o)
        r = spec.placement[o]
        init.append(f"(objectType {n} {c}Type)")
        init.append(f"(inReceptacle {n} {pddl_name(r)})")
        init.append(f"(objectAtLocation {n} {pddl_name(rlocs[r])})")
        if c in acts["Toggleable"]:
            init.append(f"(toggleable {n})")
        else:
            init.append(f"(pickupable {n})")
        for prop, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("sliceable", "Sliceable")):
            if c in acts[key]:
                init.append(f"({prop} {n})")
    goal = glib.gdict[spec.task_type]["pddl"].format(
        obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep=""
    ).replace("#", "-")
    return (
        f"(define (problem plan_{spec.dir_name.replace('-', '_')})\n(:domain alfred)\n(:objects\n  "
        + "\n  ".join(decl)
        + "\n)\n(:init\n  "
        + "\n  ".join(init)
        + "\n)\n"
        + goal
    )


def write_game(spec: GameSpec, trial_dir: Path, seed: int) -> Path:
    """Write ``traj_data.json`` and ``game.tw-pddl`` for ``spec`` into ``trial_dir``; return the game path.

    ``solvable`` is left ``None`` (like ``alfworld-generate`` before its solvability check); the caller runs
    the expert and records the verdict with :func:`mark_solvable`.
    """
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    trial_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"echorl-alfworld-pddl-{spec.task_type}-{seed}")
    traj = {
        "task_type": spec.task_type,
        "task_id": f"echorl_{spec.task_type}_{seed}",
        "scene": {"scene_num": spec.scene_num, "floor_plan": f"FloorPlan{spec.scene_num}", "random_seed": seed},
        "pddl_params": {
            "object_target": spec.object_target,
            "parent_target": spec.parent_target,
            "toggle_target": spec.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": spec.task_desc, "high_descs": [], "votes": []}]},
        "echorl": {"generator": "echorl_envs.alfworld", "seed": seed, "room": spec.scene, "spec": asdict(spec)},
    }
    (trial_dir / "traj_data.json").write_text(json.dumps(traj, indent=1))
    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", spec.task_desc)
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": grammar,
        "pddl_problem": _pddl_problem(spec, rng),
        "solvable": None,
        "walkthrough": None,
    }
    path = trial_dir / "game.tw-pddl"
    path.write_text(json.dumps(game))
    return path


def mark_solvable(game_path: Path, walkthrough: list[str] | None) -> None:
    """Record the expert's verdict in ``game.tw-pddl`` (the ``solvable``/``walkthrough`` keys alfworld reads)."""
    data: dict[str, Any] = json.loads(game_path.read_text())
    data["walkthrough"] = walkthrough
    data["solvable"] = walkthrough is not None
    game_path.write_text(json.dumps(data))
