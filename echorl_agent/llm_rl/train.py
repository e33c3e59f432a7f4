"""One entry point that trains an LLM policy on an echorl env and writes curves, checkpoints and TensorBoard logs.

The methods come from the registry (:data:`echorl_agent.llm_rl.algorithms.registry.METHODS`): on choice envs
``bc`` (behaviour cloning on the expert), ``ppo`` (LLM-PPO from the pretrained LM), ``bc+ppo`` (BC warm start, then
PPO), ``echoppo`` (BC warm start, then PPO with the latent plan and its KL term; ``plan_tokens`` > 0), ``gigpo``
(critic-free group RL from the pretrained LM), ``bc+gigpo`` (BC warm start, then GiGPO), ``echorl`` (EchoRL on the
LM: GiGPO + latent plan tokens with their KL term + hot/cold prioritized replay of LLM transitions; ablate with
``plan_tokens=0`` or ``replay={"off": True}``; ``echorl_learner="ppo"``: echoppo plus the same replay); on free-text
envs ``grpo`` (oracle-answer warm start, then GRPO). Each method's trainer follows one protocol
(:class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer`); :func:`train_llm` builds it, resumes or warm-starts
it, trains it and returns its model. Used by ``echorl train-llm`` and the ``llm-*`` bench agents.

Every choice env trains with its own step limit unless ``max_episode_steps`` caps it: the final observation of a
truncated episode lists no admissible action and gets a value-only record (SB3 bootstraps its value).

Budgets: ``train_steps`` is rounded UP to whole iterations (a GiGPO run stops at the end of the first iteration at or
past it; PPO collects whole rollouts of ``n_steps * n_envs``); GRPO's completions are rounded down to whole steps.
With ``eval_episodes`` > 0 the run plays held-out instances before and after training (and after a BC warm start)
in both modes (:mod:`echorl_agent.llm_rl.heldout`); ``progress`` shows a live bar per stage
(:mod:`echorl_agent.llm_rl.progress`).

Output folder: ``curve.csv`` (:mod:`echorl_agent.llm_rl.curve`: env steps, success rate and mean return over the last
20 training episodes, the episode's own return, held-out points), ``eval.json`` and ``eval_episodes.csv`` (held-out
evaluation; ``echorl_agent.eval.verdict.finish`` adds the paired differences), ``config.json``, ``adapter/`` (peft
format), ``tb/`` (TensorBoard), ``checkpoint/`` (every ``checkpoint_every`` iterations and at the end;
``train_llm(cfg, resume=True)`` continues from it, see :mod:`echorl_agent.llm_rl.checkpoint`), and each method's own
files (``model.zip``, ``bc.json``, ``gigpo.csv``, ``warm_start.json``; see ``algorithms/<method>/``).
``load_trained(out)`` gives a finished run's model back (to act, or to evaluate again on other env options).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echorl_agent.llm_rl.progress import RunProgress

__all__ = ["LLMTrainConfig", "load_trained", "train_llm", "make_llm_env"]


@dataclass
class LLMTrainConfig:
    """What ``echorl train-llm`` runs."""

    env_id: str = "EchoRL/MiniGrid-Empty-5x5-v0"
    method: str = "bc+ppo"
    """A registered method (:data:`~echorl_agent.llm_rl.algorithms.registry.METHODS`)."""
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
    bc_dagger_rounds: int = 0
    """DAgger rounds after the BC warm start: the cloned policy plays ``bc_dagger_episodes`` episodes (sampled),
    the env's expert labels every state it reached, and BC runs again (``bc_epochs``) on all states so far; 0: BC
    alone. Their env steps are imitation, not RL: ``train_steps`` does not count them (``bc.json`` does)."""
    bc_dagger_episodes: int = 32
    """Episodes the policy plays per DAgger round (seeds disjoint from the held-out ones)."""
    bc_noise: float = 0.0
    """DART noise of the BC warm start's expert episodes: the probability that a step executes a uniformly drawn other
    admissible action instead of the expert's; every state keeps the expert's label, so the demonstrations cover the
    states just off the expert's path. 0: the expert's own episodes."""
    bc_lr_scheduler: str = "constant"
    """The BC learning rate over each clone's optimizer steps: ``constant``, ``linear`` (to 0 at the last step) or
    ``cosine`` (HF's ``lr_scheduler_type`` names; no warm-up). DAgger rounds each run their own schedule."""
    bc_noise_actions: list[str] | None = None
    """The actions ``bc_noise`` may execute (None: any other admissible action). BabyAI's ``["go forward"]`` adds the
    states after a blocked ``go forward`` to the demonstrations without turn noise. A text no expert state had
    admissible is refused when the episodes are collected."""
    init_from: str | None = None
    """The output folder of an earlier ``train-llm`` run whose LoRA adapter (``<init_from>/adapter/``) starts this
    run, in place of the BC warm start (a run with one records the loaded start as its ``after_bc`` point, without
    cloning) or of the pretrained LM (``before``): BC once, then RL variants from it. Same model, ``lora_rank`` and
    ``train_layers``; the optimizer starts afresh. None: start as the method says."""
    seed: int = 0
    history: int = 0
    """History window k of the prompts."""
    max_episode_steps: int | None = None
    """Per-episode step cap for training (None: the env's)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` arguments of the env."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """``gym.make`` arguments of the held-out env, merged key by key over ``env_kwargs`` (e.g. ``{"split":
    "valid_unseen"}``: train on one split, evaluate on another); empty: the held-out episodes play the training
    env with new seeds. Choice envs only (GRPO judges its own held-out tasks)."""
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
    """``echorl``: the learner under the plan and the replay, one of
    :data:`~echorl_agent.llm_rl.algorithms.echorl.ECHORL_LEARNERS`: "gigpo" (critic-free
    groups of K episodes) or "ppo" (echoppo: BC warm start, PPO with the value head, plan tokens and KL)."""
    bc_warm_start: bool = False
    """``echorl`` with the GiGPO learner: behaviour-clone ``bc_episodes`` expert episodes first (as ``bc+gigpo``
    does for ``gigpo``); False starts from the pretrained LM. The PPO learner always warm-starts (as ``echoppo``)."""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.config.LLMPolicyConfig` / PlanningConfig fields."""
    grpo_kwargs: dict[str, Any] = field(default_factory=dict)
    """:class:`~echorl_agent.llm_rl.algorithms.grpo.config.GRPOConfig` fields (``grpo``)."""
    gigpo_kwargs: dict[str, Any] = field(default_factory=dict)
    """Learner fields of :class:`~echorl_agent.llm_rl.algorithms.gigpo.config.GiGPOConfig` (``registry.GIGPO.options``: ``epochs``,
    ``minibatch_size``, ``clip_range``, ``ent_coef``, ``normalize``, ``max_grad_norm``, ``micro_batch``, ``ref_kl_coef``,
    ``target_kl``) for the
    GiGPO methods (``gigpo``, ``bc+gigpo``, ``echorl``); the rest of GiGPOConfig comes from the fields above."""
    ppo_kwargs: dict[str, Any] = field(default_factory=dict)
    """PPO options (``registry.PPO.options``: ``clip_range``, ``target_kl``, ``gae_lambda``, ``vf_coef``,
    ``max_grad_norm``, SB3's meanings; unset: SB3's defaults 0.2, None, 0.95, 0.5, 0.5) for the PPO methods (``ppo``,
    ``bc+ppo``, ``echoppo``, ``echorl`` with the PPO learner). ``target_kl`` ends an update's epochs at the first
    minibatch whose approximate KL to the rollout policy exceeds ``1.5 * target_kl``."""
    method_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of a registered method whose learner keeps its options here (``Learner.options_field``; every
    method added after the built-in ones): fields of its ``Learner.config`` dataclass."""
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
    eval_before: bool = True
    """Play the held-out instances before training too (the pretrained LM). False (``--no-eval-before``) skips that
    point in a run with a BC warm start, whose RL start is the "after BC" point (what a study of RL over imitation
    reads); the training RNG streams are the same either way. A run without a warm start needs it (its start)."""
    env_urls: list[str] = field(default_factory=list)
    """``echorl serve-env`` servers the training episodes run on (env ``i`` on ``env_urls[i % len]``,
    :mod:`~echorl_agent.llm_rl.env_servers`); empty: in-process. The BC warm start's expert episodes stay
    in-process (the expert reads the env's state)."""
    env_step_timeout_s: float = 120.0
    """With ``env_urls``: a reset or step unanswered this long marks its server hung; its envs move to another."""
    backend: str = "local"
    """Where the training episodes play (:mod:`~echorl_agent.llm_rl.backend`): "local" (this process) or "ray"
    (``rollout_workers`` Ray actors, each with its own engine replica; GiGPO learners;
    :mod:`~echorl_agent.llm_rl.ray_workers`)."""
    rollout_workers: int = 1
    """With ``backend="ray"``: rollout workers; each plays a share of every iteration's groups."""
    max_policy_lag: int = 0
    """With ``backend="ray"``: iterations the workers play ahead of the learner (0: on-policy); their episodes are
    played by weights up to this many versions old, corrected by the learner's truncated importance weights."""
    out: str | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        from echorl_agent.llm_rl.algorithms.registry import get_method

        spec = get_method(self.method)  # ValueError naming the method, with a close match
        for name in ("train_steps", "bc_episodes", "n_envs", "n_steps", "batch_size", "n_epochs", "group_size"):
            v = getattr(self, name)
            zero_ok = name == "train_steps" or name == "bc_episodes" and spec.warm_start == "oracle"  # grpo: none
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1):
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        learner = spec.learner_for(self)  # ValueError naming echorl_learner
        if learner.name == "gigpo":
            if self.group_size < 2:
                raise ValueError(f"group_size must be >= 2 (GiGPO compares the episodes of a group), "
                                 f"got group_size={self.group_size}")
            if self.n_envs > 1 and self.n_envs % self.group_size:
                raise ValueError(f"n_envs must be a multiple of group_size (groups of K envs), got n_envs={self.n_envs}, "
                                 f"group_size={self.group_size}")
        elif learner.name == "ppo" and spec.rl and self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 for PPO (advantages are normalised per minibatch), "
                             f"got batch_size={self.batch_size}")
        elif learner.name == "ppo" and spec.rl and (self.n_steps * self.n_envs) % self.batch_size:
            raise ValueError(f"batch_size must divide n_steps * n_envs, got batch_size={self.batch_size}, "
                             f"n_steps={self.n_steps}, n_envs={self.n_envs}")
        self._check_options(spec, learner)
        for name, lo, hi in (("bc_dagger_rounds", 0, 9), ("bc_dagger_episodes", 1, 1000)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in {lo}..{hi}, got {name}={v!r}")
        v = self.bc_noise
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"bc_noise must be a number in [0, 1), got bc_noise={v!r}")
        from echorl_agent.llm_rl.algorithms.bc.clone import LR_SCHEDULERS

        if self.bc_lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"bc_lr_scheduler must be one of {LR_SCHEDULERS}, got "
                             f"bc_lr_scheduler={self.bc_lr_scheduler!r}")
        v = self.bc_noise_actions
        if v is not None:
            if (isinstance(v, str) or not isinstance(v, (list, tuple)) or not v
                    or any(not isinstance(t, str) or not t.strip() for t in v)):
                raise ValueError(f"bc_noise_actions must be a non-empty list of action texts, got "
                                 f"bc_noise_actions={v!r}")
            if not self.bc_noise:
                raise ValueError(f"bc_noise_actions names the actions bc_noise executes: it needs bc_noise > 0, got "
                                 f"bc_noise_actions={v!r} with bc_noise={self.bc_noise!r}")
        for name in ("bc_noise", "bc_dagger_rounds"):
            v = getattr(self, name)
            if v and (spec.warm_start == "oracle" or not spec.warm_starts(self)):
                raise ValueError(f"{name} applies to a run with a BC warm start (bc, bc+gigpo, bc+ppo, echoppo, "
                                 f"echorl with bc_warm_start), got {name}={v!r} with method={self.method!r}")
        if not isinstance(self.bc_warm_start, bool):
            raise ValueError(f"bc_warm_start must be True or False, got bc_warm_start={self.bc_warm_start!r}")
        if self.init_from is not None:
            if not isinstance(self.init_from, str) or not self.init_from:
                raise ValueError(f"init_from must be the output folder of a train-llm run, got "
                                 f"init_from={self.init_from!r}")
            if learner.name == "grpo" or self.bc_noise or self.bc_dagger_rounds:
                raise ValueError(f"init_from replaces the start of a choice-env run (no BC, noise or DAgger of its "
                                 f"own), got init_from={self.init_from!r} with method={self.method!r}, "
                                 f"bc_noise={self.bc_noise!r}, bc_dagger_rounds={self.bc_dagger_rounds!r}")
        if self.bc_warm_start and not (spec.warm_start == "bc_warm_start" and learner.name == "gigpo"):
            raise ValueError(f"bc_warm_start applies to method='echorl' with echorl_learner='gigpo' (the other methods "
                             f"name their warm start: bc+gigpo, bc+ppo, echoppo), got bc_warm_start=True with "
                             f"method={self.method!r}" + (f", echorl_learner={self.echorl_learner!r}"
                                                           if spec.learner_field else ""))
        for name in ("checkpoint_every", "eval_episodes", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {name}={v!r}")
        if not isinstance(self.eval_before, bool):
            raise ValueError(f"eval_before must be True or False, got eval_before={self.eval_before!r}")
        if not self.eval_before and not (spec.rl and spec.warm_starts(self)):
            raise ValueError(f"eval_before=False skips the pretrained LM's held-out point of a run whose RL starts "
                             f"after a BC warm start (bc+gigpo, bc+ppo, echoppo, echorl with bc_warm_start); "
                             f"method={self.method!r} starts from that point: keep eval_before=True")
        if not isinstance(self.eval_env_kwargs, dict):
            raise ValueError(f"eval_env_kwargs must be a dict of gym.make arguments, got "
                             f"eval_env_kwargs={self.eval_env_kwargs!r}")
        if self.eval_env_kwargs and spec.action_type == "text":
            raise ValueError(f"eval_env_kwargs applies to the choice-env methods (the held-out env is built anew); "
                             f"free-text methods judge their own held-out tasks, got eval_env_kwargs="
                             f"{self.eval_env_kwargs!r} with method={self.method!r}")
        if self.eval_every and not self.eval_episodes:
            raise ValueError(f"eval_every needs eval_episodes > 0 (the held-out instances to play), got "
                             f"eval_every={self.eval_every}, eval_episodes=0")
        if self.gamma is not None and not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got gamma={self.gamma!r}")
        import echorl_envs

        kind = echorl_envs.entry(self.env_id).action_type
        if (spec.action_type == "text") != (kind != "choice"):
            from echorl_agent.llm_rl.algorithms.registry import METHODS

            fit = [m.name for m in METHODS.values() if (m.action_type == "text") == (kind != "choice")]
            raise ValueError(f"method {self.method!r} does not fit env_id={self.env_id!r} ({kind} actions): use "
                             f"{'/'.join(fit)} for {'choice' if kind == 'choice' else 'free-text'} envs")
        if self.replay is not None and not spec.replay:
            raise ValueError(f"replay applies to method='echorl' (hot/cold replay of LLM transitions), got "
                             f"replay={self.replay!r} with method={self.method!r}")
        if self.env_urls:
            from echorl_agent.llm_rl.env_servers import check_env_urls

            check_env_urls(self.env_urls)
            if spec.action_type == "text":
                raise ValueError("env_urls (--env-url) applies to the choice-env methods (GiGPO groups, PPO envs); "
                                 f"free-text methods judge completions in-process, got method={self.method!r}")
            if self.env_kwargs:
                raise ValueError(f"env_kwargs cannot travel to an env server (the server builds its envs); start "
                                 f"`echorl serve-env` with them instead, got env_kwargs={self.env_kwargs!r} with "
                                 f"env_urls={self.env_urls!r}")
        from echorl_agent.llm_rl.backend import check_backend

        check_backend(self.backend, self.rollout_workers, learner.name, max(1, self.n_envs // self.group_size),
                      self.policy_kwargs, self.max_policy_lag)
        if not (isinstance(self.env_step_timeout_s, (int, float)) and self.env_step_timeout_s > 0):
            raise ValueError(f"env_step_timeout_s must be a number > 0, got env_step_timeout_s={self.env_step_timeout_s!r}")
        if spec.replay:
            from echorl_agent.llm_rl.algorithms.echorl.config import EchoRLConfig

            EchoRLConfig.from_run(self)
        if spec.action_type == "text":
            from echorl_agent.llm_rl.config import check_no_plan_on_free_text

            check_no_plan_on_free_text(self.policy_kwargs.get("plan_tokens", 0), self.env_id)
            if self.eval_every:
                raise ValueError(f"eval_every applies to the choice-env methods (GRPO evaluates before and after), "
                                 f"got eval_every={self.eval_every} with method={self.method!r}")

    def _check_options(self, spec: Any, learner: Any) -> None:
        """Each learner's options dict (``gigpo_kwargs``, ``ppo_kwargs``, ``grpo_kwargs``, ``method_kwargs``): a
        dict of the learner's option names, set only where that learner runs, with values its config accepts."""
        from echorl_agent.llm_rl.algorithms.registry import METHODS

        holders: dict[str, list[Any]] = {}
        for m in METHODS.values():
            for lr in m.learners():
                holders.setdefault(lr.options_field, [])
                if m.rl and m.name not in [x.name for x in holders[lr.options_field]]:
                    holders[lr.options_field].append(m)
        for name in dict.fromkeys([*holders, "method_kwargs"]):
            kwargs = getattr(self, name)
            if not isinstance(kwargs, dict):
                raise ValueError(f"{name} must be a dict, got {name}={kwargs!r}")
            applies = spec.rl and learner.options_field == name
            if applies:
                fields = learner.option_names()
                unknown = sorted(set(kwargs) - set(fields))
                if unknown:
                    raise ValueError(f"{name} takes {fields}, got {name}={kwargs!r} (unknown: {unknown})")
                learner.check_options(kwargs)
            elif kwargs:
                users = holders.get(name, [])
                learners = sorted({lr.title or lr.name for m in users for lr in m.learners()
                                   if lr.options_field == name})
                raise ValueError(f"{name} applies to the {'/'.join(learners) or 'no'} methods "
                                 f"({', '.join(m.name for m in users) or 'none registered'}), got {name}={kwargs!r} "
                                 f"with method={self.method!r}"
                                 + (f", echorl_learner={self.echorl_learner!r}" if spec.learner_field else ""))

    @property
    def learner(self) -> str:
        """The learner that trains (its registry name: "ppo" for ``bc`` too, "gigpo", "grpo", a plugin's) -- also
        the kind of checkpoint the run writes and resumes."""
        from echorl_agent.llm_rl.algorithms.registry import get_method

        return get_method(self.method).learner_for(self).name

    def replay_kwargs(self) -> dict[str, Any] | None:
        """``echorl``'s :class:`~echorl_agent.replay.llm.LLMReplayBuffer` arguments (None: other methods, or
        ``replay={"off": True}``)."""
        from echorl_agent.llm_rl.algorithms.echorl.config import EchoRLConfig
        from echorl_agent.llm_rl.algorithms.registry import get_method

        if not get_method(self.method).replay:
            return None
        return EchoRLConfig.from_run(self).replay_kwargs()


def make_llm_env(env_id: str, history: int, max_episode_steps: int | None = None, seed: int | None = None,
                 env_kwargs: dict[str, Any] | None = None):
    """The wrapped env an LLM policy acts in (see :func:`echorl_agent.llm_rl.rollout.make_choice_env`)."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    return make_choice_env(env_id, history, max_episode_steps, env_kwargs)


def train_llm(cfg: LLMTrainConfig, lm: Any = None, resume: bool = False):
    """Train as ``cfg`` says with the method's trainer (see the module docstring); returns its model: an
    :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` (``bc`` and the PPO methods), a
    :class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer`, a
    :class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer`, or a registered method's.

    Args:
        cfg: what to run.
        lm: an already loaded :class:`~echorl_agent.llm_rl.lm.TrainableLM` to train (default: load ``cfg``'s model).
        resume: continue the run whose checkpoint is in ``<cfg.out>/checkpoint/``: ``cfg.train_steps`` counts from
            the start of that run (a finished run is returned as it is, with a warning), curve.csv and gigpo.csv
            keep their earlier rows, TensorBoard goes on at the checkpoint's env step. GiGPO/echorl resume exactly;
            PPO methods restart the episodes in progress (a warning says so). A run cut during its BC warm start
            (no ``checkpoint/`` yet) goes on from ``<cfg.out>/bc_stage/`` at the epoch it reached, exactly
            (:mod:`~echorl_agent.llm_rl.algorithms.bc.stage`).

    Raises:
        FileNotFoundError: ``resume`` and no checkpoint (nor BC stage) in ``cfg.out``.
        ValueError: ``resume`` with a corrupt or incomplete checkpoint, or with a config that differs from the
            checkpoint's in anything but ``train_steps``, ``checkpoint_every``, ``out``, ``progress``.
    """
    import torch

    from echorl_agent.llm_rl import checkpoint as ckpt
    from echorl_agent.llm_rl.algorithms.base import warn_finished
    from echorl_agent.llm_rl.algorithms.bc.stage import has_stage, open_stage
    from echorl_agent.llm_rl.algorithms.registry import get_method

    out = Path(cfg.out) if cfg.out else None
    opened = None
    in_warm_start = False  # resuming a run cut during its BC warm start (<out>/bc_stage/, no checkpoint/ yet)
    if resume:
        if out is None:
            raise ValueError("resume needs the output folder of the run to continue, got out=None")
        in_warm_start = not ckpt.has_checkpoint(out) and has_stage(out)
        if in_warm_start:
            open_stage(out, cfg)  # fails before any model is loaded
        else:
            opened = ckpt.open_checkpoint(out, cfg)  # fails before any model is loaded
    elif out is not None and (out / ckpt.CHECKPOINT).is_dir():
        warnings.warn(f"{out / ckpt.CHECKPOINT} holds a checkpoint of an earlier run; this fresh run replaces it at its "
                      "first save (pass resume=True, or --resume, to continue that run instead)", stacklevel=2)
    finished = opened is not None and opened[1]["timesteps"] >= cfg.train_steps
    if out is not None and not finished:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    servers = None
    if cfg.env_urls and not finished:
        from echorl_agent.llm_rl.env_servers import EnvServerPool

        servers = EnvServerPool(cfg.env_urls, cfg.env_id, cfg.env_step_timeout_s)
        servers.check()  # an unreachable or wrong server fails here, before any model is loaded
    torch.manual_seed(cfg.seed)
    prog = RunProgress(cfg.progress and not finished)
    heldout = None
    if cfg.eval_episodes and not finished:
        from echorl_agent.llm_rl.heldout import HeldOutEval

        heldout = HeldOutEval(cfg, out, prog, resume=resume)
    method = get_method(cfg.method)
    trainer = None
    try:
        extra = {"servers": servers} if servers is not None else {}  # --env-url: the trainers that take servers
        trainer = method.learner_for(cfg).trainer_class().build(cfg, method, lm=lm, progress=prog, heldout=heldout,
                                                                **extra)
        if opened is not None:
            trainer.load(opened)
            if trainer.finished():
                warn_finished(cfg, trainer.num_timesteps)
                return trainer.model
        else:
            if cfg.init_from is not None:
                ckpt.load_run_adapter(trainer.model.policy, cfg.init_from)
            trainer.start(method.warm_starts(cfg), resume=in_warm_start)
        trainer.train(cfg.train_steps)
    finally:
        if trainer is not None:
            trainer.close()
        prog.close()
        if servers is not None and out is not None:
            servers.write(out)
    return trainer.model


def load_trained(out: str | Path, lm: Any = None):
    """The trained model of the finished run in the output folder ``out``, from its final checkpoint: what
    :func:`train_llm` returned (an :class:`LLMPPO` for ``bc`` and the PPO methods, a :class:`GiGPOTrainer`, a
    :class:`GRPOTrainer` or a registered method's), with the run's own policy options (e.g. int8 prefill); nothing
    is trained or written. ``lm``: an already loaded :class:`~echorl_agent.llm_rl.lm.TrainableLM` to load the run's
    weights into (default: load the run's model).

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
