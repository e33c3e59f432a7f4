"""The BC warm start's own checkpoint, ``<out>/bc_stage/``: written after every epoch of cloning (the first clone and
each DAgger round's), so a run cut during its BC stage (BC on 1,024 GoToLocal episodes takes an hour of one core)
resumes at the epoch it reached instead of starting again.

Layout (written atomically and verified on load as ``checkpoint/`` is: :mod:`~echorl_agent.llm_rl.checkpoint`)::

    checkpoint.json  kind "bc", the DAgger round and the epochs done in it, the engine's weight version, the config
    adapter/, policy.pt  the policy's trained weights
    optimizer.pt     the optimizer's state
    data.npz         the states being cloned (each state's JSON bytes, packed) and their expert labels
    stage.pt         every epoch's loss so far, the DAgger rounds' records, the expert's counts, the seconds spent,
                     the DAgger generator and the global RNG states

A resumed stage continues exactly: the states are scored again by the engine (their frozen-layer activations do not
depend on the trained weights), the epoch's shuffle generator is advanced past the epochs done, and the engine's
weight version continues where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from echorl_agent.llm_rl import checkpoint as ckpt
from echorl_agent.llm_rl.algorithms.bc.clone import ExpertData

__all__ = ["KIND", "BCStage", "has_stage", "load_stage", "open_stage", "save_stage"]

KIND = "bc"


@dataclass
class BCStage:
    """Where a BC warm start is: round ``round`` (0: the first clone, k: DAgger round k) with ``epochs`` of its
    clone done, and what it has recorded so far."""

    round: int
    epochs: int
    data: ExpertData
    losses: list[float]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    expert: dict[str, int] = field(default_factory=dict)
    """The first collection's counts for bc.json: ``transitions``, ``expert_wins``, ``deviations``,
    ``unlabelled``."""
    seconds: float = 0.0


def _pack(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each zero-padded JSON row as its bytes (UTF-8 JSON holds no zero byte), concatenated, and the lengths."""
    zero = obs == 0
    lengths = np.where(zero.any(axis=1), zero.argmax(axis=1), obs.shape[1]).astype(np.int64)
    return np.concatenate([row[:n] for row, n in zip(obs, lengths, strict=True)]), lengths


def _unpack(flat: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((len(lengths), width), np.uint8)
    ends = np.cumsum(lengths)
    for i, (lo, hi) in enumerate(zip(ends - lengths, ends, strict=True)):
        out[i, : hi - lo] = flat[lo:hi]
    return out


def save_stage(out: Path, run: Any, policy: Any, stage: BCStage, generator: torch.Generator) -> Path:
    """Write ``<out>/bc_stage/`` (replacing the previous one)."""

    def write(folder: Path) -> None:
        ckpt.save_policy(policy, folder)
        torch.save(policy.optimizer.state_dict(), folder / "optimizer.pt")
        d = stage.data
        flat, lengths = _pack(d.observations)
        np.savez(folder / "data.npz", flat=flat, lengths=lengths, width=np.int64(d.observations.shape[1]),
                 actions=d.actions, returns=np.asarray(d.returns, np.float64),
                 counts=np.asarray([d.episodes, d.successes, d.deviations, d.unlabelled], np.int64))
        torch.save({"losses": stage.losses, "rounds": stage.rounds, "expert": stage.expert, "seconds": stage.seconds,
                    "generator": generator.get_state(), "rng": ckpt.rng_state()}, folder / "stage.pt")

    info = {"round": stage.round, "epochs_done": stage.epochs, "weight_version": policy.lm.engine.weight_version}
    return ckpt.write_checkpoint(out, run, KIND, info, write, name=ckpt.BC_STAGE)


def has_stage(out: Path) -> bool:
    """Whether ``out`` holds a BC stage (complete or not: :func:`open_stage` checks)."""
    return ckpt.has_checkpoint(out, ckpt.BC_STAGE)


def open_stage(out: Path, run: Any) -> tuple[Path, dict[str, Any]]:
    """The verified BC stage of ``out`` and its manifest, checked against the run's config.

    Raises:
        FileNotFoundError: no BC stage in ``out``.
        ValueError: a corrupt or incomplete stage, another kind of checkpoint, or a config that differs from the
            stage's in anything :data:`~echorl_agent.llm_rl.checkpoint.RESUMABLE_FIELDS` does not allow.
    """
    path, manifest = ckpt.read_checkpoint(out, ckpt.BC_STAGE)
    if manifest.get("kind") != KIND:
        raise ValueError(f"{path} is a {manifest.get('kind')!r} checkpoint, not a BC stage")
    ckpt.check_config(manifest.get("config", {}), run, path)
    return path, manifest


def load_stage(out: Path, run: Any, policy: Any, generator: torch.Generator) -> BCStage:
    """Load ``<out>/bc_stage/`` into ``policy`` (weights, optimizer), ``generator`` and the global RNGs
    (raises as :func:`open_stage`)."""
    path, manifest = open_stage(out, run)
    with np.load(path / "data.npz") as z:
        episodes, successes, deviations, unlabelled = (int(v) for v in z["counts"])
        data = ExpertData(_unpack(z["flat"], z["lengths"], int(z["width"])), z["actions"].astype(np.int64), episodes,
                          successes, [float(r) for r in z["returns"]], deviations, unlabelled)
    state = ckpt.load_pt(path / "stage.pt")
    ckpt.load_policy(policy, path, int(manifest["weight_version"]))
    policy.optimizer.load_state_dict(ckpt.load_pt(path / "optimizer.pt"))
    generator.set_state(state["generator"])
    ckpt.set_rng_state(state["rng"])
    return BCStage(int(manifest["round"]), int(manifest["epochs_done"]), data, list(state["losses"]),
                   list(state["rounds"]), dict(state["expert"]), float(state["seconds"]))
