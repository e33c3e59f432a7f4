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

What each method writes into the folder is its own (``algorithms/<method>/checkpoint.py``); the manifest's ``kind``
is the learner's registry name (:func:`~echorl_agent.llm_rl.algorithms.registry.kind_of`), and a run resumes only
its own learner's checkpoints.

A load verifies every file against ``checkpoint.json`` before anything changes, and refuses a run whose config
differs from the checkpoint's in anything but :data:`RESUMABLE_FIELDS` (budget, checkpoint period, output,
progress, held-out evaluation, env servers).
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

__all__ = ["BC_STAGE", "CHECKPOINT", "RESUMABLE_FIELDS", "check_config", "load_policy", "load_pt", "load_replay",
           "has_checkpoint", "load_run_adapter",
           "open_checkpoint", "read_checkpoint", "rng_state", "save_policy", "set_rng_state", "write_checkpoint"]

CHECKPOINT = "checkpoint"
"""The checkpoint folder's name inside the output folder."""
BC_STAGE = "bc_stage"
"""The BC warm start's own checkpoint folder (after every epoch, until RL writes :data:`CHECKPOINT`):
:mod:`~echorl_agent.llm_rl.algorithms.bc.warm_start`."""
RESUMABLE_FIELDS = ("train_steps", "checkpoint_every", "out", "progress", "eval_episodes", "eval_every", "env_urls",
                    "env_step_timeout_s", "backend", "rollout_workers", "max_policy_lag")
"""Config fields a resumed run may change (a longer budget, another checkpoint period, other env servers or rollout
workers: where an env runs does not change what it is)."""
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


def write_checkpoint(out: Path, cfg: Any, kind: str, info: dict[str, Any], write_files: Callable[[Path], None],
                     name: str = CHECKPOINT) -> Path:
    """Write a checkpoint of ``kind`` with ``write_files(folder)``, then swap it in (see the module docstring);
    ``name``: the folder inside ``out`` (:data:`BC_STAGE` for the BC warm start's)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f".{name}.tmp-*"):  # left by a killed save
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".{name}.tmp-{os.getpid()}"
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
    final, old = out / name, out / (name + ".old")
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


def has_checkpoint(out: str | Path, name: str = CHECKPOINT) -> bool:
    """Whether ``out`` holds the checkpoint folder ``name`` (or its ``.old`` from an interrupted swap), complete or
    not: :func:`read_checkpoint` verifies it."""
    return (Path(out) / name).is_dir() or (Path(out) / (name + ".old")).is_dir()


def read_checkpoint(out: str | Path, name: str = CHECKPOINT) -> tuple[Path, dict[str, Any]]:
    """The checkpoint folder ``name`` of ``out`` and its manifest, every file verified (size and SHA-256).

    Raises:
        FileNotFoundError: ``out`` holds no checkpoint.
        ValueError: a file is missing, truncated or corrupt, or the manifest is not a checkpoint's.
    """
    out = Path(out)
    path = out / name
    if not path.is_dir() and (out / (name + ".old")).is_dir():
        path = out / (name + ".old")
        warnings.warn(f"{out / name} is missing but {path} is complete (a save was interrupted while swapping "
                      "folders): resuming from it", stacklevel=3)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint to resume from: {out / name} does not exist (start the run "
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


def load_pt(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # verified bytes that still do not load: another torch's format, say
        raise ValueError(f"checkpoint file {path} cannot be loaded ({type(e).__name__}: {e})") from e


def open_checkpoint(out: str | Path, cfg: Any) -> tuple[Path, dict[str, Any]]:
    """:func:`read_checkpoint` plus the checks that ``cfg`` may resume it (its learner's kind, ``cfg.learner``;
    :func:`check_config`).

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
def save_policy(policy: Any, folder: Path) -> None:
    """LoRA adapter (peft) + every other trained tensor of the policy."""
    state = policy.state_dict()
    if policy.cfg.lora_rank > 0:
        policy.lm.save_adapter(folder / "adapter")
        state = {k: v for k, v in state.items() if not k.startswith("lm.")}
    torch.save(state, folder / "policy.pt")


def load_policy(policy: Any, folder: Path, weight_version: int | None) -> None:
    state = load_pt(folder / "policy.pt")
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


def load_run_adapter(policy: Any, run_dir: str | Path) -> None:
    """Load the LoRA adapter an earlier run wrote (``<run_dir>/adapter/``, peft's format) into ``policy`` and its
    engine (``LLMTrainConfig.init_from``).

    Raises:
        ValueError: no adapter there, or one of another shape (another ``lora_rank``, ``train_layers`` or model),
            naming the first differing tensor.
    """
    from safetensors.torch import load_file

    f = Path(run_dir) / "adapter" / "adapter_model.safetensors"
    if policy.cfg.lora_rank == 0:
        raise ValueError(f"init_from={str(run_dir)!r} loads a LoRA adapter; this run trains whole layers "
                         "(lora_rank=0)")
    if not f.is_file():
        raise ValueError(f"init_from={str(run_dir)!r}: {f} is missing (the folder of a finished train-llm run "
                         "holds adapter/)")
    state, mine = load_file(str(f)), policy.lm.trainable_state()
    for name in sorted(set(state) | set(mine)):
        a, b = state.get(name), mine.get(name)
        if a is None or b is None or a.shape != b.shape:
            raise ValueError(f"init_from={str(run_dir)!r}: its adapter does not fit this run's policy ({name}: "
                             f"{'missing' if a is None else tuple(a.shape)} there, "
                             f"{'missing' if b is None else tuple(b.shape)} here; same model, lora_rank and "
                             "train_layers needed)")
    policy.lm.load_trainable_state(state)  # also pushes the weights to the rollout engine
    if policy.remote is not None:
        policy.sync_engine()


def load_replay(replay: Any, checkpoint: tuple[Path, dict[str, Any]]) -> None:
    """Load ``replay.bin`` into ``replay`` (an ``LLMReplayBuffer`` or None); refuse replay on in one and off in the
    other. The file's loader verifies it fully before it replaces the buffer's state."""
    path, manifest = checkpoint
    if (replay is None) != ("replay.bin" not in manifest["files"]):
        raise ValueError(f"{path}: replay is {'off' if replay is None else 'on'} now but the checkpoint "
                         f"{'has' if replay is None else 'lacks'} a replay buffer")
    if replay is not None:
        replay.load(str(path / "replay.bin"))  # ReplayFileError (a ValueError) names the file
