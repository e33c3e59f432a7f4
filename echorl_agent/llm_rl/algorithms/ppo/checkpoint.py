"""PPO-method checkpoints: what ``<out>/checkpoint/`` holds for an :class:`LLMPPO` run (the folder's layout and
its atomic write are :mod:`echorl_agent.llm_rl.checkpoint`'s)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from echorl_agent.llm_rl.checkpoint import (
    load_pt,
    load_replay,
    rng_state,
    set_rng_state,
    write_checkpoint,
)

__all__ = ["load_ppo", "ppo_checkpoint_callback", "save_ppo"]


# ------------------------------------------------------------------ PPO methods (SB3)
def save_ppo(model: Any, curve: Any, cfg: Any, out: str | Path) -> Path:
    """Write ``<out>/checkpoint/`` for an :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` run, between two rollouts.

    What is saved: SB3's ``model.zip`` (policy and adapter weights, optimizer, ``num_timesteps``, update count), the
    adapter in peft's format, the curve rows and the global RNG states, and with replay (``echorl`` with the PPO
    learner) the replay buffer (``replay.bin``, as GiGPO's) and its sample generator. What is not: the envs' states
    (the episodes in progress) and SB3's episode-info buffer of the ``rollout/ep_*`` means; the rollout buffer needs
    nothing, since PPO refills it from scratch before every update.
    """
    replay = getattr(model, "replay", None)

    def write(folder: Path) -> None:
        model.save(folder / "model.zip")
        if model.policy.cfg.lora_rank > 0:
            model.policy.lm.save_adapter(folder / "adapter")
        extra = {"curve": [list(r) for r in curve.rows], "recent": list(curve.recent), "rng": rng_state()}
        if replay is not None:
            replay.buffer.save(str(folder / "replay.bin"))
            extra["replay_rng"] = replay.rng.bit_generator.state
        torch.save(extra, folder / "ppo.pt")

    info = {"method": cfg.method, "iteration": int(model._n_updates), "timesteps": int(model.num_timesteps),
            "episodes": len(curve.rows), "weight_version": model.policy.lm.engine.weight_version}
    return write_checkpoint(Path(out), cfg, cfg.learner, info, write)


def load_ppo(model: Any, curve: Any, checkpoint: tuple[Path, dict[str, Any]]) -> None:
    """Continue ``model`` (an ``LLMPPO`` built as for a fresh run) from ``checkpoint`` (:func:`open_checkpoint`).

    Loads the policy and optimizer from SB3's ``model.zip`` (``set_parameters``), SB3's counters, the curve rows and
    the RNG states; learn on with ``reset_num_timesteps=False``. Not exact (see :func:`save_ppo`): the episodes in
    progress at the checkpoint start over, so a warning says so.

    Raises:
        ValueError: a file that does not load.
    """
    from stable_baselines3.common.save_util import load_from_zip_file

    path, manifest = checkpoint
    extra = load_pt(path / "ppo.pt")
    replay = getattr(model, "replay", None)
    load_replay(None if replay is None else replay.buffer, checkpoint)
    try:
        data, params, _ = load_from_zip_file(path / "model.zip", device=model.device)
    except Exception as e:
        raise ValueError(f"checkpoint file {path / 'model.zip'} cannot be loaded ({type(e).__name__}: {e})") from e
    model.set_parameters(params, exact_match=True, device=model.device)
    if model.policy.remote is not None:
        model.policy.sync_engine()
    else:
        model.policy.lm.engine.reset_prefix_cache(int(manifest["weight_version"]))
    model.num_timesteps, model._n_updates = int(data["num_timesteps"]), int(data["_n_updates"])
    model._episode_num = int(data.get("_episode_num", 0))
    curve.rows = [(int(s), float(w), float(r)) for s, w, r in extra["curve"]]
    curve.recent.extend(float(x) for x in extra["recent"])
    set_rng_state(extra["rng"])
    if replay is not None:
        replay.rng.bit_generator.state = extra["replay_rng"]
    warnings.warn("PPO resumes from its last update but not exactly: the envs' states are not saved, so the episodes "
                  "in progress at the checkpoint start over (their steps stay counted), and the rollout/ep_* means "
                  "restart from the episodes after the resume", stacklevel=4)


def ppo_checkpoint_callback(cfg: Any, curve: Any, out: str | Path, rollout: int) -> Any:
    """SB3 callback writing curve.csv and a checkpoint at the start of every ``cfg.checkpoint_every``-th rollout
    (right after an update, so the rollout buffer holds nothing to save); ``rollout = n_steps * n_envs``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class CB(BaseCallback):
        def _on_training_start(self) -> None:
            self.saved = self.model.num_timesteps

        def _on_rollout_start(self) -> None:
            rounds = self.model.num_timesteps // rollout
            if rounds and rounds % cfg.checkpoint_every == 0 and self.model.num_timesteps > self.saved:
                curve.write()
                save_ppo(self.model, curve, cfg, out)
                self.saved = self.model.num_timesteps

        def _on_step(self) -> bool:
            return True

    return CB()
