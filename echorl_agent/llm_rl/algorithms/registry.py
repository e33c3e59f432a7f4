"""The one registry of LLM-RL methods: ``echorl train-llm --method``, its per-method options, the checkpoint kinds
and the ``llm-*`` bench agents are all generated from :data:`METHODS`.

A :class:`Learner` is an algorithm folder's trainer (:class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer`)
and its options dataclass; a :class:`Method` is what a run names: a learner, optionally behind a warm-start stage
(``bc+ppo`` = BC, then PPO) and with EchoRL's parts (latent plan, replay). Adding a method is one folder (its Config
and trainer) plus one :func:`register` call::

    register(Method("reinforce", Learner("reinforce", "my_pkg.reinforce:ReinforceTrainer",
                                         "my_pkg.reinforce:ReinforceConfig"),
                    "REINFORCE on the LM", agent="llm-reinforce"))

(see docs/plug-llm-rl.md). The learner's ``name`` is the kind of checkpoint its runs write and resume.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GIGPO", "GRPO", "Learner", "METHODS", "Method", "PPO", "field_docs", "get_method", "kind_of",
           "learners", "method_names", "option_table", "register"]


def resolve(ref: str | Any) -> Any:
    """``"module:attr"`` -> the attribute (imported on first use); anything else is returned as it is."""
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


@dataclass(frozen=True)
class Learner:
    """An RL learner: the trainer that runs it and the options a run may set."""

    name: str
    """Short name; also the kind of checkpoint its runs write (a run resumes only its own learner's)."""
    trainer: str | type
    """Its :class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer` class (or ``"module:Class"``, imported lazily)."""
    config: str | type | None = None
    """Its options dataclass (CleanRL style: one documented field per option; ``"module:Class"``)."""
    options: tuple[str, ...] | None = None
    """The ``config`` fields a run sets through ``options_field`` (None: every field but the run's own)."""
    options_field: str = "method_kwargs"
    """The :class:`~echorl_agent.llm_rl.train.LLMTrainConfig` dict holding the options (``gigpo_kwargs``,
    ``ppo_kwargs``, ``grpo_kwargs`` for the built-in learners; ``method_kwargs`` for every other)."""
    action_type: str = "choice"
    """"choice" (ranks admissible actions) or "text" (free-text answers)."""
    bench_options: dict[str, Any] = field(default_factory=dict)
    """Run fields a bench agent training with this learner sets unless its agent options do (GiGPO: 8 envs)."""
    title: str = ""
    """How messages name it ("GiGPO"; default: ``name``)."""

    def config_class(self) -> type | None:
        return resolve(self.config)

    def trainer_class(self) -> type:
        return resolve(self.trainer)

    def option_names(self) -> tuple[str, ...]:
        """The option names a run may set (``options``, or every config field that is not the run's own)."""
        if self.options is not None:
            return self.options
        cls = self.config_class()
        if cls is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _RUN_OWNED)

    def check_options(self, kwargs: dict[str, Any]) -> None:
        """The config's own check of option values (``Config.check_options``), when it has one."""
        cls = self.config_class()
        check = getattr(cls, "check_options", None)
        if check is not None:
            check(kwargs)


#: Config fields that come from the run itself (never options): env, seed, the LM and its policy options.
_RUN_OWNED = frozenset({"env_id", "env_kwargs", "seed", "lm", "history", "max_episode_steps"})

_A = "echorl_agent.llm_rl.algorithms"
PPO = Learner("ppo", f"{_A}.ppo.trainer:PPORun", f"{_A}.ppo.config:PPOConfig",
              ("clip_range", "target_kl", "gae_lambda", "vf_coef", "max_grad_norm"), "ppo_kwargs", title="PPO")
"""LLM-PPO / EchoPPO (:class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO`, an SB3 model)."""
GIGPO = Learner("gigpo", f"{_A}.gigpo.run:GiGPORun", f"{_A}.gigpo.config:GiGPOConfig",
                ("epochs", "minibatch_size", "clip_range", "ent_coef", "normalize", "max_grad_norm", "micro_batch",
                 "ref_kl_coef", "target_kl", "sample_weighting", "center_advantages", "positive_advantages"),
                "gigpo_kwargs", bench_options={"n_envs": 8}, title="GiGPO")
