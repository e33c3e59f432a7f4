"""``echorl train-llm``'s per-method options, generated from the registry: one flag per learner option (the fields
of each learner's Config dataclass, e.g. ``--minibatch-size`` for GiGPO, ``--gae-lambda`` for PPO, ``--max-tokens``
for GRPO), its help the field's docstring. A flag the run's method does not take is an error naming the methods
that do. The JSON flags ``--gigpo-kwargs``, ``--ppo-kwargs``, ``--grpo-kwargs``, ``--method-kwargs`` set the same
options (a flag wins over the same key in the JSON).
"""

from __future__ import annotations

import argparse
from typing import Any

from echorl_agent.llm_rl.algorithms.registry import get_method, option_table

__all__ = ["OPTION_DEST_PREFIX", "add_method_options", "given_options", "method_options"]

OPTION_DEST_PREFIX = "opt_"
"""Generated flags store their value under ``args.opt_<name>`` (None: not given)."""


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _converter(annotation: str) -> Any:
    """An argparse ``type`` for a dataclass field's annotation (None: a type with no flag, e.g. a dict)."""
    parts = [p.strip() for p in annotation.split("|")]
    optional = "None" in parts
    parts = [p for p in parts if p != "None"]
    base = {"int": int, "float": float, "str": str, "bool": _bool}
    if not parts or any(p not in base for p in parts):
        return None

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        for p in parts:
            try:
                return base[p](text)
            except (ValueError, argparse.ArgumentTypeError):
                continue
        raise argparse.ArgumentTypeError(f"expected {annotation}, got {text!r}")

    convert.__name__ = annotation  # argparse names the type in its errors
    return convert


def add_method_options(parser: argparse.ArgumentParser, exclude: set[str]) -> None:
    """Add one flag per learner option of the registered methods (names in ``exclude``, the run's own flags,
    are left out: set those through the JSON flags). Each defaults to ``argparse.SUPPRESS``: not given, not set."""
    group = parser.add_argument_group("method options (from each method's Config; unset: the method's default)")
    for name, row in option_table(exclude=frozenset(exclude)).items():
        convert = _converter(row["annotation"])
        if convert is None:
            continue
        doc = row["help"].rstrip(".") or name
        defaults = row["defaults"]
        if len(set(map(repr, defaults.values()))) == 1:
            default = f"; default {next(iter(defaults.values()))!r}"
        else:
            default = "; default " + ", ".join(f"{v!r} ({k})" for k, v in defaults.items())
        group.add_argument(f"--{name.replace('_', '-')}", dest=OPTION_DEST_PREFIX + name, type=convert,
                           default=argparse.SUPPRESS, metavar=row["annotation"].upper().replace(" | ", "|"),
                           help=f"{doc} ({', '.join(row['methods'])}{default})".replace("%", "%%"))


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generated flags given on a parsed command line: ``{option name: value}``."""
    return {k[len(OPTION_DEST_PREFIX):]: v for k, v in vars(args).items() if k.startswith(OPTION_DEST_PREFIX)}


def method_options(given: dict[str, Any], run: Any) -> dict[str, dict[str, Any]]:
    """Route the generated flags ``given`` to the options dict of ``run``'s learner (``gigpo_kwargs``,
    ``ppo_kwargs``, ``grpo_kwargs`` or ``method_kwargs``); ``run`` needs ``method`` (and ``echorl_learner``).

    Raises:
        ValueError: a flag the run's method does not take (the message names the methods that do).
    """
    if not given:
        return {}
    method = get_method(run.method)
    learner = method.learner_for(run)
    names = learner.option_names() if method.rl else ()
    out: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        if name not in names:
            takers = option_table().get(name, {}).get("methods", [])
            raise ValueError(f"--{name.replace('_', '-')} is an option of {', '.join(takers)}, not of --method "
                             f"{run.method}" + (f" with its {learner.name} learner" if method.learner_field else ""))
        out.setdefault(learner.options_field, {})[name] = value
    return out
