"""Hostile-action fuzz of every registered env: steps taken and exceptions raised (goal: 0).

For each id and seed: the fixed hostile list of issue 15 (surrogates, deep nesting, huge inputs, non-ASCII
digits), non-``str`` actions, then random hostile strings drawn with a seeded generator (random text, repeated
openers, surrogates and unusual digits appended to text); bad ``reset`` options are tried once per id and
must raise ``ValueError``. CRUXEval steps run the real sandbox, so the budget per id is modest.

    python benchmarks/env_fuzz.py [--seeds 3] [--random-steps 100]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter

import gymnasium as gym
import numpy as np
import torch
from tabulate import tabulate

import echorl_envs
from tests.conftest import REGISTRY_MAKE_KWARGS

FIXED = [
    "\ud800", "a\udfffb", "-" * 3000 + "1", "go forward " * 10000, "not " * 3000 + "1", "[[" * 600 + "]]" * 600,
    "²", "(" * 5000, "+" * 3000 + "1", "[" + "9" * 5000 + "]", "\x00", "\u202e1", "𝟙", "", " ", "x" * 200_000,
]
NON_STR = [None, 3, b"go", ["a"], 1.5]
BAD_OPTIONS = [{1: 2}, "x", [], 3]
_OPENERS = ["[", "(", "-", "not ", "[[", "{", "lambda: ", "go ", "~", "'"]
_ODD = ["²", "٣", "\ud800", "\x00", "𝟙", "\u202e", "½"]


def random_action(rng: np.random.Generator) -> str:
    kind = int(rng.integers(4))
    if kind == 0:
        return "".join(chr(int(c)) for c in rng.integers(0, 0x10FFFF, int(rng.integers(1, 200))))
    if kind == 1:
        return _OPENERS[int(rng.integers(len(_OPENERS)))] * int(rng.integers(100, 4000))
    if kind == 2:
        return "".join(chr(int(c)) for c in rng.integers(32, 127, int(rng.integers(0, 60)))) + _ODD[int(rng.integers(len(_ODD)))]
    return "".join(chr(int(c)) for c in rng.integers(0xD800, 0xE000, int(rng.integers(1, 5))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--random-steps", type=int, default=100, help="random hostile steps per id and seed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows, total_steps, total_exc = [], 0, 0
    for env_id in echorl_envs.env_ids():
        kwargs = REGISTRY_MAKE_KWARGS.get(env_id, {})
        if kwargs is None:
            rows.append([env_id, "skipped (no data)", "", "", ""])
            continue
        env = gym.make(env_id, **kwargs)
        steps, exc, invalid, kinds = 0, 0, 0, Counter()
        start = time.perf_counter()
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            env.reset(seed=seed)
            for action in [*FIXED, *NON_STR, *(random_action(rng) for _ in range(args.random_steps))]:
                try:
                    _, _, term, trunc, info = env.step(action)
                    invalid += bool(info["invalid_action"])
                    if term or trunc:
                        env.reset(seed=seed)
                except Exception as e:  # noqa: BLE001 - counting is the point
                    exc += 1
                    kinds[type(e).__name__] += 1
                    env.reset(seed=seed)
                steps += 1
        for options in BAD_OPTIONS:
            try:
                env.reset(options=options)
                kinds["accepted bad options"] += 1
                exc += 1
            except ValueError:
                pass
            except Exception as e:  # noqa: BLE001
                kinds[type(e).__name__] += 1
                exc += 1
        env.close()
        total_steps, total_exc = total_steps + steps, total_exc + exc
        rows.append([env_id, steps, invalid, exc, f"{time.perf_counter() - start:.1f}",
                     ", ".join(f"{k}x{v}" for k, v in kinds.items())])
    print(tabulate(rows, headers=["id", "hostile steps", "invalid_action", "exceptions", "seconds", "kinds"],
                   tablefmt="github"))
    print(f"\nids: {len(rows)}, hostile steps: {total_steps}, exceptions: {total_exc}")


if __name__ == "__main__":
    main()
