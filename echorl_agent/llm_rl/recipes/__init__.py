"""Recipes: the settings of every published ``train-llm`` result, one YAML file each (rl-baselines3-zoo's habit).

A recipe file (``<name>.yaml`` in this folder, shipped with the package) holds what ``echorl recipes`` lists and the
training config::

    description: one line
    study: where the result is registered and reported (section, seeds), or "no registered study yet (...)"
    command: the study's registered command (what tests/test_recipes.py parses and compares with ``config``), or
             for an unregistered recipe the command a study would register
    expected: the published held-out figure, or "no registered study yet: no figure (goal: ...)"
    time: wall time per seed on 2 cores (an unregistered recipe's is an estimate, labelled ESTIMATE)
    seeds: [the registered seeds]
    config:            # LLMTrainConfig fields (echorl_agent.llm_rl.train)
      env_id: EchoRL/BabyAI-GoToLocal-v0
      method: gigpo
      ...

``echorl train-llm --recipe NAME`` runs it; any flag given on the command line overrides the recipe's field
(``--policy-kwargs`` and the other JSON flags are merged key by key into the recipe's dict); ``--config FILE`` reads
the user's own file in the same format (YAML or TOML; a file with no ``config:`` section is read as the config
itself).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

__all__ = ["CLI_EVAL_EPISODES", "RECIPE_KEYS", "Recipe", "TASK_FIELDS", "UNREGISTERED", "load_recipe", "method_recipe", "read_recipe_file",
           "recipe_names", "resolve_config", "task_recipe", "train_config"]

HERE = Path(__file__).resolve().parent
RECIPE_KEYS = ("description", "study", "command", "expected", "time", "seeds", "config")
"""The top-level keys a recipe file may hold."""
UNREGISTERED = "no registered study yet"
"""How the ``study`` and ``expected`` fields of a recipe no study has run yet begin."""


@dataclasses.dataclass
class Recipe:
    """One recipe: its name, what ``echorl recipes`` shows, and the :class:`LLMTrainConfig` fields."""

    name: str
    config: dict[str, Any]
    description: str = ""
    study: str = ""
    command: str = ""
    expected: str = ""
    time: str = ""
    seeds: list[int] = dataclasses.field(default_factory=list)
    path: str = ""

    @property
    def registered(self) -> bool:
        """Whether a registered study stands behind the recipe (an unregistered one's ``study`` starts with "no
        registered study yet" and its ``expected`` states no figure)."""
        return bool(self.study) and not self.study.startswith(UNREGISTERED)

    @property
    def budget(self) -> str:
        """The training budget in words (env steps or completions, and the BC warm start)."""
        c = self.config
        method = c.get("method", "bc+ppo")
        parts = []
        if c.get("bc_episodes") and (method.startswith("bc") or method in ("echoppo",) or c.get("bc_warm_start")):
            parts.append(f"BC {c['bc_episodes']} expert episodes")
        if method != "bc":
            unit = "completions" if method == "grpo" else "env steps"
            parts.append(f"{c.get('train_steps', 512):,} {unit}")
        return " + ".join(parts)


def recipe_names() -> list[str]:
    """The shipped recipes' names, sorted."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def _load_text(path: Path) -> dict[str, Any]:
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(path.read_text())
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe file holds a mapping of fields, got {type(data).__name__}")
    return data


def read_recipe_file(path: str | Path, name: str | None = None) -> Recipe:
    """A recipe from a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file; a file without a ``config`` key is read
    as the config itself (the user's own ``--config FILE``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown top-level key or config field (named, with the close match).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file {str(path)!r} does not exist")
    data = _load_text(path)
    if "config" not in data:
        data = {"config": data}
    unknown = [k for k in data if k not in RECIPE_KEYS]
    if unknown:
        raise ValueError(f"{path}: unknown recipe key {unknown[0]!r}{_hint(unknown[0], RECIPE_KEYS)} "
                         f"(keys: {', '.join(RECIPE_KEYS)})")
    config = dict(data["config"] or {})
    check_fields(config, str(path))
    return Recipe(name=name or path.stem, path=str(path), **{k: v for k, v in data.items() if k != "config"},
                  config=config)


def load_recipe(name: str) -> Recipe:
    """The shipped recipe ``name``.

    Raises:
        ValueError: no recipe of that name (the message names the close matches and lists the recipes).
    """
    names = recipe_names()
    if name not in names:
        raise ValueError(f"unknown recipe {name!r}{_hint(name, names)} (recipes: {', '.join(names)})")
    return read_recipe_file(HERE / f"{name}.yaml", name)


def check_fields(config: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming the first key of ``config`` that is not an :class:`LLMTrainConfig` field."""
    fields = _fields()
    for k in config:
        if k not in fields:
            raise ValueError(f"{where}: unknown field {k!r}{_hint(k, fields)} (LLMTrainConfig fields: "
                             f"{', '.join(fields)})")


def train_config(recipe: Recipe | None = None, overrides: dict[str, Any] | None = None):
    """The :class:`~echorl_agent.llm_rl.train.LLMTrainConfig` of ``recipe`` with ``overrides`` on top (dict fields
    such as ``policy_kwargs`` are merged key by key; other fields replace the recipe's).

    Raises:
        ValueError: an unknown field, or a value :class:`LLMTrainConfig` rejects.
    """
    from echorl_agent.llm_rl.train import LLMTrainConfig

    base = dict(recipe.config) if recipe is not None else {}
    for k, v in (overrides or {}).items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    check_fields(base, f"recipe {recipe.name!r}" if recipe is not None else "config")
    return LLMTrainConfig(**base)


def _fields() -> list[str]:
    from echorl_agent.llm_rl.train import LLMTrainConfig

    return [f.name for f in dataclasses.fields(LLMTrainConfig)]


def _hint(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def method_recipe(method: str) -> str | None:
    """The recipe whose learner settings (the fields of :data:`TASK_FIELDS` excluded) are ``method``'s defaults: its
    registry entry's ``recipe`` (``echorl train-llm --method gigpo --task ...`` trains as §26 did, on the task
    given); None for a method without one."""
    from echorl_agent.llm_rl.algorithms.registry import METHODS

    spec = METHODS.get(method)
    return None if spec is None else spec.recipe


#: Fields that belong to a task and a run, not to a method: a method's defaults never take them from its recipe.
TASK_FIELDS = ("env_id", "env_kwargs", "method", "train_steps", "max_episode_steps", "eval_episodes", "eval_every",
               "checkpoint_every", "seed", "out", "progress")
#: ``echorl train-llm``'s held-out episodes per mode when neither a recipe nor a flag sets them.
CLI_EVAL_EPISODES = 20


def task_recipe(env_id: str, method: str | None = None) -> Recipe | None:
    """The first shipped recipe (in name order, registered ones first) on ``env_id`` (and of ``method`` when given),
    or None: what ``echorl train-llm --task ENV_ID`` takes its settings from, as rl-baselines3-zoo keys
    hyperparameters by env id."""
    found = [r for r in map(load_recipe, recipe_names())
             if r.config.get("env_id") == env_id and (method is None or r.config.get("method") == method)]
    return min(found, key=lambda r: not r.registered) if found else None


def resolve_config(overrides: dict[str, Any], recipe: str | None = None, config_file: str | None = None):
    """The config ``echorl train-llm`` runs and where its settings came from, in this order (later wins):

    1. :class:`LLMTrainConfig`'s defaults, with ``eval_episodes`` = :data:`CLI_EVAL_EPISODES`;
    2. the method's defaults: its best recipe's learner settings (:func:`method_recipe`), when 3 gives none;
    3. the settings: ``recipe`` (a shipped name), else ``config_file`` (the user's YAML/TOML), else the shipped
       recipe on the task (and method) of ``overrides`` (:func:`task_recipe`);
    4. ``overrides`` (the flags given on the command line; dicts merged key by key).

    Returns:
        (config, provenance): provenance says in words which recipe or file and which method defaults were used.

    Raises:
        ValueError: an unknown recipe (with close matches), an unknown field, a bad value, or no task anywhere.
        FileNotFoundError: ``config_file`` does not exist.
    """
    if recipe is not None and config_file is not None:
        raise ValueError(f"give --recipe or --config, not both (got recipe={recipe!r}, config={config_file!r})")
    chosen = load_recipe(recipe) if recipe is not None else (
        read_recipe_file(config_file) if config_file is not None else None)
    how = f"recipe {chosen.name}" if recipe is not None else f"config file {config_file}" if chosen else ""
    if chosen is None and overrides.get("env_id"):
        chosen = task_recipe(overrides["env_id"], overrides.get("method"))
        how = f"recipe {chosen.name} (the shipped recipe for this task)" if chosen else ""
    base: dict[str, Any] = {"eval_episodes": CLI_EVAL_EPISODES}
    if chosen is None:
        method = overrides.get("method", "bc+ppo")
        default = method_recipe(method)
        if default is not None:
            learner = load_recipe(default).config
            base.update({k: v for k, v in learner.items() if k not in TASK_FIELDS})
            how = f"{method}'s defaults from recipe {default}"
        else:
            how = "LLMTrainConfig's defaults"
    else:
        base.update(chosen.config)
    merged = Recipe(name=chosen.name if chosen else "defaults", config=base)
    if "env_id" not in {**base, **overrides}:
        raise ValueError("give --task (the env id), or a --recipe / --config that names env_id")
    cfg = train_config(merged, overrides)
    given = sorted(k for k in overrides if k not in ("out", "progress"))
    return cfg, how + (f"; flags: {', '.join(given)}" if given else "")
