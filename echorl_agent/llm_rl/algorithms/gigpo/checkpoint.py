"""GiGPO / echorl checkpoints: what ``<out>/checkpoint/`` holds for a :class:`GiGPOTrainer` run (the folder's
layout and its atomic write are :mod:`echorl_agent.llm_rl.checkpoint`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from echorl_agent.llm_rl.checkpoint import (
    load_policy,
    load_pt,
    load_replay,
    rng_state,
    save_policy,
    set_rng_state,
    write_checkpoint,
)

__all__ = ["load_gigpo", "save_gigpo"]


# ------------------------------------------------------------------ GiGPO / echorl
def save_gigpo(trainer: Any, cfg: Any, out: str | Path) -> Path:
    """Write ``<out>/checkpoint/`` for a :class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer` run of ``cfg``, then empty
    the engine's prefix cache (keeping its weight version), as a resumed run's is.

    A run resumed from it computes exactly what the uninterrupted run computes after the checkpoint: same weights
    (bit for bit), optimizer, replay buffer, generators (group seeds, action samples, minibatch orders, replay
    samples), engine weight version and an equally empty prefix cache. (GiGPO on choice envs never samples in
    the engine: the trainer's torch generator samples the actions.)"""

    def write(folder: Path) -> None:
        save_policy(trainer.policy, folder)
        torch.save(trainer.policy.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save({"trainer": trainer.state_dict(), "rng": rng_state()}, folder / "trainer.pt")
        if trainer.replay is not None:
            trainer.replay.save(str(folder / "replay.bin"))

    info = {"method": cfg.method, "iteration": trainer.num_iterations, "timesteps": trainer.num_timesteps,
            "episodes": len(trainer.episodes_done), "weight_version": trainer.policy.lm.engine.weight_version}
    path = write_checkpoint(Path(out), cfg, cfg.learner, info, write)
    if trainer.policy.remote is None:
        # a resumed run starts with an empty prefix cache; so does this one's next iteration, so both compute it
        # identically (KV served from the cache and KV recomputed in another batch shape may differ by rounding)
        trainer.policy.lm.engine.reset_prefix_cache()
    return path


def load_gigpo(trainer: Any, checkpoint: tuple[Path, dict[str, Any]]) -> None:
    """Continue ``trainer`` (built as for a fresh run) from ``checkpoint`` (:func:`open_checkpoint`'s result).

    Everything is verified before anything changes: files (sizes, SHA-256) and config by :func:`open_checkpoint`,
    the replay file by its loader (fully, before it replaces the buffer's state).

    Raises:
        ValueError: a file that does not load, or replay on in one and off in the other.
    """
    path, manifest = checkpoint
    state = load_pt(path / "trainer.pt")
    optimizer_state = load_pt(path / "optimizer.pt")
    load_replay(trainer.replay, checkpoint)
    load_policy(trainer.policy, path, int(manifest["weight_version"]))
    trainer.policy.optimizer.load_state_dict(optimizer_state)
    trainer.load_state_dict(state["trainer"])
    set_rng_state(state["rng"])


