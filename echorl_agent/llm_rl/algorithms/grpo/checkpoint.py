"""GRPO checkpoints: what ``<out>/checkpoint/`` holds for a :class:`GRPOTrainer` run (the folder's layout and
its atomic write are :mod:`echorl_agent.llm_rl.checkpoint`'s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from echorl_agent.llm_rl.checkpoint import (
    load_pt,
    rng_state,
    set_rng_state,
    write_checkpoint,
)

__all__ = ["load_grpo", "save_grpo"]


# ------------------------------------------------------------------ GRPO (free-text envs)
def save_grpo(trainer: Any, cfg: Any, out: str | Path, warm_losses: list[float]) -> Path:
    """Write ``<out>/checkpoint/`` for a :class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer` run of ``cfg`` between two
    GRPO steps, then empty the engine's prefix cache (keeping its weight version), as a resumed run's is.

    A run resumed from it computes what the uninterrupted run computes after the checkpoint: same weights (bit for
    bit), optimizer, task seeds and sampling seeds (both drawn from the trainer's generator), engine weight version
    and an equally empty prefix cache. ``timesteps`` in the manifest counts sampled completions."""
    per_step = trainer.cfg.group_size * trainer.cfg.prompts_per_step

    def write(folder: Path) -> None:
        torch.save(trainer.lm.trainable_state(), folder / "lm.pt")
        if trainer.lm.cfg.lora_rank > 0:
            trainer.lm.save_adapter(folder / "adapter")
        torch.save(trainer.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save({"num_steps": int(trainer.num_steps), "history": json.dumps(trainer.history),
                    "warm_losses": json.dumps(list(warm_losses)),
                    "generator": json.dumps(trainer.rng.bit_generator.state), "rng": rng_state()}, folder / "grpo.pt")

    info = {"method": cfg.method, "iteration": int(trainer.num_steps), "timesteps": int(trainer.num_steps) * per_step,
            "episodes": int(trainer.num_steps) * trainer.cfg.prompts_per_step,
            "weight_version": trainer.lm.engine.weight_version}
    path = write_checkpoint(Path(out), cfg, cfg.learner, info, write)
    trainer.lm.engine.reset_prefix_cache()  # the resumed run starts with an empty cache too
    return path


def load_grpo(trainer: Any, checkpoint: tuple[Path, dict[str, Any]]) -> list[float]:
    """Continue ``trainer`` (a fresh :class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer`, no warm start) from
    ``checkpoint`` (:func:`open_checkpoint`'s result); returns the warm start's losses of the original run.

    Raises:
        ValueError: a file that does not load.
    """
    path, manifest = checkpoint
    state = load_pt(path / "grpo.pt")
    weights = load_pt(path / "lm.pt")
    optimizer_state = load_pt(path / "optimizer.pt")
    trainer.lm.load_trainable_state(weights)  # also pushes the weights to the rollout engine
    trainer.lm.engine.reset_prefix_cache(int(manifest["weight_version"]))
    trainer.optimizer.load_state_dict(optimizer_state)
    trainer.num_steps = int(state["num_steps"])
    trainer.history = json.loads(state["history"])
    trainer.rng.bit_generator.state = json.loads(state["generator"])
    set_rng_state(state["rng"])
    return json.loads(state["warm_losses"])