"""GiGPO (:class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer`): critic-free groups of K episodes."""
GRPO = Learner("grpo", f"{_A}.grpo.run:GRPORun", f"{_A}.grpo.config:GRPOConfig", None, "grpo_kwargs", "text", title="GRPO")
"""GRPO on free-text envs (:class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer`)."""


@dataclass(frozen=True)
class Method:
    """What ``echorl train-llm --method`` names: a learner, an optional warm-start stage, EchoRL's parts."""

    name: str
    learner: Learner | dict[str, Learner]
    """The learner; a dict picks one by the run's ``learner_field`` (``echorl``: ``echorl_learner``)."""
    description: str
    warm_start: str | None = None
    """Stage before RL on a fresh run: "bc" (behaviour cloning on ``bc_episodes`` expert episodes), "oracle"
    (GRPO: the oracle answers), "bc_warm_start" (BC when the run's ``bc_warm_start`` is on); None: none."""
    rl: bool = True
    """False: the warm start is all (``bc``): no RL step runs and the learner's options do not apply."""
    plan: bool = False
    """EchoRL's latent plan: 2 plan tokens and lambda_KL 0.01 unless ``policy_kwargs`` sets them."""
    replay: bool = False
    """EchoRL's hot/cold replay of LLM transitions (the run's ``replay`` / ``replay_ratio``)."""
    learner_field: str | None = None
    """The run field that picks among ``learner``'s entries."""
    agent: str | None = None
    """Its ``echorl bench`` agent (None: none; reached through another agent's option)."""
    agent_description: str = ""
    bc_variant: str | None = None
    """The method the bench agent trains with its ``bc_warm_start=True`` option (``llm-ppo`` -> ``bc+ppo``)."""
    recipe: str | None = None
    """Its best shipped recipe (``echorl_agent/llm_rl/recipes/<name>.yaml``), whose learner settings are the
    method's ``echorl train-llm`` defaults when no recipe is named (:func:`~echorl_agent.llm_rl.recipes.resolve_config`)."""

    def learner_for(self, run: Any = None) -> Learner:
        """The learner a run of this method trains with."""
        if isinstance(self.learner, Learner):
            return self.learner
        choice = getattr(run, self.learner_field) if run is not None else next(iter(self.learner))
        if choice not in self.learner:
            raise ValueError(f"{self.learner_field} must be one of {tuple(self.learner)}, got "
                             f"{self.learner_field}={choice!r}")
        return self.learner[choice]

    def learners(self) -> tuple[Learner, ...]:
        return (self.learner,) if isinstance(self.learner, Learner) else tuple(self.learner.values())

    def warm_starts(self, run: Any) -> bool:
        """Whether a fresh run of this method runs its warm-start stage."""
        if self.warm_start == "bc_warm_start":
            return bool(run.bc_warm_start) or self.learner_for(run).name == "ppo"  # echorl's PPO learner: echoppo
        return self.warm_start is not None

    @property
    def action_type(self) -> str:
        return self.learners()[0].action_type


METHODS: dict[str, Method] = {}
"""Every registered method by name, in registration order (the CLI lists them in this order)."""


