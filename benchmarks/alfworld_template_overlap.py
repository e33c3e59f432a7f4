"""How much of a held-out ALFWorld split's rooms the training games already show (generated games).

For each game of ``--heldout`` splits (``valid_unseen``, ``valid_unseen_templates``) the script asks whether one of
the first N training games (N in ``--train-games``) has the same

* ``template``: room template (kitchen, livingroom, bedroom, bathroom; studio, ensuite, den are held out),
* ``floorplan``: the FloorPlan number written into ``traj_data.json`` (a label: the agent never sees it),
* ``composition``: the set of receptacle classes in the room (template, classes),
* ``layout``: the receptacle classes with their counts (what the room's opening line lists),
* ``task``: (template, target object class, goal receptacle class),

and prints the fraction per key. Games are the generator's specs of the pool's seeds (``GeneratedPool`` index i of
a one-type pool plays seed ``SPLIT_SEED_BASE[split] + i``; the rare seed the expert cannot win is replaced by the
pool and counted here as drawn). Only ``alfworld``'s constants are imported (no engine): 1,000 games take ~3 s.

    python benchmarks/alfworld_template_overlap.py --train-games 4 48 200 1000 --heldout-games 200 \
        --out benchmarks/results/alfworld_template_overlap.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from echorl_envs.alfworld.games import HELD_OUT_TEMPLATE_SPLITS, SPLIT_SEED_BASE
from echorl_envs.alfworld.generator import DIFFICULTIES, GameSpec, make_game_spec
from echorl_envs.alfworld.scenes import TASK_TYPES

KEYS = ("template", "floorplan", "composition", "layout", "task")


def room_keys(spec: GameSpec) -> dict[str, object]:
    """The room of ``spec`` at each level of :data:`KEYS`."""
    counts = collections.Counter(spec.receptacles.values())
    return {"template": spec.scene, "floorplan": spec.scene_num,
            "composition": (spec.scene, tuple(sorted(counts))),
            "layout": (spec.scene, tuple(sorted(counts.items()))),
            "task": (spec.scene, spec.object_target, spec.parent_target)}


def split_specs(task_type: str, split: str, n: int, difficulty: str = "medium") -> list[GameSpec]:
    """The specs of the first ``n`` games of a one-type generated pool of ``split``."""
    cfg = DIFFICULTIES[difficulty]
    return [make_game_spec(task_type, SPLIT_SEED_BASE[split] + k, cfg, split in HELD_OUT_TEMPLATE_SPLITS)
            for k in range(n)]


def overlap(train: list[GameSpec], heldout: list[GameSpec]) -> dict[str, float]:
    """Per key, the fraction of ``heldout`` games whose room some game of ``train`` shares."""
    seen = {k: set() for k in KEYS}
    for s in train:
        for k, v in room_keys(s).items():
            seen[k].add(v)
    rows = [room_keys(s) for s in heldout]
    return {k: sum(r[k] in seen[k] for r in rows) / len(rows) for k in KEYS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task-type", default="PickAndPlace", choices=list(TASK_TYPES))
    p.add_argument("--train-games", type=int, nargs="+", default=[4, 48, 200, 1000])
    p.add_argument("--heldout", nargs="+", default=["valid_unseen", "valid_unseen_templates"])
    p.add_argument("--heldout-games", type=int, default=200)
    p.add_argument("--difficulty", default="medium", choices=list(DIFFICULTIES))
    p.add_argument("--out", help="write the table as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    tt = TASK_TYPES[args.task_type]
    train = split_specs(tt, "train", max(args.train_games), args.difficulty)
    result = {"task_type": tt, "difficulty": args.difficulty, "heldout_games": args.heldout_games, "rows": []}
    for split in args.heldout:
        held = split_specs(tt, split, args.heldout_games, args.difficulty)
        for n in args.train_games:
            row = {"heldout": split, "train_games": n, **overlap(train[:n], held)}
            result["rows"].append(row)
            print(f"{split:>22} vs {n:>5} train games: " + ", ".join(f"{k} {row[k]:.3f}" for k in KEYS))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
