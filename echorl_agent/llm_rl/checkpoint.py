"""Resumable ``echorl train-llm`` runs: the ``<out>/checkpoint/`` folder, written atomically and checked on load.

Layout of a checkpoint::

    checkpoint.json  format, method, counters (iteration, env steps, episodes), the engine's weight version, the run's
                     config, and the size and SHA-256 of every other file (written last)
    adapter/         the LoRA adapter in peft's format (``save_pretrained``; ``lora_rank > 0``)
    policy.pt        the policy's other trained weights: value head, plan head (and the unfrozen layers when
                     ``lora_rank == 0``)
    optimizer.pt     the optimizer's state (Adam moments and step counts)
    trainer.pt       GiGPO: counters, curve rows, gigpo.csv rows, the trainer's numpy and torch generators, and the
                     global torch / numpy / Python RNG states
    lm.pt            GRPO: the trained weights (``TrainableLM.trainable_state``; ``adapter/`` too with LoRA)
    grpo.pt          GRPO: step count, per-step stats, the warm start's losses, the trainer's numpy generator (the
                     task seeds and the engine's sampling seeds come from it) and the global RNG states
    replay.bin       ``echorl`` with replay (either learner): the LLM replay buffer in its own checksummed format (its
                     loader checks it)
    model.zip        PPO methods: SB3's ``save`` (policy with adapters, optimizer, counters)
    ppo.pt           PPO methods: curve rows and the global RNG states (``echorl`` with the PPO learner: and the
                     replay's sample generator)

A save writes everything into ``<out>/.checkpoint.tmp-<pid>/``, then swaps it in with two renames (the previous
checkpoint goes to ``checkpoint.old/`` for the instant between them and is then deleted), so a crash leaves one
complete checkpoint: ``checkpoint/``, or ``checkpoint.old/`` (which a resume then uses, with a warning).

A load verifies every file against ``checkpoint.json`` before anything changes, and refuses a run whose config
differs from the checkpoint's in anything but ``train_steps``, ``checkpoint_every``, ``out`` and ``progress``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from echorl_agent.replay.serialization import pid_alive

__all__ = ["CHECKPOINT", "RESUMABLE_FIELDS", "check_config", "kind_of", "load_gigpo", "load_grpo", "load_ppo",
           "open_checkpoint", "ppo_checkpoint_callback", "read_checkpoint", "rng_state", "save_gigpo", "save_grpo",
           "save_ppo", "set_rng_state"]

CHECKPOINT = "checkpoint"
"""The checkpoint folder's name inside the output folder."""
RESUMABLE_FIELDS = ("train_steps", "checkpoint_every", "out", "progress", "eval_episodes", "eval_every")
"""Config fields a resumed run may change (a longer budget, another checkpoint period)."""
_FORMAT = "echorl-llm-checkpoint/1"
_MANIFEST = "checkpoint.json"
_UNHASHED = ("replay.bin",)
"""Files checked by their own loader (their checksums are inside); the manifest keeps their size only."""