def register(method: Method, replace: bool = False) -> Method:
    """Add ``method`` to :data:`METHODS` (``train-llm --method``, its options, its checkpoint kind, its bench agent).

    Raises:
        ValueError: a name already registered (unless ``replace``), or a learner option that is a run field.
    """
    if method.name in METHODS and not replace:
        raise ValueError(f"method {method.name!r} is already registered (pass replace=True to replace it)")
    for learner in method.learners():
        if learner.action_type not in ("choice", "text"):
            raise ValueError(f"action_type must be 'choice' or 'text', got action_type={learner.action_type!r}")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (a plugin's test cleaning up after itself)."""
    METHODS.pop(name, None)


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name: str) -> Method:
    """The registered method ``name``; an unknown name raises ``ValueError`` with a close match."""
    if name not in METHODS:
        hint = difflib.get_close_matches(name, list(METHODS), n=1)
        raise ValueError(f"method must be one of {tuple(METHODS)}, got method={name!r}"
                         + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return METHODS[name]


def learners() -> dict[str, Learner]:
    """Every learner of a registered method, by name."""
    return {lr.name: lr for m in METHODS.values() for lr in m.learners()}


def kind_of(method: str, echorl_learner: str = "gigpo") -> str:
    """The checkpoint kind (the learner's name) a run of ``method`` writes; ValueError for an unknown method."""
    m = get_method(method)
    if m.learner_field is None:
        return m.learner_for().name

    class _Run:
        pass

    run = _Run()
    setattr(run, m.learner_field, echorl_learner)
    return m.learner_for(run).name


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal under each field, CleanRL style)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def option_table(exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """Every learner option of the registered methods: ``{name: {"annotation", "help", "methods", "defaults"}}``
    (the first learner declaring a name gives its type and help; ``defaults`` by learner); names in ``exclude`` are
    left out."""
    table: dict[str, dict[str, Any]] = {}
    for m in METHODS.values():
        if not m.rl:
            continue
        for learner in m.learners():
            cls = learner.config_class()
            if cls is None:
                continue
            fields = {f.name: f for f in dataclasses.fields(cls)}
            docs = field_docs(cls)
            for name in learner.option_names():
                if name in exclude or name not in fields:
                    continue
                f = fields[name]
                row = table.setdefault(name, {"annotation": str(f.type), "help": docs.get(name, ""), "methods": [],
                                              "defaults": {}})
                if m.name not in row["methods"]:
                    row["methods"].append(m.name)
                if f.default is not dataclasses.MISSING:
                    row["defaults"].setdefault(learner.title or learner.name, f.default)
    return table


# ------------------------------------------------------------------ the built-in methods
register(Method("bc", PPO, "behaviour cloning on the expert (LoRA, LLMPolicy)", warm_start="bc", rl=False,
                recipe="minigrid-bc", agent="llm-bc", agent_description="SmolLM2 behaviour-cloned on the expert (LoRA, LLMPolicy)"))
register(Method("ppo", PPO, "LLM-PPO from the pretrained LM", agent="llm-ppo",
                agent_description="SmolLM2 trained by PPO (LLMPolicy: LoRA, engine rollouts, activation reuse; "
                "bc_warm_start option)", bc_variant="bc+ppo"))
register(Method("bc+ppo", PPO, "BC warm start, then PPO", warm_start="bc", recipe="gotolocal-ppo"))
register(Method("echoppo", PPO, "BC warm start, then PPO with the latent plan and its KL term", warm_start="bc",
                plan=True, agent="llm-echoppo",
                agent_description="SmolLM2, BC warm start + EchoPPO with the latent plan (soft tokens, plan KL)"))
register(Method("gigpo", GIGPO, "critic-free group RL from the pretrained LM (K episodes per seed)",
                recipe="gotolocal-rl", agent="llm-gigpo",
                agent_description="SmolLM2 trained by GiGPO (critic-free group RL: K episodes per seed, anchor-state "
                "step advantages; bc_warm_start option)", bc_variant="bc+gigpo"))
register(Method("bc+gigpo", GIGPO, "BC warm start, then GiGPO", warm_start="bc", recipe="gotolocal-sft-rl"))
register(Method("echorl", {"gigpo": GIGPO, "ppo": PPO},
                "EchoRL on the LM: GiGPO + latent plan tokens (plan KL) + hot/cold prioritized replay of LLM "
                "transitions (echorl_learner=ppo: echoppo + the replay)", warm_start="bc_warm_start", plan=True,
                replay=True, learner_field="echorl_learner", agent="llm-echorl",
                agent_description="SmolLM2 trained by EchoRL on the LM: GiGPO + latent plan tokens (plan KL) + hot/cold "
                "prioritized replay of LLM transitions (echorl_learner=ppo option: echoppo + the replay)"))
register(Method("grpo", GRPO, "free-text envs: oracle-answer warm start, then GRPO", warm_start="oracle",
                recipe="arithmetic-grpo", agent="llm-grpo",
                agent_description="SmolLM2 trained by GRPO on free-text envs (oracle warm start, group sampling)"))
