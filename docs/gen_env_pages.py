"""Write docs/envs/<family>.md from the registration table and the env classes' docstrings.

The pages are generated so they cannot drift from the code: ``tests/test_docs.py`` fails when a committed page
differs from what this script writes. Run it after changing an env docstring or the table:

    .venv/bin/python docs/gen_env_pages.py
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "envs"

#: Page title and one-line source note per family (the rest comes from the code).
FAMILIES = {
    "minigrid": "MiniGrid / BabyAI",
    "math": "Math (GSM8K, GSM-Symbolic, arithmetic, Game of 24)",
    "alfworld": "ALFWorld",
    "textworld": "TextWorld",
    "webshop": "WebShop",
    "cruxeval": "CRUXEval",
    "cruxeval-repair": "CRUXEval-Repair",
    "arc": "ARC",
    "miniwob": "MiniWoB++",
}

_HEADING = re.compile(r"^([A-Z][\w ()/'-]*):\s*$")
_BOLD_HEADING = re.compile(r"^\*\*([^*]+?)\*\*[.:]?\s*(.*)$")
_ARG = re.compile(r"^(\*{0,2}\w+): (.*)$")


def _inline(text: str) -> str:
    """reST inline markup to Markdown: ``x`` -> `x`, :class:`~a.B` -> `B`."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1] if m.group(0).find('~') > 0 else m.group(1)}`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def docstring_to_markdown(doc: str) -> str:
    """Google-style sections ("Description:" + indented block) and **Bold**: paragraphs to Markdown."""
    # a section started mid-line ("... else 0. **Termination.** On a pass") starts its own line
    doc = re.sub(r"(?<=[.:]) (\*\*(?:Description|Data|Observation|Actions|Rewards|Termination|Info|Registered ids)"
                 r"[.:]?\*\*[.:]?)", r"\n\1", inspect.cleandoc(doc))
    lines = doc.splitlines()
    out: list[str] = []
    section = None
    for line in lines:
        m = _HEADING.match(line)
        if m:
            section = m.group(1)
            out += ["", f"### {'Arguments' if section == 'Args' else section}", ""]
            continue
        b = _BOLD_HEADING.match(line)
        if b and not line.startswith("    "):
            section = None
            first = _inline(b.group(2))
            out += ["", f"### {b.group(1).rstrip('.:')}", ""] + ([first[:1].upper() + first[1:]] if first else [])
            continue
        if section is not None and line.startswith("    "):
            body = line[4:]
            a = _ARG.match(body) if section in ("Args", "Attributes") and not body.startswith(" ") else None
            if a:
                out.append(f"- `{a.group(1)}`: {_inline(a.group(2))}")
            else:
                out.append(("  " if section in ("Args", "Attributes") else "") + _inline(body.strip()))
            continue
        if line and not line.startswith(" "):
            section = None
        out.append(_inline(line))
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def family_page(family: str) -> str:
    import echorl_envs

    rows = [e for e in echorl_envs.ENVS if e.family == family]
    classes: dict[str, type] = {}
    for e in rows:
        mod, _, name = e.entry_point.partition(":")
        classes.setdefault(e.entry_point, getattr(importlib.import_module(mod), name))
    parts = [f"# {FAMILIES[family]}", "",
             "Generated from the registration table (`echorl_envs.ENVS`) and the env classes' docstrings by "
             "`docs/gen_env_pages.py`; do not edit by hand. The protocol every env follows (text observations "
             "and actions, the `info` keys, invalid actions as feedback) is in [the env plug point](../plug-new-env.md).",
             "", "## Registered ids", "",
             "| id | class | max steps | actions | data | kwargs |", "|---|---|---|---|---|---|"]
    for e in rows:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in e.kwargs.items()) or "-"
        parts.append(f"| `{e.id}` | `{e.entry_point.split(':')[1]}` | {e.max_episode_steps} | {e.action_type} | "
                     f"{e.data} | `{kwargs}` |" if kwargs != "-" else
                     f"| `{e.id}` | `{e.entry_point.split(':')[1]}` | {e.max_episode_steps} | {e.action_type} | "
                     f"{e.data} | - |")
    for entry_point, cls in classes.items():
        parts += ["", f"## `{cls.__name__}` (`{entry_point.replace(':', '.')}`)", "",
                  docstring_to_markdown(inspect.getdoc(cls) or "").rstrip()]
    return "\n".join(parts) + "\n"


def render_all() -> dict[Path, str]:
    return {OUT / f"{family}.md": family_page(family) for family in FAMILIES}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in render_all().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