# ------------------------------------------------------------------ folder: atomic write, verified read
def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _config_dict(cfg: Any) -> dict[str, Any]:
    """The config as ``checkpoint.json`` stores it (JSON types: tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _write(out: Path, cfg: Any, kind: str, info: dict[str, Any], write_files: Callable[[Path], None]) -> Path:
    """Write a checkpoint of ``kind`` with ``write_files(folder)``, then swap it in (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".checkpoint.tmp-*"):  # left by a killed save
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".checkpoint.tmp-{os.getpid()}"
    tmp.mkdir()
    write_files(tmp)
    files = {}
    for p in sorted(q for q in tmp.rglob("*") if q.is_file()):
        rel = p.relative_to(tmp).as_posix()
        files[rel] = {"size": p.stat().st_size, "sha256": None if rel in _UNHASHED else _digest(p)}
    manifest = {"format": _FORMAT, "kind": kind, **info, "config": _config_dict(cfg), "files": files}
    with open(tmp / _MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    final, old = out / CHECKPOINT, out / (CHECKPOINT + ".old")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


def read_checkpoint(out: str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint folder of ``out`` and its manifest, every file verified (size and SHA-256).

    Raises:
        FileNotFoundError: ``out`` holds no checkpoint.
        ValueError: a file is missing, truncated or corrupt, or the manifest is not a checkpoint's.
    """
    out = Path(out)
    path = out / CHECKPOINT
    if not path.is_dir() and (out / (CHECKPOINT + ".old")).is_dir():
        path = out / (CHECKPOINT + ".old")
        warnings.warn(f"{out / CHECKPOINT} is missing but {path} is complete (a save was interrupted while swapping "
                      "folders): resuming from it", stacklevel=3)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint to resume from: {out / CHECKPOINT} does not exist (start the run "
                                "without resume, or pass the output folder of the run to continue)")
    mpath = path / _MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError as e:
        raise ValueError(f"{mpath} is missing: the checkpoint in {path} is incomplete") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{mpath} is corrupt ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{mpath} is not an echorl checkpoint manifest (format {_FORMAT!r} expected)")
    for rel, meta in manifest["files"].items():
        p = path / rel
        if not p.is_file():
            raise ValueError(f"checkpoint file {p} is missing")
        size = p.stat().st_size
        if size != meta["size"]:
            raise ValueError(f"checkpoint file {p} is truncated or altered: {size} bytes, {meta['size']} written")
        if meta["sha256"] is not None and _digest(p) != meta["sha256"]:
            raise ValueError(f"checkpoint file {p} is corrupt: its SHA-256 differs from the one written")
    return path, manifest


def check_config(saved: dict[str, Any], cfg: Any, path: str | Path) -> None:
    """Refuse to resume with a config that differs from the checkpoint's (except :data:`RESUMABLE_FIELDS`).

    Raises:
        ValueError: naming the first differing field (``policy_kwargs['lora_rank']`` for a key inside a dict).
    """
    now = _config_dict(cfg)
    # a field added after the checkpoint was written (e.g. echorl_learner) had its default value in that run
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cfg)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    saved = {**json.loads(json.dumps({k: v for k, v in defaults.items() if k not in saved}, default=str)), **saved}
    for name in sorted(set(saved) | set(now)):
        if name in RESUMABLE_FIELDS or saved.get(name) == now.get(name):
            continue
        a, b, field = saved.get(name), now.get(name), name
        if isinstance(a, dict) and isinstance(b, dict):
            key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            a, b, field = a.get(key, "<unset>"), b.get(key, "<unset>"), f"{name}[{key!r}]"
        raise ValueError(f"cannot resume from {path}: {field} differs ({field}={a!r} in the checkpoint, {b!r} now); "
                         f"a resumed run may change only {', '.join(RESUMABLE_FIELDS)}")


def _load_pt(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # verified bytes that still do not load: another torch's format, say
        raise ValueError(f"checkpoint file {path} cannot be loaded ({type(e).__name__}: {e})") from e


def kind_of(method: str, echorl_learner: str = "gigpo") -> str:
    """``"gigpo"`` (GiGPO trainer state), ``"ppo"`` (SB3 model) or ``"grpo"`` (GRPO trainer state) for a train
    method (``echorl``: its learner); ValueError for an unknown one."""
    if "gigpo" in method or (method == "echorl" and echorl_learner == "gigpo"):
        return "gigpo"
    if method in ("bc", "ppo", "bc+ppo", "echoppo", "echorl"):
        return "ppo"
    if method == "grpo":
        return "grpo"
    raise ValueError(f"method {method!r} writes no checkpoint and cannot resume (GiGPO, echorl, GRPO and the PPO "
                     "methods can)")


def open_checkpoint(out: str | Path, cfg: Any) -> tuple[Path, dict[str, Any]]:
    """:func:`read_checkpoint` plus the checks that ``cfg`` may resume it (method kind, :func:`check_config`).

    Raises:
        FileNotFoundError: no checkpoint in ``out``.
        ValueError: a corrupt or incomplete checkpoint, another method's, or a different config.
    """
    kind = cfg.learner
    path, manifest = read_checkpoint(out)
    if manifest.get("kind") != kind:
        raise ValueError(f"{path} is a {manifest.get('kind')!r} checkpoint; method {cfg.method!r} resumes {kind!r} "
                         "checkpoints")
    check_config(manifest.get("config", {}), cfg, path)
    return path, manifest


# ------------------------------------------------------------------ global RNG states
def rng_state() -> dict[str, Any]:
    """Global torch (CPU and CUDA), numpy and Python RNG states, as plain tensors/ints (``weights_only`` loads them)."""
    npst = np.random.get_state(legacy=False)
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"key": torch.from_numpy(npst["state"]["key"].astype(np.int64)), "pos": int(npst["state"]["pos"]),
                       "has_gauss": int(npst["has_gauss"]), "gauss": float(npst["gauss"])}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s output."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "state": {"key": n["key"].numpy().astype(np.uint32),
                                                               "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})


# ------------------------------------------------------------------ policy weights
def _save_policy(policy: Any, folder: Path) -> None:
    """LoRA adapter (peft) + every other trained tensor of the policy."""
    state = policy.state_dict()
    if policy.cfg.lora_rank > 0:
        policy.lm.save_adapter(folder / "adapter")
        state = {k: v for k, v in state.items() if not k.startswith("lm.")}
    torch.save(state, folder / "policy.pt")


def _load_policy(policy: Any, folder: Path, weight_version: int | None) -> None:
    state = _load_pt(folder / "policy.pt")
    policy.load_state_dict(state)  # lm.* keys (lora_rank 0) go to the LM and the engine
    if policy.cfg.lora_rank > 0:
        from safetensors.torch import load_file

        f = folder / "adapter" / "adapter_model.safetensors"
        if not f.is_file():
            raise ValueError(f"checkpoint file {f} is missing (the policy has LoRA adapters)")
        policy.lm.load_trainable_state(load_file(str(f)))  # also pushes the weights to the rollout engine
    if policy.remote is not None:
        policy.sync_engine()
    elif weight_version is not None:
        # continue the engine's weight-version count (replay staleness counts versions) with an empty cache
        policy.lm.engine.reset_prefix_cache(weight_version)


def _load_replay(replay: Any, checkpoint: tuple[Path, dict[str, Any]]) -> None:
    """Load ``replay.bin`` into ``replay`` (an ``LLMReplayBuffer`` or None); refuse replay on in one and off in the
    other. The file's loader verifies it fully before it replaces the buffer's state."""
    path, manifest = checkpoint
    if (replay is None) != ("replay.bin" not in manifest["files"]):
        raise ValueError(f"{path}: replay is {'off' if replay is None else 'on'} now but the checkpoint "
                         f"{'has' if replay is None else 'lacks'} a replay buffer")
    if replay is not None:
        replay.load(str(path / "replay.bin"))  # ReplayFileError (a ValueError) names the file


# ------------------------------------------------------------------ GiGPO / echorl
def save_gigpo(trainer: Any, cfg: Any, out: str | Path) -> Path:
    """Write ``<out>/checkpoint/`` for a :class:`~echorl_agent.llm_rl.algorithms.gigpo.GiGPOTrainer` run of ``cfg``, then empty
    the engine's prefix cache (keeping its weight version), as a resumed run's is.

    A run resumed from it computes exactly what the uninterrupted run computes after the checkpoint: same weights
    (bit for bit), optimizer, replay buffer, generators (group seeds, action samples, minibatch orders, replay
    samples), engine weight version and an equally empty prefix cache. (GiGPO on choice envs never samples in
    the engine: the trainer's torch generator samples the actions.)"""

    def write(folder: Path) -> None:
        _save_policy(trainer.policy, folder)
        torch.save(trainer.policy.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save({"trainer": trainer.state_dict(), "rng": rng_state()}, folder / "trainer.pt")
        if trainer.replay is not None:
            trainer.replay.save(str(folder / "replay.bin"))

    info = {"method": cfg.method, "iteration": trainer.num_iterations, "timesteps": trainer.num_timesteps,
            "episodes": len(trainer.episodes_done), "weight_version": trainer.policy.lm.engine.weight_version}
    path = _write(Path(out), cfg, cfg.learner, info, write)
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
    state = _load_pt(path / "trainer.pt")
    optimizer_state = _load_pt(path / "optimizer.pt")
    _load_replay(trainer.replay, checkpoint)
    _load_policy(trainer.policy, path, int(manifest["weight_version"]))
    trainer.policy.optimizer.load_state_dict(optimizer_state)
    trainer.load_state_dict(state["trainer"])
    set_rng_state(state["rng"])


# ------------------------------------------------------------------ GRPO (free-text envs)
def save_grpo(trainer: Any, cfg: Any, out: str | Path, warm_losses: list[float]) -> Path:
    """Write ``<out>/checkpoint/`` for a :class:`~echorl_agent.llm_rl.algorithms.grpo.GRPOTrainer` run of ``cfg`` between two
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
    path = _write(Path(out), cfg, cfg.learner, info, write)
    trainer.lm.engine.reset_prefix_cache()  # the resumed run starts with an empty cache too
    return path


def load_grpo(trainer: Any, checkpoint: tuple[Path, dict[str, Any]]) -> list[float]:
    """Continue ``trainer`` (a fresh :class:`~echorl_agent.llm_rl.algorithms.grpo.GRPOTrainer`, no warm start) from
    ``checkpoint`` (:func:`open_checkpoint`'s result); returns the warm start's losses of the original run.

    Raises:
        ValueError: a file that does not load.
    """
    path, manifest = checkpoint
    state = _load_pt(path / "grpo.pt")
    weights = _load_pt(path / "lm.pt")
    optimizer_state = _load_pt(path / "optimizer.pt")
    trainer.lm.load_trainable_state(weights)  # also pushes the weights to the rollout engine
    trainer.lm.engine.reset_prefix_cache(int(manifest["weight_version"]))
    trainer.optimizer.load_state_dict(optimizer_state)
    trainer.num_steps = int(state["num_steps"])
    trainer.history = json.loads(state["history"])
    trainer.rng.bit_generator.state = json.loads(state["generator"])
    set_rng_state(state["rng"])
    return json.loads(state["warm_losses"])


# ------------------------------------------------------------------ PPO methods (SB3)
def save_ppo(model: Any, curve: Any, cfg: Any, out: str | Path) -> Path:
    """Write ``<out>/checkpoint/`` for an :class:`~echorl_agent.llm_rl.algorithms.ppo.LLMPPO` run, between two rollouts.

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
    return _write(Path(out), cfg, cfg.learner, info, write)


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
    extra = _load_pt(path / "ppo.pt")
    replay = getattr(model, "replay", None)
    _load_replay(None if replay is None else replay.buffer, checkpoint)
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
                  "restart from the episodes after the resume", stacklevel=3)


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
