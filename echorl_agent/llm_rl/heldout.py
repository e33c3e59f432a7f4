"""Held-out evaluation of an LLM policy before and after training: the verdict of ``echorl train-llm``.

The held-out instances are the ones the seed studies of ``benchmarks/`` play (so a ``train-llm`` run and a study run
on the same seed evaluate on the same episodes):

* **choice envs** (``bc``, ``ppo``, ``gigpo``, ...): episode seeds ``100000 + 1000 * seed + ep`` for ``ep < N``
  (:func:`held_out_seeds`). Training never resets on them: PPO's envs are seeded ``seed + i`` once and then draw
  their episodes from their own RNG streams, the BC warm start plays seeds ``10000 + seed + ep``, GiGPO draws its
  groups' seeds uniformly from ``[1000000, 2**31 - 1)`` (a clash with a held-out seed has probability < 1e-6 per
  run; :func:`held_out_seeds` documents the rule);
* **free text** (``grpo``): task seeds ``500000 + ep`` (``benchmarks/llm_rl_grpo.py``'s held-out tasks, the same for
  every seed; training tasks are drawn below them).

Every instance is played in both modes, **sampled** (actions drawn from pi) and **greedy** (argmax). The choice-env
player is the studies' own: a GiGPO trainer plays with :meth:`GiGPOTrainer.evaluate` (its envs in one batch, sampled
actions from the trainer's generator, as ``benchmarks/gigpo_signal.py``), an SB3 model with ``predict`` one env at a
time with the torch seed set to the episode seed (as ``benchmarks/llm_rl_learning.py``). The global torch RNG and the
trainer's generator are restored after an evaluation unless it is the one the studies ran at that point (the start
of RL for GiGPO), so evaluating does not change what trains.

:class:`HeldOutEval` writes the episodes (``eval_episodes.csv``) and their summaries (``eval.json``); the paired
statistics and the verdict line are :mod:`echorl_agent.eval.verdict`'s (statistics live in ``eval/``, above this
module), which ``echorl train-llm`` and ``echorl eval-llm`` call on the run folder.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HELD_OUT_SEED_BASE", "HELD_OUT_TASK_BASE", "MODES", "Episode", "HeldOutEval", "action_text", "held_out_seed",
           "held_out_seeds", "play", "read_episodes", "summarize"]

log = logging.getLogger(__name__)

HELD_OUT_SEED_BASE = 100_000
"""Choice envs: held-out episode ``ep`` of run seed ``seed`` is reset with ``HELD_OUT_SEED_BASE + 1000 * seed + ep``."""
HELD_OUT_TASK_BASE = 500_000
"""Free-text envs: held-out task ``ep`` is task seed ``HELD_OUT_TASK_BASE + ep`` (the same for every run seed)."""
MODES = ("sampled", "greedy")
"""Evaluation modes: actions sampled from pi, or its argmax."""


def held_out_seed(seed: int, ep: int) -> int:
    """The reset seed of held-out episode ``ep`` of run seed ``seed`` on a choice env (training uses other seeds)."""
    return HELD_OUT_SEED_BASE + 1000 * seed + ep


def held_out_seeds(seed: int, episodes: int, free_text: bool = False) -> list[int]:
    """The ``episodes`` held-out instances of a run: ``100000 + 1000 * seed + ep`` on choice envs, ``500000 + ep`` on
    free-text envs (see the module docstring for why training never plays them).

    Raises:
        ValueError: ``episodes > 1000`` on a choice env (run seed ``seed + 1``'s instances would start).
    """
    if free_text:
        return [HELD_OUT_TASK_BASE + ep for ep in range(episodes)]
    if episodes > 1000:
        raise ValueError(f"eval_episodes must be <= 1000 on a choice env (held-out seeds are 100000 + 1000 * seed + ep),"
                         f" got eval_episodes={episodes}")
    return [held_out_seed(seed, ep) for ep in range(episodes)]


@dataclass
class Episode:
    """One held-out episode: where it was played (``phase``, ``mode``, ``seed``) and how it ended."""

    phase: str
    mode: str
    seed: int
    won: bool
    ret: float
    steps: int
    actions: list[str]


def action_text(step: Any) -> str:
    """The text of the action a rollout step took (its anchor key holds the admissible list)."""
    return step.anchor.split("\x00", 1)[1].split("\x1f")[step.action]


@contextlib.contextmanager
def _kept_rng(model: Any, keep: bool) -> Iterator[None]:
    """Restore the global torch RNG and a GiGPO trainer's generator afterwards, and empty the engine's prefix cache,
    unless ``keep``."""
    import torch

    if keep:
        yield
        return
    gen = getattr(model, "generator", None)
    state = gen.get_state() if gen is not None else None
    with torch.random.fork_rng(devices=[]):
        yield
    if state is not None:
        gen.set_state(state)
    # the next forward pass meets the cache it would have met without this evaluation (reused KV can differ from
    # recomputed KV by rounding); an evaluation the studies ran at this point keeps its cache as they did
    lm = getattr(getattr(model, "policy", None), "lm", None) or getattr(model, "lm", None)
    engine = getattr(lm, "engine", None)
    if engine is not None and hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()


def play(model: Any, seeds: Sequence[int], mode: str, env_fn: Any = None, phase: str = "",
         envs: Sequence[Any] | None = None) -> list[Episode]:
    """Play one held-out episode per seed in ``mode`` (``"sampled"`` or ``"greedy"``) with ``model``.

    Args:
        model: a :class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer` (plays its envs in one batch), a
            :class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer` (one answer per task seed; sampling seeded by the task) or
            any SB3-style model with ``predict`` (one env from ``env_fn`` at a time, torch seeded by the episode seed).
        env_fn: builds the wrapped env an SB3-style model plays in (unused otherwise).
        envs: the wrapped envs (``encode=False``) a GiGPO trainer plays in one batch instead of its training envs
            (``eval_env_kwargs``); None: its own.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
    greedy = mode == "greedy"
    if hasattr(model, "answers"):  # GRPO on a free-text env: the env's judge is the success
        texts = model.answers(list(seeds), temperature=0.0 if greedy else 1.0)
        out = []
        for s, t in zip(seeds, texts, strict=True):
            r = float(model.judge(s, t))
            out.append(Episode(phase, mode, int(s), r > 0, r, 1, [t]))
        return out
    if hasattr(model, "evaluate") and hasattr(model, "envs"):  # GiGPO trainer
        eps = model.evaluate(list(seeds), deterministic=greedy, **({"envs": envs} if envs is not None else {}))
        return [Episode(phase, mode, int(s), bool(e.won), float(e.ret), len(e.steps), [action_text(st) for st in e.steps])
                for s, e in zip(seeds, eps, strict=True)]
    import torch

    env = env_fn()
    out = []
    try:
        for s in seeds:
            torch.manual_seed(int(s))
            obs, info = env.reset(seed=int(s))
            done, steps, ret, actions = False, 0, 0.0, []
            while not done:
                a, _ = model.predict(obs, deterministic=greedy)
                index = int(np.asarray(a).reshape(-1)[0])
                actions.append(env.action_text(index))
                obs, r, term, trunc, info = env.step(index)
                steps, ret, done = steps + 1, ret + float(r), term or trunc
            out.append(Episode(phase, mode, int(s), bool(info.get("won")), ret, steps, actions))
    finally:
        env.close()
    return out


def summarize(episodes: Sequence[Episode]) -> dict[str, dict[str, float]]:
    """Per mode: success rate, mean return and mean length of ``episodes``."""
    out = {}
    for mode in MODES:
        sel = [e for e in episodes if e.mode == mode]
        if sel:
            out[mode] = {"success": float(np.mean([e.won for e in sel])), "return": float(np.mean([e.ret for e in sel])),
                         "steps": float(np.mean([e.steps for e in sel])), "episodes": len(sel)}
    return out


class HeldOutEval:
    """The held-out evaluations of one training run: ``before`` (the pretrained LM), ``after_bc`` (the start of RL
    after a BC warm start), ``after`` (the trained policy) and, every ``eval_every`` iterations, points on the way.

    Writes ``eval.json`` (summary, paired differences, seeds) and ``eval_episodes.csv`` (one row per episode) into
    ``out`` (after the ``before`` and ``after_bc`` points too); a resumed run reads those rows back from
    ``eval_episodes.csv``.

    Args:
        cfg: the run's :class:`~echorl_agent.llm_rl.train.LLMTrainConfig` (``eval_episodes``, ``seed``, env).
        out: the run's output folder (None: keep the results in memory only).
        progress: the run's :class:`~echorl_agent.llm_rl.progress.RunProgress` (a bar per evaluation), or None.
        resume: the run continues from its checkpoint: read its earlier ``before`` / ``after_bc`` rows.
        prefix: the files' names, ``<prefix>.json`` and ``<prefix>_episodes.csv`` (``echorl eval-llm``: another
            name, so that the run's own stay as they are).
    """

    def __init__(self, cfg: Any, out: Path | None, progress: Any = None, resume: bool = False,
                 prefix: str = "eval") -> None:
        self.cfg, self.out, self.progress, self.prefix = cfg, out, progress, prefix
        self.free_text = cfg.learner == "grpo"
        self.seeds = held_out_seeds(cfg.seed, cfg.eval_episodes, self.free_text)
        self.env_kwargs = {**cfg.env_kwargs, **getattr(cfg, "eval_env_kwargs", {})}
        """The held-out env's ``gym.make`` arguments: ``eval_env_kwargs`` over ``env_kwargs``."""
        self.episodes: list[Episode] = []
        self.points: list[dict[str, float]] = []
        if resume and out is not None and (out / "eval_episodes.csv").exists():
            self._read_rows(out / "eval_episodes.csv")

    def env_fn(self) -> Any:
        from echorl_agent.llm_rl.rollout import make_choice_env

        c = self.cfg  # the env train.make_llm_env builds: the run's history, step cap and options
        return make_choice_env(c.env_id, c.history, c.max_episode_steps, self.env_kwargs)

    def batch_envs(self, model: Any) -> list[Any] | None:
        """The envs a GiGPO trainer plays the held-out episodes in when ``eval_env_kwargs`` sets another env (as many
        as its training envs, at most one per seed; the caller closes them); None: its training envs."""
        c = self.cfg
        if not getattr(c, "eval_env_kwargs", None) or not (hasattr(model, "evaluate") and hasattr(model, "envs")):
            return None
        from echorl_agent.llm_rl.rollout import make_choice_env

        n = max(1, min(len(model.envs), len(self.seeds)))
        return [make_choice_env(c.env_id, c.history, c.max_episode_steps, self.env_kwargs, encode=False)
                for _ in range(n)]

    def run(self, model: Any, phase: str, keep_rng: bool = False) -> dict[str, dict[str, float]]:
        """Play the held-out instances in both modes as ``phase``; returns :func:`summarize` of them.

        Args:
            keep_rng: leave the RNGs as the evaluation left them (what the studies did at this point) instead of
                restoring them.
        """
        import time

        if phase == "before" and not self.cfg.eval_before:
            return {}  # the run starts RL after its BC warm start; LLMTrainConfig checked that it has one
        t0 = time.perf_counter()
        got: list[Episode] = []
        prog = self.progress
        if prog is not None:
            prog.stage(f"held-out {phase} ({len(self.seeds)} episodes x {len(MODES)} modes)", unit="env step",
                       counting="env_steps", scoring="playing")
        envs = self.batch_envs(model)
        try:
            with _kept_rng(model, keep_rng):
                for mode in MODES:
                    got += play(model, self.seeds, mode, self.env_fn, phase, envs)
                    if prog is not None:
                        prog.update(0, **{mode: float(np.mean([e.won for e in got if e.mode == mode]))})
        finally:
            for env in envs or ():
                env.close()
        self.episodes = [e for e in self.episodes if e.phase != phase] + got
        if phase in ("before", "after_bc"):
            self.write()  # on disk now: a run cut later reads them back when it resumes
        s = summarize(got)
        log.info("held-out %s: %s (%.0f s)", phase, ", ".join(f"{m} {v['success']:.2f}" for m, v in s.items()),
                 time.perf_counter() - t0)
        return s

    def has(self, phase: str) -> bool:
        """Whether ``phase``'s episodes are in (played, or read back by a resumed run)."""
        return any(e.phase == phase for e in self.episodes)

    def point(self, model: Any, timesteps: int) -> dict[str, float]:
        """A held-out point during training (``eval_every``): both modes' success, RNGs restored."""
        s = self.run(model, f"step{timesteps}")
        row = {"timesteps": timesteps, **{f"heldout_{m}_success": v["success"] for m, v in s.items()}}
        self.points.append(row)
        return row

    def result(self, env_steps: int | None = None) -> dict[str, Any]:
        """What ``eval.json`` holds."""
        by = {ph: [e for e in self.episodes if e.phase == ph] for ph in ("before", "after_bc", "after")}
        res: dict[str, Any] = {"episodes": len(self.seeds), "seeds": self.seeds,
                               "seed_rule": "500000 + ep (free-text tasks)" if self.free_text else
                               f"100000 + 1000 * seed + ep (seed={self.cfg.seed}, ep < {len(self.seeds)})",
                               "modes": list(MODES)}
        if getattr(self.cfg, "eval_env_kwargs", None):
            res["env_kwargs"] = self.env_kwargs  # the held-out env differs from the training env
        for ph, eps in by.items():
            if eps:
                res[ph] = summarize(eps)
        if self.points:
            res["points"] = self.points
        if env_steps is not None:
            res["env_steps"] = int(env_steps)
        return res

    def write(self, env_steps: int | None = None) -> dict[str, Any]:
        """Write ``<prefix>.json`` and ``<prefix>_episodes.csv`` (if the run has an output folder); returns the
        result."""
        prefix = self.prefix
        res = self.result(env_steps)
        if self.out is None:
            return res
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{prefix}.json").write_text(json.dumps(res, indent=2, default=_json_default))
        with open(self.out / f"{prefix}_episodes.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["phase", "mode", "episode_seed", "won", "return", "steps", "actions"])
            for e in self.episodes:
                w.writerow([e.phase, e.mode, e.seed, int(e.won), e.ret, e.steps, " | ".join(e.actions)])
        return res

    def _read_rows(self, path: Path) -> None:
        self.episodes += [e for e in read_episodes(path) if e.phase in ("before", "after_bc")]


def read_episodes(path: str | Path) -> list[Episode]:
    """The episodes of an ``eval_episodes.csv``."""
    with open(path, newline="") as f:
        return [Episode(r["phase"], r["mode"], int(r["episode_seed"]), r["won"] == "1", float(r["return"]),
                        int(r["steps"]), r["actions"].split(" | ") if r["actions"] else []) for r in csv.DictReader(f)]


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(f"not JSON serializable: {x!r}")
