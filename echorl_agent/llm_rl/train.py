"""One entry point that trains an LLM policy on an echorl env and writes curves, checkpoints and TensorBoard logs.

Methods (choice envs): ``bc`` (behaviour cloning on the expert), ``ppo`` (LLM-PPO from the pretrained LM),
``bc+ppo`` (BC warm start, then PPO), ``echoppo`` (BC warm start, then PPO with the latent plan and its KL term;
``plan_tokens`` > 0), ``gigpo`` (critic-free group RL from the pretrained LM, :mod:`echorl_agent.llm_rl.algorithms.gigpo`),
``bc+gigpo`` (BC warm start, then GiGPO), ``echorl`` (EchoRL on the LM: GiGPO + latent plan tokens with their KL
term + hot/cold prioritized replay of LLM transitions; ablate with ``plan_tokens=0`` or ``replay={"off": True}``;
``echorl_learner="ppo"``: echoppo -- BC warm start, PPO, plan tokens and KL -- plus the same replay). Free-text envs: ``grpo`` (oracle-answer warm start, then GRPO). Used by
``echorl train-llm`` and by the bench agents ``llm-bc``, ``llm-ppo``, ``llm-echoppo``, ``llm-gigpo``, ``llm-grpo``.

Every choice env trains with its own step limit unless ``max_episode_steps`` caps it: the final observation of a
truncated episode lists no admissible action and gets a value-only record (SB3 bootstraps its value).

Budgets: ``train_steps`` is rounded UP to whole iterations (a GiGPO run stops at the end of the first iteration at or
past it; PPO collects whole rollouts of ``n_steps * n_envs``); GRPO's completions are rounded down to whole steps.
With ``eval_episodes`` > 0 the run plays held-out instances before and after training (and after a BC warm start)
in both modes (:mod:`echorl_agent.llm_rl.heldout`); ``progress`` shows a live bar per stage
(:mod:`echorl_agent.llm_rl.progress`).

Output folder: ``curve.csv`` (:mod:`echorl_agent.llm_rl.curve`: env steps, success rate and mean return over the last
20 training episodes, the episode's own return, held-out points), ``eval.json`` and ``eval_episodes.csv`` (held-out
evaluation; ``echorl_agent.eval.verdict.finish`` adds the paired differences), ``model.zip`` (SB3 format;
adapters inside; PPO methods), ``adapter/`` (peft format), ``tb/`` (TensorBoard: SB3's ``train/*`` and ``rollout/*``
keys; GiGPO's ``train/*``, ``rollout/*`` and ``time/*``), ``gigpo.csv`` (GiGPO: one row per iteration),
``bc.json`` (BC warm start), ``config.json``, ``checkpoint/`` (every ``checkpoint_every`` iterations and at the end;
``train_llm(cfg, resume=True)`` continues from it, see :mod:`echorl_agent.llm_rl.checkpoint`).
``load_trained(out)`` gives a finished run's model back (to act, or to evaluate again on other env options).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from echorl_agent.llm_rl.curve import rolling_rows, write_curve
from echorl_agent.llm_rl.progress import RunProgress

__all__ = ["ECHORL_LEARNERS", "LLMTrainConfig", "METHODS", "load_trained", "train_llm", "make_llm_env"]

log = logging.getLogger(__name__)

METHODS = ("bc", "ppo", "bc+ppo", "echoppo", "gigpo", "bc+gigpo", "echorl", "grpo")
ECHORL_LEARNERS = ("gigpo", "ppo")
"""Learners of ``method="echorl"`` (``LLMTrainConfig.echorl_learner``)."""


#: The GiGPO learner options ``LLMTrainConfig.gigpo_kwargs`` may set.
GIGPO_LEARNER_FIELDS = ("epochs", "minibatch_size", "clip_range", "ent_coef", "normalize", "max_grad_norm", "micro_batch",
                        "ref_kl_coef", "target_kl", "sample_weighting", "center_advantages", "positive_advantages")
#: The PPO options ``LLMTrainConfig.ppo_kwargs`` may set (SB3 ``PPO`` arguments of the same names).
PPO_LEARNER_FIELDS = ("clip_range", "target_kl", "gae_lambda", "vf_coef", "max_grad_norm")
_PPO_BOUNDS = {"clip_range": ("> 0", lambda v: v > 0), "target_kl": ("> 0 or None", lambda v: v > 0),
               "gae_lambda": ("in [0, 1]", lambda v: 0 <= v <= 1), "vf_coef": (">= 0", lambda v: v >= 0),
               "max_grad_norm": ("> 0", lambda v: v > 0)}


@dataclass
class LLMTrainConfig:
    """What ``echorl train-llm`` runs."""

    env_id: str = "EchoRL/MiniGrid-Empty-5x5-v0"
    method: str = "bc+ppo"
    """One of :data:`METHODS`."""
    train_steps: int = 512
    """PPO env steps (choice envs) or GRPO sampled completions (free text)."""
    bc_episodes: int = 8
    """Expert episodes for the BC warm start (``bc``, ``bc+ppo``, ``echoppo``, ``bc+gigpo``, ``echorl`` with
    ``bc_warm_start``); oracle answers for ``grpo`` (0: GRPO from the pretrained LM)."""
    bc_epochs: int = 3
    bc_learning_rate: float | None = None
    """Learning rate of the BC warm start (None: ``learning_rate``)."""
    bc_batch_size: int | None = None
    """Minibatch of the BC warm start (None: ``batch_size``)."""
    seed: int = 0
    history: int = 0
    """History window k of the prompts."""
    max_episode_steps: int | None = None
    """Per-episode step cap for training (None: the env's)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` arguments of the env."""
    n_envs: int = 1
    """Envs stepping together (their candidates are scored in one engine call per step); for GiGPO,
    ``n_envs = groups * group_size`` (None-like 1 means one group)."""
    n_steps: int = 64
    """PPO rollout length per env and update."""
    batch_size: int = 16
    """PPO minibatch; must divide ``n_steps * n_envs``."""
    n_epochs: int = 2
    learning_rate: float = 1e-4
    ent_coef: float = 0.01
    gamma: float | None = None
    """Discount (None: 0.99 for PPO, 0.95 for GiGPO's step returns)."""
    group_size: int = 4
    """GiGPO: K episodes per group (one seed)."""
    step_advantage_weight: float = 1.0
    """GiGPO: omega, the weight of the anchor-state step advantage."""
    replay: dict[str, Any] | None = None
    """``echorl``: :class:`~echorl_agent.replay.llm.LLMReplayBuffer` arguments (None: capacity 4096, 1024 MB of
    activations); ``{"off": True}`` disables replay (the plan-only ablation)."""
    replay_ratio: float = 1.0
    """``echorl``: replayed samples per fresh sample in each update."""
    echorl_learner: str = "gigpo"
    """``echorl``: the learner under the plan and the replay, one of :data:`ECHORL_LEARNERS`: "gigpo" (critic-free
    groups of K episodes) or "ppo" (echoppo: BC warm start, PPO with the value head, plan tokens and KL)."""
    bc_warm_start: bool = False
    """``echorl`` with the GiGPO learner: behaviour-clone ``bc_episodes`` expert episodes first (as ``bc+gigpo``
    does for ``gigpo``); False starts from the pretrained LM. The PPO learner always warm-starts (as ``echoppo``)."""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.config.LLMPolicyConfig` / PlanningConfig fields."""
    grpo_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.algorithms.grpo.GRPOConfig` fields (``grpo``)."""
    gigpo_kwargs: dict[str, Any] = field(default_factory=dict)
    """Learner fields of :class:`~echorl_agent.llm_rl.algorithms.gigpo.GiGPOConfig` (:data:`GIGPO_LEARNER_FIELDS`: ``epochs``,
    ``minibatch_size``, ``clip_range``, ``ent_coef``, ``normalize``, ``max_grad_norm``, ``micro_batch``, ``ref_kl_coef``,
    ``target_kl``) for the
    GiGPO methods (``gigpo``, ``bc+gigpo``, ``echorl``); the rest of GiGPOConfig comes from the fields above."""
    ppo_kwargs: dict[str, Any] = field(default_factory=dict)
    """PPO options (:data:`PPO_LEARNER_FIELDS`: ``clip_range``, ``target_kl``, ``gae_lambda``, ``vf_coef``,
    ``max_grad_norm``, SB3's meanings; unset: SB3's defaults 0.2, None, 0.95, 0.5, 0.5) for the PPO methods (``ppo``,
    ``bc+ppo``, ``echoppo``, ``echorl`` with the PPO learner). ``target_kl`` ends an update's epochs at the first
    minibatch whose approximate KL to the rollout policy exceeds ``1.5 * target_kl``."""
    checkpoint_every: int = 10
    """Write ``<out>/checkpoint/`` every this many iterations (GiGPO iterations, PPO rollout+update rounds) and at
    the end; 0: at the end only (``grpo``: every this many GRPO steps)."""
    eval_episodes: int = 0
    """Held-out instances per mode (sampled and greedy) played before and after training
    (:mod:`echorl_agent.llm_rl.heldout`: seeds ``100000 + 1000 * seed + ep``, free text ``500000 + ep``); writes
    ``eval.json`` and ``eval_episodes.csv``. 0: no held-out evaluation (``echorl train-llm`` defaults to 20)."""
    eval_every: int = 0
    """Also evaluate the held-out instances every this many iterations (GiGPO iterations, PPO rollouts): rows in
    ``curve.csv`` (``heldout_*`` columns) and TensorBoard ``eval/*``. 0: before and after only."""
    out: str | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            import difflib

            hint = difflib.get_close_matches(self.method, METHODS, n=1)
            raise ValueError(f"method must be one of {METHODS}, got method={self.method!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if self.echorl_learner not in ECHORL_LEARNERS:
            raise ValueError(f"echorl_learner must be one of {ECHORL_LEARNERS}, got echorl_learner={self.echorl_learner!r}")
        for name in ("train_steps", "bc_episodes", "n_envs", "n_steps", "batch_size", "n_epochs", "group_size"):
            v = getattr(self, name)
            zero_ok = name == "train_steps" or name == "bc_episodes" and self.method == "grpo"  # grpo: no warm start
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1):
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        if self.learner == "gigpo":
            if self.group_size < 2:
                raise ValueError(f"group_size must be >= 2 (GiGPO compares the episodes of a group), "
                                 f"got group_size={self.group_size}")
            if self.n_envs > 1 and self.n_envs % self.group_size:
                raise ValueError(f"n_envs must be a multiple of group_size (groups of K envs), got n_envs={self.n_envs}, "
                                 f"group_size={self.group_size}")
        elif self.learner == "ppo" and self.method != "bc" and self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 for PPO (advantages are normalised per minibatch), "
                             f"got batch_size={self.batch_size}")
        elif self.learner == "ppo" and self.method != "bc" and (self.n_steps * self.n_envs) % self.batch_size:
            raise ValueError(f"batch_size must divide n_steps * n_envs, got batch_size={self.batch_size}, "
                             f"n_steps={self.n_steps}, n_envs={self.n_envs}")
        self._check_learner_kwargs("gigpo_kwargs", GIGPO_LEARNER_FIELDS, self.learner == "gigpo", "the GiGPO methods")
        self._check_learner_kwargs("ppo_kwargs", PPO_LEARNER_FIELDS, self.learner == "ppo" and self.method != "bc",
                                   "the PPO methods (ppo, bc+ppo, echoppo, echorl with echorl_learner='ppo')")
        for name, v in self.ppo_kwargs.items():
            bound, ok = _PPO_BOUNDS[name]
            if not (name == "target_kl" and v is None or not isinstance(v, bool) and isinstance(v, (int, float))
                    and math.isfinite(v) and ok(v)):
                raise ValueError(f"ppo_kwargs[{name!r}] must be a number {bound}, got {name}={v!r}")
        if not isinstance(self.bc_warm_start, bool):
            raise ValueError(f"bc_warm_start must be True or False, got bc_warm_start={self.bc_warm_start!r}")
        if self.bc_warm_start and not (self.method == "echorl" and self.learner == "gigpo"):
            raise ValueError(f"bc_warm_start applies to method='echorl' with echorl_learner='gigpo' (the other methods "
                             f"name their warm start: bc+gigpo, bc+ppo, echoppo), got bc_warm_start=True with "
                             f"method={self.method!r}" + (f", echorl_learner={self.echorl_learner!r}"
                                                           if self.method == "echorl" else ""))
        for name in ("checkpoint_every", "eval_episodes", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {name}={v!r}")
        if self.eval_every and not self.eval_episodes:
            raise ValueError(f"eval_every needs eval_episodes > 0 (the held-out instances to play), got "
                             f"eval_every={self.eval_every}, eval_episodes=0")
        if self.gamma is not None and not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got gamma={self.gamma!r}")
        import echorl_envs

        kind = echorl_envs.entry(self.env_id).action_type
        if (self.method == "grpo") != (kind != "choice"):
            raise ValueError(f"method {self.method!r} does not fit env_id={self.env_id!r} ({kind} actions): use grpo "
                             "for free-text envs and bc/ppo/bc+ppo/echoppo/gigpo/bc+gigpo/echorl for choice envs")
        if self.replay is not None and self.method != "echorl":
            raise ValueError(f"replay applies to method='echorl' (hot/cold replay of LLM transitions), got "
                             f"replay={self.replay!r} with method={self.method!r}")
        if self.method == "grpo":
            from echorl_agent.llm_rl.config import check_no_plan_on_free_text

            check_no_plan_on_free_text(self.policy_kwargs.get("plan_tokens", 0), self.env_id)
            if self.eval_every:
                raise ValueError(f"eval_every applies to the choice-env methods (GRPO evaluates before and after), "
                                 f"got eval_every={self.eval_every} with method='grpo'")

    def _check_learner_kwargs(self, name: str, fields: tuple[str, ...], applies: bool, methods: str) -> None:
        """``gigpo_kwargs`` / ``ppo_kwargs``: a dict of known ``fields``, set only where its learner runs."""
        kwargs = getattr(self, name)
        if not isinstance(kwargs, dict):
            raise ValueError(f"{name} must be a dict, got {name}={kwargs!r}")
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            raise ValueError(f"{name} takes {fields}, got {name}={kwargs!r} (unknown: {unknown})")
        if kwargs and not applies:
            raise ValueError(f"{name} applies to {methods}, got {name}={kwargs!r} with method={self.method!r}"
                             + (f", echorl_learner={self.echorl_learner!r}" if self.method == "echorl" else ""))

    @property
    def learner(self) -> str:
        """What trains: "grpo", "gigpo" (GiGPOTrainer) or "ppo" (LLMPPO; ``bc`` too, with no PPO step) -- also the
        kind of checkpoint the run writes (:func:`~echorl_agent.llm_rl.checkpoint.kind_of`, the one rule)."""
        from echorl_agent.llm_rl.checkpoint import kind_of

        return kind_of(self.method, self.echorl_learner)

    def replay_kwargs(self) -> dict[str, Any] | None:
        """``echorl``'s :class:`~echorl_agent.replay.llm.LLMReplayBuffer` arguments (None: other methods, or
        ``replay={"off": True}``)."""
        if self.method != "echorl":
            return None
        replay = {"capacity": 4096, "replay_memory_mb": 1024.0} if self.replay is None else dict(self.replay)
        return None if replay.pop("off", False) else replay


def make_llm_env(env_id: str, history: int, max_episode_steps: int | None = None, seed: int | None = None,
                 env_kwargs: dict[str, Any] | None = None):
    """The wrapped env an LLM policy acts in (see :func:`echorl_agent.llm_rl.rollout.make_choice_env`)."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    return make_choice_env(env_id, history, max_episode_steps, env_kwargs)


class _Curve:
    """SB3 callback writing (env steps, rolling success over 20 episodes, return) at every finished episode."""

    def __init__(self, path: Path | None) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self
        self.path, self.rows, self.recent = path, [], deque(maxlen=20)
        self.heldout: list[dict] = []

        class CB(BaseCallback):
            def _on_step(self) -> bool:
                for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                    if done:
                        outer.recent.append(float(info.get("won", False)))
                        ret = float(info.get("episode", {}).get("r", np.nan))
                        outer.rows.append((self.num_timesteps, float(np.mean(outer.recent)), ret))
                        self.logger.record("rollout/success_rate_20", float(np.mean(outer.recent)))
                return True

        self.callback = CB()

    def write(self) -> None:
        if self.path is not None:
            write_curve(self.path, self.rows, self.heldout)


def train_llm(cfg: LLMTrainConfig, lm: Any = None, resume: bool = False):
    """Train as ``cfg`` says; returns the trained model (an :class:`LLMPPO`), a :class:`GiGPOTrainer` or a
    :class:`GRPOTrainer`.

    Args:
        cfg: what to run.
        lm: an already loaded :class:`~echorl_agent.llm_rl.lm.TrainableLM` to train (default: load ``cfg``'s model).
        resume: continue the run whose checkpoint is in ``<cfg.out>/checkpoint/``: ``cfg.train_steps`` counts from
            the start of that run (a finished run is returned as it is, with a warning), curve.csv and gigpo.csv
            keep their earlier rows, TensorBoard goes on at the checkpoint's env step. GiGPO/echorl resume exactly;
            PPO methods restart the episodes in progress (a warning says so).

    Raises:
        FileNotFoundError: ``resume`` and no checkpoint in ``cfg.out``.
        ValueError: ``resume`` with a corrupt or incomplete checkpoint, or with a config that differs from the
            checkpoint's in anything but ``train_steps``, ``checkpoint_every``, ``out``, ``progress``.
    """
    import torch

    from echorl_agent.llm_rl import checkpoint as ckpt

    out = Path(cfg.out) if cfg.out else None
    opened = None
    if resume:
        if out is None:
            raise ValueError("resume needs the output folder of the run to continue, got out=None")
        opened = ckpt.open_checkpoint(out, cfg)  # fails before any model is loaded
    elif out is not None and (out / ckpt.CHECKPOINT).is_dir():
        warnings.warn(f"{out / ckpt.CHECKPOINT} holds a checkpoint of an earlier run; this fresh run replaces it at its "
                      "first save (pass resume=True, or --resume, to continue that run instead)", stacklevel=2)
    finished = opened is not None and opened[1]["timesteps"] >= cfg.train_steps
    if out is not None and not finished:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    torch.manual_seed(cfg.seed)
    prog = RunProgress(cfg.progress and not finished)
    ev = None
    if cfg.eval_episodes and not finished:
        from echorl_agent.llm_rl.heldout import HeldOutEval

        ev = HeldOutEval(cfg, out, prog, resume=resume)
    try:
        if cfg.learner == "grpo":
            return _train_grpo(cfg, out, lm, opened, ev, prog)
        if cfg.learner == "gigpo":
            return _train_gigpo(cfg, out, lm, opened, ev, prog)
        return _train_ppo(cfg, out, lm, opened, ev, prog)
    finally:
        prog.close()


def _train_ppo(cfg: LLMTrainConfig, out: Path | None, lm: Any, opened: Any, ev: Any, prog: RunProgress):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from echorl_agent.llm_rl import checkpoint as ckpt
    from echorl_agent.llm_rl.algorithms.ppo import LLMPPO

    pk = dict(cfg.policy_kwargs)
    if cfg.method in ("echoppo", "echorl"):  # echorl with the PPO learner: echoppo + replay
        pk.setdefault("plan_tokens", 2)
        pk.setdefault("kl_coef", 0.01)
    if lm is not None:
        pk["lm"] = lm

    def env_fn(i: int):
        return lambda: Monitor(make_llm_env(cfg.env_id, cfg.history, cfg.max_episode_steps, env_kwargs=cfg.env_kwargs))

    vec = DummyVecEnv([env_fn(i) for i in range(cfg.n_envs)])
    vec.seed(cfg.seed)
    tb = str(out / "tb") if out is not None else None
    model = LLMPPO("LLMPolicy", vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                    learning_rate=cfg.learning_rate, ent_coef=cfg.ent_coef, seed=cfg.seed, verbose=0,
                    gamma=0.99 if cfg.gamma is None else cfg.gamma, tensorboard_log=tb, policy_kwargs=pk,
                    replay=cfg.replay_kwargs(), replay_ratio=cfg.replay_ratio, **cfg.ppo_kwargs)
    prog.attach(model.policy)
    curve = _Curve(out / "curve.csv" if out is not None else None)
    if opened is not None:
        ckpt.load_ppo(model, curve, opened)
        vec.seed(cfg.seed + model.num_timesteps)  # new episodes, not a replay of the run's first ones
    else:
        if ev is not None:
            ev.run(model, "before")
        if cfg.method in ("bc", "bc+ppo", "echoppo", "echorl"):
            _bc_warm_start(cfg, model.policy, out, prog)  # PPO's own schedule sets the learning rate again at every update
            if ev is not None and cfg.method != "bc":
                ev.run(model, "after_bc")
    todo = 0 if cfg.method == "bc" else cfg.train_steps - model.num_timesteps
    if opened is not None and todo <= 0:
        _finished(cfg, model.num_timesteps)
        vec.close()
        return model
    if todo > 0:
        rollout = cfg.n_steps * cfg.n_envs
        if cfg.train_steps % rollout:
            warnings.warn(f"train_steps={cfg.train_steps} is not a multiple of n_steps * n_envs = {rollout}: PPO "
                          f"collects whole rollouts, so {-(-cfg.train_steps // rollout) * rollout} env steps run",
                          stacklevel=2)
        callbacks = [curve.callback, _progress_callback(prog, curve, cfg, model.num_timesteps)]
        if ev is not None and cfg.eval_every:
            callbacks.append(_heldout_callback(ev, curve, cfg.eval_every))
        if out is not None and cfg.checkpoint_every:
            callbacks.append(ckpt.ppo_checkpoint_callback(cfg, curve, out, rollout))
        model.learn(todo, callback=callbacks, progress_bar=False, tb_log_name="llm",
                    reset_num_timesteps=opened is None)
        if not curve.rows:
            warnings.warn("no training episode finished: curve.csv has only its header (raise train_steps or "
                          "lower max_episode_steps)", stacklevel=2)
    curve.write()
    if out is not None:
        model.save(out / "model.zip")
        if model.policy.cfg.lora_rank > 0:
            model.policy.lm.save_adapter(out / "adapter")
        ckpt.save_ppo(model, curve, cfg, out)
    vec.close()
    if ev is not None:
        ev.run(model, "after", keep_rng=True)
        ev.write(model.num_timesteps)
    return model


def _progress_callback(prog: RunProgress, curve: _Curve, cfg: LLMTrainConfig, start: int) -> Any:
    """SB3 callback moving the run's RL bar: env steps as they happen, rollout / update phases, success (last 20
    episodes) and the last update's loss."""
    from stable_baselines3.common.callbacks import BaseCallback

    desc = f"{cfg.method} RL"

    class ProgressCallback(BaseCallback):
        def _on_training_start(self) -> None:
            prog.stage(desc, total=_ppo_budget(cfg), initial=start, unit="env step")

        def _on_rollout_start(self) -> None:
            loss = self.model.logger.name_to_value.get("train/loss")
            stats = {"success_rate": float(np.mean(curve.recent))} if curve.recent else {}
            if loss is not None and self.model.num_timesteps > start:
                prog.iteration_done(self.model.num_timesteps, _ppo_budget(cfg), {**stats, "loss": float(loss)})
            prog.set_phase("rollout")

        def _on_step(self) -> bool:
            if prog.enabled and prog.desc != desc:  # back from a held-out point
                prog.stage(desc, total=_ppo_budget(cfg), initial=self.model.num_timesteps, unit="env step")
            prog.update(self.training_env.num_envs)
            return True

        def _on_rollout_end(self) -> None:
            prog.set_phase("update")

    return ProgressCallback()


def _ppo_budget(cfg: LLMTrainConfig) -> int:
    """The env steps a PPO run takes: ``train_steps`` rounded up to whole rollouts of ``n_steps * n_envs``."""
    rollout = cfg.n_steps * cfg.n_envs
    return -(-cfg.train_steps // rollout) * rollout


def _heldout_callback(ev: Any, curve: _Curve, every: int) -> Any:
    """SB3 callback: a held-out point (:meth:`HeldOutEval.point`) after every ``every``-th update (the last update's
    is the final evaluation), in curve.csv and TensorBoard ``eval/*``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class HeldOutCallback(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:  # after the previous rollout's update
            done = getattr(self, "rollouts", 0)
            self.rollouts = done + 1
            if done and done % every == 0:
                policy = self.model.policy
                policy.recording = False  # held-out states stay out of the rollout's record store
                try:
                    row = ev.point(self.model, self.model.num_timesteps)
                finally:
                    policy.recording = True
                curve.heldout.append(row)
                for k, v in row.items():
                    if k != "timesteps":
                        self.logger.record(f"eval/{k.removeprefix('heldout_')}", v)

    return HeldOutCallback()


def load_trained(out: str | Path, lm: Any = None):
    """The trained model of the finished run in the output folder ``out``, from its final checkpoint: what
    :func:`train_llm` returned (an :class:`LLMPPO` for ``bc`` and the PPO methods, a :class:`GiGPOTrainer` or a
    :class:`GRPOTrainer`), with the run's own policy options (e.g. int8 prefill); nothing is trained or written.
    ``lm``: an already loaded :class:`~echorl_agent.llm_rl.lm.TrainableLM` to load the run's weights into (default:
    load the run's model).

    Raises:
        FileNotFoundError: no checkpoint in ``out``.
        ValueError: a corrupt or incomplete checkpoint, or a run that is not finished (its checkpoint is short of
            ``train_steps``; ``train_llm(cfg, resume=True)`` continues it).
    """
    from echorl_agent.llm_rl import checkpoint as ckpt

    _, manifest = ckpt.read_checkpoint(out)
    cfg = LLMTrainConfig(**{**manifest["config"], "out": str(out), "progress": False, "eval_episodes": 0,
                            "eval_every": 0})
    if manifest["timesteps"] < cfg.train_steps:
        raise ValueError(f"the run in {out} is not finished: its checkpoint is at {manifest['timesteps']} of "
                         f"train_steps={cfg.train_steps} env steps (train_llm(cfg, resume=True) continues it)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="nothing to resume")  # loading: nothing is meant to run on
        warnings.filterwarnings("ignore", message="PPO resumes from its last update")
        return train_llm(cfg, lm=lm, resume=True)


def _finished(cfg: LLMTrainConfig, timesteps: int, stacklevel: int = 3) -> None:
    """Warn (at ``train_llm``'s caller) that a resumed run has nothing left to do."""
    warnings.warn(f"nothing to resume: the checkpoint in {cfg.out} is at {timesteps} env steps, train_steps="
                  f"{cfg.train_steps} (raise train_steps to train on)", stacklevel=stacklevel)


def grpo_config(cfg: LLMTrainConfig):
    """The :class:`~echorl_agent.llm_rl.algorithms.grpo.GRPOConfig` method ``grpo`` of ``cfg`` trains with: ``grpo_kwargs``
    with the env, its options and the seed of ``cfg``, and ``policy_kwargs`` as the LM."""
    from echorl_agent.llm_rl.config import LLMPolicyConfig
    from echorl_agent.llm_rl.algorithms.grpo import GRPOConfig

    gk = dict(cfg.grpo_kwargs)
    gk.setdefault("env_id", cfg.env_id)
    gk.setdefault("seed", cfg.seed)
    if cfg.env_kwargs:
        gk.setdefault("env_kwargs", cfg.env_kwargs)
    gk["lm"] = LLMPolicyConfig.from_kwargs(**cfg.policy_kwargs)
    return GRPOConfig(**gk)


def _train_grpo(cfg: LLMTrainConfig, out: Path | None, lm: Any, opened: Any = None, ev: Any = None,
                prog: RunProgress | None = None):
    from echorl_agent.llm_rl import checkpoint as ckpt
    from echorl_agent.llm_rl.algorithms.grpo import GRPOTrainer

    trainer = GRPOTrainer(grpo_config(cfg), lm=lm)
    per_step = trainer.cfg.group_size * trainer.cfg.prompts_per_step
    steps = max(1, cfg.train_steps // per_step) if cfg.train_steps else 0
    if opened is not None:
        warm = ckpt.load_grpo(trainer, opened)
        if trainer.num_steps >= steps:
            _finished(cfg, trainer.num_steps * per_step, stacklevel=4)
            return trainer
    else:
        if ev is not None:
            ev.run(trainer, "before")
        warm = trainer.warm_start(list(range(20_000 + 1000 * cfg.seed, 20_000 + 1000 * cfg.seed + cfg.bc_episodes)),
                                  epochs=cfg.bc_epochs) if cfg.bc_episodes else []
        if ev is not None and warm and steps:
            ev.run(trainer, "after_bc")
    prog = prog or RunProgress(False)
    if trainer.num_steps < steps:
        prog.stage("grpo RL", total=steps * per_step, initial=trainer.num_steps * per_step, unit="completion")
    while trainer.num_steps < steps:
        chunk = steps - trainer.num_steps
        if out is not None and cfg.checkpoint_every:
            chunk = min(chunk, cfg.checkpoint_every - trainer.num_steps % cfg.checkpoint_every)
        for _ in range(chunk):  # one GRPO step at a time: the bar moves with every group of completions
            h = trainer.train(1, progress=cfg.progress and not prog.enabled)[-1]
            prog.iteration_done(trainer.num_steps * per_step, steps * per_step,
                                {"success_rate": h["reward_mean"], "loss": h["loss"]})
        if out is not None:
            ckpt.save_grpo(trainer, cfg, out, warm)
    if out is not None:
        with open(out / "curve.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["completions", "reward_mean", "frac_zero_std", "loss"])
            for h in trainer.history:
                w.writerow([int(h["step"]) * per_step, h["reward_mean"], h["frac_zero_std"], h["loss"]])
        (out / "warm_start.json").write_text(json.dumps({"losses": warm}))
        if trainer.lm.cfg.lora_rank > 0:
            trainer.lm.save_adapter(out / "adapter")
    if ev is not None:
        ev.run(trainer, "after", keep_rng=True)
        ev.write(trainer.num_steps * per_step)
    return trainer


def _bc_warm_start(cfg: LLMTrainConfig, policy: Any, out: Path | None, prog: RunProgress | None = None) -> None:
    from echorl_agent.llm_rl.algorithms.bc import behaviour_clone, collect_expert_states

    data = collect_expert_states(lambda: make_llm_env(cfg.env_id, cfg.history, cfg.max_episode_steps,
                                                      env_kwargs=cfg.env_kwargs),
                                 cfg.bc_episodes, seed=10_000 + cfg.seed)
    for g in policy.optimizer.param_groups:
        g["lr"] = cfg.bc_learning_rate or cfg.learning_rate
    live = prog is not None and prog.enabled
    if live:
        prog.stage(f"BC ({data.episodes} expert episodes, {len(data.actions)} states x {cfg.bc_epochs} epochs)",
                   total=len(data.actions) * cfg.bc_epochs, unit="state", counting="learner_rows")
        prog.attach(policy)
    losses = behaviour_clone(policy, data, epochs=cfg.bc_epochs, batch_size=cfg.bc_batch_size or cfg.batch_size,
                             seed=cfg.seed, progress=cfg.progress and not live,
                             on_epoch=(lambda e, loss: prog.update(0, epoch=e + 1, loss=loss)) if live else None)
    for g in policy.optimizer.param_groups:
        g["lr"] = cfg.learning_rate
    if out is not None:
        (out / "bc.json").write_text(json.dumps({"losses": losses, "transitions": len(data.actions),
                                                 "episodes": data.episodes, "expert_wins": data.successes}))


def gigpo_config(cfg: LLMTrainConfig):
    """The :class:`~echorl_agent.llm_rl.algorithms.gigpo.GiGPOConfig` a GiGPO method (``gigpo``, ``bc+gigpo``, ``echorl``) of
    ``cfg`` trains with, and the policy keyword arguments (``echorl`` adds 2 plan tokens and replay by default)."""
    from echorl_agent.llm_rl.algorithms.gigpo import GiGPOConfig

    pk = dict(cfg.policy_kwargs)
    replay, kl_coef = None, 0.0
    if cfg.method == "echorl":
        pk.setdefault("plan_tokens", 2)
        kl_coef = float(pk.pop("kl_coef", 0.01))
        replay = cfg.replay_kwargs()
    gcfg = GiGPOConfig(env_id=cfg.env_id, env_kwargs=cfg.env_kwargs, group_size=cfg.group_size,
                       groups=max(1, cfg.n_envs // cfg.group_size), step_advantage_weight=cfg.step_advantage_weight,
                       gamma=0.95 if cfg.gamma is None else cfg.gamma, history=cfg.history,
                       max_episode_steps=cfg.max_episode_steps, learning_rate=cfg.learning_rate,
                       seed=cfg.seed, kl_coef=kl_coef, replay=replay, replay_ratio=cfg.replay_ratio, lm=pk,
                       **{"epochs": 1, "ent_coef": 0.0, **cfg.gigpo_kwargs})
    return gcfg, pk


def _train_gigpo(cfg: LLMTrainConfig, out: Path | None, lm: Any, opened: Any = None, ev: Any = None,
                 prog: RunProgress | None = None):
    from echorl_agent.llm_rl import checkpoint as ckpt
    from echorl_agent.llm_rl.algorithms.gigpo import GiGPOTrainer

    gcfg, pk = gigpo_config(cfg)
    policy = None
    if lm is not None:
        from stable_baselines3.common.utils import ConstantSchedule

        from echorl_agent.llm_rl.policy import LLMPolicy

        env = make_llm_env(cfg.env_id, cfg.history, cfg.max_episode_steps, env_kwargs=cfg.env_kwargs)
        policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(cfg.learning_rate), lm=lm, **pk)
    trainer = GiGPOTrainer(gcfg, policy)
    prog = prog or RunProgress(False)
    prog.attach(trainer.policy)
    if opened is not None:
        ckpt.load_gigpo(trainer, opened)  # the weights after the BC warm start are in it
        if trainer.num_timesteps >= cfg.train_steps:
            _finished(cfg, trainer.num_timesteps, stacklevel=4)
            return trainer
    elif cfg.method == "bc+gigpo" or cfg.bc_warm_start:
        if ev is not None:
            ev.run(trainer, "before")
        _bc_warm_start(cfg, trainer.policy, out, prog)
        if ev is not None:  # the start of RL, evaluated as benchmarks/gigpo_signal.py does (its generator draws)
            ev.run(trainer, "after_bc", keep_rng=True)
    elif ev is not None:
        ev.run(trainer, "before", keep_rng=True)
    writer = None
    if out is not None:
        try:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run hides what the interrupted one logged after its checkpoint
            writer = SummaryWriter(str(out / "tb"), purge_step=trainer.num_timesteps + 1 if opened else None)
        except ImportError:  # pragma: no cover - tensorboard is an SB3 extra
            writer = None

    def log_iteration(s: dict[str, float]) -> None:
        if writer is None:
            return
        step = int(s["timesteps"])
        for key, tag in (("success_rate", "rollout/success_rate"), ("return_mean", "rollout/ep_rew_mean"),
                         ("episode_length", "rollout/ep_len_mean"), ("loss", "train/loss"),
                         ("frac_zero_std", "train/frac_zero_std"), ("anchor_steps_grouped", "train/anchor_steps_grouped"),
                         ("is_weight_mean", "train/is_weight_mean"), ("clip_fraction", "train/clip_fraction"),
                         ("entropy", "train/entropy"), ("cache_hit_rate", "rollout/cache_hit_rate"),
                         ("env_steps_per_s", "time/env_steps_per_s"), ("rollout_s", "time/rollout_s"),
                         ("learner_s", "time/learner_s")):
            writer.add_scalar(tag, s[key], step)

    heldout: list[dict] = []

    def rl_stage() -> None:
        prog.stage(f"{cfg.method} RL", total=cfg.train_steps, initial=trainer.num_timesteps, unit="env step",
                   counting="env_steps")

    def after_iteration(s: dict[str, float]) -> None:
        log_iteration(s)
        prog.iteration_done(trainer.num_timesteps, cfg.train_steps, s)
        if ev is not None and cfg.eval_every and trainer.num_iterations % cfg.eval_every == 0:
            row = ev.point(trainer, trainer.num_timesteps)
            heldout.append(row)
            for k, v in row.items():
                if k != "timesteps" and writer is not None:
                    writer.add_scalar(f"eval/{k.removeprefix('heldout_')}", v, trainer.num_timesteps)
            if trainer.num_timesteps < cfg.train_steps:
                rl_stage()
        every = cfg.checkpoint_every
        if out is not None and every and trainer.num_iterations % every == 0 and trainer.num_timesteps < cfg.train_steps:
            if writer is not None:
                writer.flush()
            _write_gigpo_rows(trainer, out, heldout)
            ckpt.save_gigpo(trainer, cfg, out)

    if cfg.train_steps > trainer.num_timesteps:
        rl_stage()
        trainer.train(cfg.train_steps, progress=cfg.progress and not prog.enabled, callback=after_iteration)
    if writer is not None:
        writer.close()
    if out is not None:
        _write_gigpo_rows(trainer, out, heldout)
        if trainer.policy.cfg.lora_rank > 0:
            trainer.policy.lm.save_adapter(out / "adapter")
        ckpt.save_gigpo(trainer, cfg, out)
    if ev is not None:
        ev.run(trainer, "after", keep_rng=True)
        ev.write(trainer.num_timesteps)
    return trainer


def _write_gigpo_rows(trainer: Any, out: Path, heldout: Any = ()) -> None:
    """curve.csv and gigpo.csv with every row since the run's start (a resumed run's trainer holds the earlier ones)."""
    write_curve(out / "curve.csv", rolling_rows(trainer.episodes_done), heldout)
    if trainer.history:
        with open(out / "gigpo.csv", "w", newline="") as f:
            # every key of every row, first-seen order (a run resumed from an older checkpoint gains new columns)
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for h in trainer.history for k in h)))
            w.writeheader()
            w.writerows(trainer.history)
