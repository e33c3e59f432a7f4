"""The text side of MiniWoB++: a compact rendering of MiniWoB's DOM, the admissible actions, action parsing.

MiniWoB's ``core.getDOMInfo`` gives every visible element a ``ref`` (text fragments beside elements get
negative refs); :func:`flatten` keeps what an agent needs (tag, id, first classes, text, value, focus) and
:func:`render` prints one line per element, indented by depth::

    [5] input_text #tt value="" (focused)
    [6] button #subbtn "Submit"

Actions (case-insensitive): ``click <ref>``, ``type <ref> "<text>"`` (MiniWoB's focus-element-and-type),
``select <ref> "<option>"`` (a ``<select>`` option), ``press <key>`` (MiniWoB's key names, e.g. ``enter``,
``tab``, ``backspace``, ``ctrl+a``, a letter).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Element", "Command", "flatten", "render", "admissible", "parse_command", "KEYS", "LISTED_KEYS"]

#: ``press`` key names -> MiniWoB's key strings (``miniwob.constants.DEFAULT_ALLOWED_KEYS``); letters, digits
#: and punctuation MiniWoB allows are accepted as themselves.
KEYS = {
    "enter": "<Enter>", "tab": "<Tab>", "backspace": "<Backspace>", "delete": "<Delete>", "space": "<Space>",
    "pageup": "<PageUp>", "pagedown": "<PageDown>", "arrowup": "<ArrowUp>", "arrowdown": "<ArrowDown>",
    "arrowleft": "<ArrowLeft>", "arrowright": "<ArrowRight>",
    "ctrl+a": "C-a", "ctrl+c": "C-c", "ctrl+x": "C-x", "ctrl+v": "C-v",
}
#: Keys listed among the admissible actions (the others are accepted but not listed, to keep the list short).
LISTED_KEYS = ("enter", "tab", "backspace", "ctrl+a")
_SINGLE_KEYS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789[]-=;\"\\,./`")
_CLICK_TAGS = frozenset({"button", "a", "input", "select", "textarea", "label", "li", "option", "summary"})
_NOT_TYPEABLE = frozenset({"checkbox", "radio", "button", "submit", "reset", "range", "color", "file", "image"})
#: Longest text a ``type`` action may carry (MiniWoB's own typing limit is 64 characters).
MAX_TYPE = 64

_CMD = re.compile(r"^\s*(click|type|select|press)\b\s*(.*)$", re.IGNORECASE | re.DOTALL)
_REF_ARG = re.compile(r"^\[?(-?\d+)\]?\s*(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Element:
    """One rendered element of MiniWoB's DOM."""

    ref: int
    tag: str
    depth: int
    text: str = ""
    value: str | bool | None = None
    id: str = ""
    classes: str = ""
    focused: bool = False
    tampered: bool = False
    is_leaf: bool = False
    options: tuple[tuple[str, bool], ...] = ()

    @property
    def base_tag(self) -> str:
        return self.tag.split("_", 1)[0]

    @property
    def clickable(self) -> bool:
        return self.ref > 0 and (self.is_leaf or self.base_tag in _CLICK_TAGS)

    @property
    def typeable(self) -> bool:
        if self.tag == "textarea":
            return True
        return self.base_tag == "input" and self.tag.split("_", 1)[-1] not in _NOT_TYPEABLE


@dataclass(frozen=True)
class Command:
    """A parsed action: ``kind`` in click/type/select/press, its ``ref`` and ``text`` (typed text, option, key)."""

    kind: str
    ref: int | None = None
    text: str = ""

    def __str__(self) -> str:
        if self.kind == "click":
            return f"click {self.ref}"
        if self.kind == "press":
            return f"press {self.text}"
        return f'{self.kind} {self.ref} "{self.text}"'


def _informative(el) -> bool:
    tag = el.tag.lower()
    return bool(el.text) or el.value is not None or tag.split("_")[0] in _CLICK_TAGS or not el.is_leaf or el.focused


