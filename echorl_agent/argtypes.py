"""argparse ``type=`` converters whose errors say what is wrong with the value and show one that works.

argparse prefixes a converter's :class:`argparse.ArgumentTypeError` with the option's name
(``echorl train-llm: error: argument --gigpo-kwargs: ...``), so the converter says what is wrong with the value,
quotes it, and shows an example. ``json.loads``'s own message (``Expecting property name enclosed in double
quotes: line 1 column 2 (char 1)``) named neither the flag nor the value.

    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="echorl", exit_on_error=False)
    >>> _ = p.add_argument("--gigpo-kwargs", type=json_object('{"epochs": 4}'))
    >>> p.parse_args(["--gigpo-kwargs", '{"epochs": 4}']).gigpo_kwargs
    {'epochs': 4}
    >>> p.parse_args(["--gigpo-kwargs", "{epochs: 4}"])
    Traceback (most recent call last):
    argparse.ArgumentError: argument --gigpo-kwargs: not valid JSON, got '{epochs: 4}' (Expecting property name enclosed in double quotes at column 2): object keys take double quotes, e.g. '{"epochs": 4}'
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

__all__ = ["again_prefix", "json_object"]

#: Longest value quoted back in an error message (a pasted file would drown the message).
_SHOWN = 200
_UNQUOTED_KEY = re.compile(r"[{,]\s*[A-Za-z_]\w*\s*:")


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


def _hint(value: str) -> str:
    """The usual reason a hand-typed JSON object does not parse."""
    if "'" in value:
        return "JSON strings and keys take double quotes, not single ones"
    if _UNQUOTED_KEY.search(value):
        return "object keys take double quotes"
    if value.strip()[:1] not in ("{", "["):
        return "give a JSON object in single shell quotes"
    return "check the brackets, commas and quotes"


def json_object(example: str, what: str = "a JSON object") -> Callable[[str], dict[str, Any]]:
    """An argparse ``type=`` parsing a JSON object (a dict), e.g. ``--ppo-kwargs '{"target_kl": 0.02}'``.

    Args:
        example: a valid value, shown in every error (``'{"epochs": 4}'``); it must itself parse to an object.
        what: how errors name the expected value (e.g. ``"a JSON object of GiGPO options"``).

    Returns:
        The converter. Its errors are :class:`argparse.ArgumentTypeError`, which argparse reports as
        ``argument --flag: <message>``; the message quotes the value given, says why it does not parse, and
        shows ``example``.
    """
    if not isinstance(json.loads(example), dict):
        raise ValueError(f"example must be a JSON object, got example={example!r}")

    def convert(value: str) -> dict[str, Any]:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(
                f"not valid JSON, got {_shown(value)} ({e.msg} at column {e.colno}): {_hint(value)}, "
                f"e.g. {example!r}") from None
        if not isinstance(parsed, dict):
            raise argparse.ArgumentTypeError(
                f"must be {what}, got {_shown(value)} (a JSON {_JSON_TYPES[type(parsed)]}), e.g. {example!r}")
        return parsed

    convert.__name__ = "JSON object"  # argparse's fallback message ("invalid JSON object value") uses it
    return convert


def again_prefix(value: str) -> str:
    """An argparse ``type=`` for ``echorl eval-llm --prefix``: a file stem of letters, digits, ``_`` and ``-`` that
    is not ``eval`` (the run's own ``eval.json`` stays as the run wrote it)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a file stem (letters, digits, '_' and '-'; e.g. "
                                         "'eval_templates')")
    if value == "eval":
        raise argparse.ArgumentTypeError("'eval' is the run's own evaluation; pick another name, e.g. "
                                         "'eval_templates'")
    return value
