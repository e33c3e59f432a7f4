"""The verdict of a training run: paired held-out differences and the one line ``echorl train-llm`` ends with.

:class:`~echorl_agent.llm_rl.heldout.HeldOutEval` plays the held-out instances and writes ``eval_episodes.csv`` and
``eval.json`` into the run folder; :func:`finish` pairs the episodes of the phases on the same instances (after −
before and, after a BC warm start, after − after BC), adds ``paired`` / ``paired_rl`` to ``eval.json``, and returns
the verdict line::

    held-out success (20 episodes): sampled 0.13 → 0.47 (+0.34 [+0.27, +0.41]), greedy 0.00 → 0.28 (+0.28 [+0.19, +0.37])

The interval is :func:`~echorl_agent.eval.stats.paired_bootstrap`'s 95% percentile bootstrap over episodes (the
instances, resampled with a fixed seed), with :func:`~echorl_agent.eval.stats.mcnemar_exact`'s p beside it in the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echorl_agent.eval.stats import mcnemar_exact, paired_bootstrap
from echorl_agent.llm_rl.heldout import MODES, Episode, read_episodes

__all__ = ["finish", "paired", "verdict_line"]


def paired(before: Sequence[Episode], after: Sequence[Episode]) -> dict[str, dict[str, Any]]:
    """Per mode: after − before success over the instances both played (paired by episode seed), with its 95% paired
    bootstrap CI over episodes and McNemar's exact p."""
    out = {}
    for mode in MODES:
        b = {e.seed: e.won for e in before if e.mode == mode}
        pairs = [(e.won, b[e.seed]) for e in after if e.mode == mode and e.seed in b]
        if not pairs:
            continue
        diff, lo, hi = paired_bootstrap([float(x) - float(y) for x, y in pairs])
        out[mode] = {"diff": diff, "ci": [lo, hi], "episodes": len(pairs),
                     "mcnemar_p": mcnemar_exact([x for x, _ in pairs], [y for _, y in pairs])}
    return out


def _signed(x: float) -> str:
    return "+0.00" if abs(x) < 5e-3 else f"{x:+.2f}"


def _diff(p: dict[str, Any]) -> str:
    """A paired difference with its CI: ``+0.34 [+0.27, +0.41]``."""
    return f"{_signed(p['diff'])} [{_signed(p['ci'][0])}, {_signed(p['ci'][1])}]"


def verdict_line(result: dict[str, Any]) -> str:
    """The verdict line of an ``eval.json`` with its ``paired`` section (see the module docstring). After a BC
    warm start the start of RL is shown too, with RL's own paired difference:
    ``sampled 0.13 → 0.35 (BC) → 0.47 (+0.34 [+0.27, +0.41]; RL +0.12 [+0.02, +0.22])``; without the "before"
    point (``eval_before=False``) ``sampled 0.35 (BC) → 0.47 (RL +0.12 [+0.02, +0.22])``; a run evaluated only after
    training (``eval-llm``) reads ``sampled 0.47, greedy 0.28``. A run with no RL (``train_steps=0``, imitation
    only) reads ``sampled 0.82 (BC), greedy 0.78 (BC); no RL ran (train_steps 0)``: its "after" point replays the
    same policy (greedy equal, sampled a second draw), so no RL difference is shown."""
    if result.get("env_steps") == 0 and result.get("after_bc"):
        parts = [f"{mode} {result['after_bc'][mode]['success']:.2f} (BC)" for mode in MODES
                 if mode in result["after_bc"]]
        return (f"held-out success ({result['episodes']} episodes): " + ", ".join(parts)
                + "; no RL ran (train_steps 0)")
    parts = []
    for mode in MODES:
        if mode not in result.get("after", {}):
            continue
        after = result["after"][mode]["success"]
        if mode in result.get("paired", {}):
            text = f"{mode} {result['before'][mode]['success']:.2f}"
            if mode in result.get("after_bc", {}):
                text += f" → {result['after_bc'][mode]['success']:.2f} (BC)"
            text += f" → {after:.2f} ({_diff(result['paired'][mode])}"
            if mode in result.get("paired_rl", {}):
                text += f"; RL {_diff(result['paired_rl'][mode])}"
            parts.append(text + ")")
        elif mode in result.get("paired_rl", {}):  # eval_before=False: the run's start is after BC
            parts.append(f"{mode} {result['after_bc'][mode]['success']:.2f} (BC) → {after:.2f} "
                         f"(RL {_diff(result['paired_rl'][mode])})")
        else:
            parts.append(f"{mode} {after:.2f}")
    return f"held-out success ({result['episodes']} episodes): " + ", ".join(parts)


def finish(folder: str | Path, prefix: str = "eval") -> tuple[dict[str, Any], str]:
    """Add the paired differences to ``<folder>/<prefix>.json`` from ``<folder>/<prefix>_episodes.csv``; returns the
    result and its verdict line.

    Raises:
        FileNotFoundError: the run wrote no held-out evaluation there.
    """
    folder = Path(folder)
    path = folder / f"{prefix}.json"
    result = json.loads(path.read_text())
    episodes = read_episodes(folder / f"{prefix}_episodes.csv")
    by = {ph: [e for e in episodes if e.phase == ph] for ph in ("before", "after_bc", "after")}
    result.pop("paired", None)
    result.pop("paired_rl", None)
    if by["before"] and by["after"]:
        result["paired"] = paired(by["before"], by["after"])
    if by["after_bc"] and by["after"]:
        result["paired_rl"] = paired(by["after_bc"], by["after"])
    path.write_text(json.dumps(result, indent=2))
    return result, verdict_line(result)