def flatten(root, options: dict[int, tuple[tuple[str, bool], ...]] | None = None) -> list[Element]:
    """MiniWoB's ``DOMElement`` tree -> rendered elements in document order (page chrome and empty leaves dropped).

    ``body`` and MiniWoB's ``#wrap``/``#area`` frame are not shown (their children move up); leaves without
    text, value or an interactive tag (resize handles, spacers) are dropped; ``options`` maps a ``<select>``'s
    ref to its ``(option text, selected)`` pairs.
    """
    options = options or {}
    out: list[Element] = []

    def visit(el, depth: int) -> None:
        tag = el.tag.lower()
        frame = tag == "body" or el.id in ("wrap", "area")
        if not frame and _informative(el):
            classes = " ".join(str(el.classes or "").split()[:2])
            out.append(Element(
                ref=int(el.ref), tag=tag, depth=depth, text=(el.text or "").strip(), value=el.value,
                id=el.id or "", classes=classes, focused=bool(el.focused), tampered=bool(el.tampered),
                is_leaf=bool(el.is_leaf), options=options.get(int(el.ref), ()),
            ))
        for child in el.children:
            visit(child, depth if frame else depth + 1)

    visit(root, 0)
    return out


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(utterance: str, elements: Sequence[Element]) -> str:
    """The observation: the task's utterance, then one line per element."""
    lines = [f"Task: {utterance}", "Page:"]
    for e in elements:
        pad = "  " * (e.depth + 1)
        if e.ref < 0:  # a text fragment beside elements: not addressable
            lines.append(f"{pad}{_quote(e.text)}")
            continue
        parts = [f"[{e.ref}] {e.tag}"]
        if e.id:
            parts.append(f"#{e.id}")
        if e.classes:
            parts.append("." + e.classes.replace(" ", "."))
        if e.text and not (e.tag == "textarea" and e.text == e.value):
            parts.append(_quote(e.text))
        if isinstance(e.value, bool):
            parts.append("(checked)" if e.value else "(unchecked)")
        elif e.value is not None:
            parts.append(f"value={_quote(str(e.value))}")
        if e.options:
            shown = ", ".join(("*" if sel else "") + _quote(t) for t, sel in e.options)
            parts.append(f"options=[{shown}]")
        if e.focused:
            parts.append("(focused)")
        lines.append(pad + " ".join(parts))
    return "\n".join(lines)


def admissible(elements: Sequence[Element], fields: Sequence[tuple[str, str]]) -> list[str]:
    """The listed actions: a click per clickable element, ``type`` of each task field value into each text
    input (MiniWoB's type-field actions; any other text is accepted too), each ``<select>`` option, a few keys."""
    clicks = [f"click {e.ref}" for e in elements if e.clickable]
    values = list(dict.fromkeys(str(v) for _, v in fields if str(v)))
    types = [str(Command("type", e.ref, v)) for e in elements if e.typeable for v in values]
    selects = [str(Command("select", e.ref, t)) for e in elements for t, _ in e.options]
    return [*clicks, *types, *selects, *(f"press {k}" for k in LISTED_KEYS)]


def _unquote(text: str) -> str:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
        body = t[1:-1]
        return body.replace('\\"', '"').replace("\\\\", "\\") if t[0] == '"' else body
    return t


class CommandError(ValueError):
    """An action that looks like a command but cannot be executed (the message says why)."""


def parse_command(action: str, elements: Sequence[Element]) -> Command | None:
    """Parse an action; None when it is not a command at all, :class:`CommandError` when it is a bad one."""
    m = _CMD.match(action)
    if m is None:
        return None
    kind, rest = m.group(1).lower(), m.group(2).strip()
    if kind == "press":
        key = rest.lower() if rest.lower() in KEYS else _unquote(rest)
        if key not in KEYS and key not in _SINGLE_KEYS:
            raise CommandError(f"unknown key {key[:20]!r}; keys: {', '.join(KEYS)} or a single letter/digit")
        return Command("press", None, key)
    r = _REF_ARG.match(rest)
    if r is None:
        raise CommandError(f"'{kind}' needs an element ref, e.g. '{kind} 4'")
    ref, arg = int(r.group(1)), r.group(2).strip()
    by_ref = {e.ref: e for e in elements if e.ref > 0}
    if ref not in by_ref:
        raise CommandError(f"there is no element [{ref}] on the page")
    el = by_ref[ref]
    if kind == "click":
        if arg:
            raise CommandError("'click' takes only a ref, e.g. 'click 4'")
        return Command("click", ref)
    if not arg:
        raise CommandError(f"'{kind}' needs a quoted text, e.g. '{kind} {ref} \"text\"'")
    text = _unquote(arg)
    if kind == "type":
        if not el.typeable:
            raise CommandError(f"element [{ref}] ({el.tag}) is not a text field")
        if not text or len(text) > MAX_TYPE or "\n" in text:
            raise CommandError(f"the typed text must be 1 to {MAX_TYPE} characters on one line")
        return Command("type", ref, text)
    if el.tag != "select":
        raise CommandError(f"element [{ref}] ({el.tag}) is not a list (<select>)")
    names = [t for t, _ in el.options]
    if text not in names:
        raise CommandError(f"[{ref}] has no option {text[:40]!r}; options: {', '.join(names)}")
    return Command("select", ref, text)
