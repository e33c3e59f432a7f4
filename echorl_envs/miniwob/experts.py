"""Experts for MiniWoB++ tasks whose solution follows from the task's own fields and the visible page.

Each expert reads MiniWoB's fields (``miniwob.fields``: e.g. ``target`` for click-button, ``username`` and
``password`` for login-user) and the rendered elements, never the page's hidden state, and returns the next
action or None. They plan from pages an expert would reach: a text field holding something other than empty
or the wanted text (an agent's typo) makes the form experts return None rather than guess how to clear it.
Tasks without an honest expert are not listed in :data:`EXPERTS`. ``_focus`` (focus-text, focus-text-2) and
``_enter_text_2`` are kept but unregistered: measured 0/10 (MiniWoB's element click focuses the field without the
event those tasks reward; the enter-text-2 field lower-cases typed capitals), see docs/results/envs.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from echorl_envs.miniwob.page import Command, Element

__all__ = ["EXPERTS", "expert_action"]

Fields = dict[str, str]
Expert = Callable[[Fields, Sequence[Element]], "str | None"]


def _label(el: Element, elements: Sequence[Element]) -> str:
    """Visible text of ``el``: its own text, else the text fragments right after it that sit inside it."""
    if el.text:
        return el.text
    i = elements.index(el)
    parts = []
    for e in elements[i + 1:]:
        if e.depth <= el.depth:
            break
        if e.ref < 0:
            parts.append(e.text)
    return " ".join(parts)


def _beside(el: Element, elements: Sequence[Element]) -> str:
    """The text fragment following a checkbox/radio inside its ``<label>``."""
    i = elements.index(el)
    nxt = elements[i + 1] if i + 1 < len(elements) else None
    return nxt.text if nxt is not None and nxt.ref < 0 else ""


def _click(el: Element | None) -> str | None:
    return None if el is None else f"click {el.ref}"


def _button(elements: Sequence[Element], text: str) -> Element | None:
    for e in elements:
        if e.base_tag == "button" and e.clickable and _label(e, elements).strip().lower() == text.lower():
            return e
    return None


def _fill(targets: Sequence[tuple[Element, str]], submit: Element | None) -> str | None:
    for el, want in targets:
        if el.value == want:
            continue
        if el.value in ("", None):
            return str(Command("type", el.ref, want))
        return None  # wrong content typed by someone else: not planned (see the module docstring)
    return _click(submit)


def _inputs(elements: Sequence[Element]) -> list[Element]:
    return [e for e in elements if e.typeable]


def _by_id(elements: Sequence[Element], id_: str) -> Element | None:
    return next((e for e in elements if e.id == id_), None)


def _click_target(f: Fields, els: Sequence[Element]) -> str | None:
    return _click(_button(els, f["target"]))


def _click_test(f: Fields, els: Sequence[Element]) -> str | None:
    return _click(next((e for e in els if e.base_tag == "button"), None))


def _sequence(f: Fields, els: Sequence[Element]) -> str | None:
    one = _button(els, "ONE")
    return _click(one if one is not None and not one.tampered else _button(els, "TWO"))


def _link(f: Fields, els: Sequence[Element]) -> str | None:
    return _click(next((e for e in els if e.clickable and e.text == f["target"]), None))


def _dialog(f: Fields, els: Sequence[Element]) -> str | None:
    target = f.get("target", "x")
    return _click(_button(els, "Close") if target == "x" else _button(els, target))


def _tab(f: Fields, els: Sequence[Element]) -> str | None:
    return _click(next((e for e in els if e.tag == "a" and e.text == f"Tab #{f['target']}"), None))


_WIDGET_TAGS = {"radio": "input_radio", "checkbox": "input_checkbox", "text": "input_text",
                "textarea": "textarea", "button": "button"}


def _widget(f: Fields, els: Sequence[Element]) -> str | None:
    tag = _WIDGET_TAGS.get(f["target"])
    return _click(next((e for e in els if e.tag == tag and e.clickable), None))


def _collapsible(f: Fields, els: Sequence[Element]) -> str | None:
    header = next((e for e in els if e.tag == "h3"), None)
    if header is not None and not header.tampered:
        return _click(header)
    return _click(_button(els, "Submit"))


def _focus(f: Fields, els: Sequence[Element]) -> str | None:
    inputs = _inputs(els)
    n = int(f.get("target", "1")) - 1
    return _click(inputs[n]) if 0 <= n < len(inputs) else None


def _option(f: Fields, els: Sequence[Element]) -> str | None:
    radio = next((e for e in els if e.tag == "input_radio" and _beside(e, els) == f["target"]), None)
    if radio is None:
        return None
    return _click(radio) if radio.value is not True else _click(_button(els, "Submit"))


def _checkboxes(f: Fields, els: Sequence[Element]) -> str | None:
    wanted = {v for k, v in f.items() if k.startswith("target")}
    for box in (e for e in els if e.tag == "input_checkbox"):
        if (box.value is True) != (_beside(box, els) in wanted):
            return _click(box)
    return _click(_button(els, "Submit"))


def _choose_list(f: Fields, els: Sequence[Element]) -> str | None:
    sel = next((e for e in els if e.tag == "select"), None)
    if sel is None:
        return None
    if not any(t == f["target"] and s for t, s in sel.options):
        return str(Command("select", sel.ref, f["target"]))
    return _click(_button(els, "Submit"))


def _enter_text(f: Fields, els: Sequence[Element]) -> str | None:
    inputs = _inputs(els)
    return _fill([(inputs[0], f["target"])], _button(els, "Submit")) if inputs else None


def _enter_text_2(f: Fields, els: Sequence[Element]) -> str | None:
    want = f["text"].lower() if f["case"] == "lower" else f["text"].upper()
    inputs = _inputs(els)
    return _fill([(inputs[0], want)], _button(els, "Submit")) if inputs else None


def _password(f: Fields, els: Sequence[Element]) -> str | None:
    return _fill([(e, f["target"]) for e in _inputs(els)], _button(els, "Submit"))


def _login(f: Fields, els: Sequence[Element]) -> str | None:
    user, pw = _by_id(els, "username"), _by_id(els, "password")
    if user is None or pw is None:
        return None
    return _fill([(user, f["username"]), (pw, f["password"])], _button(els, "Login"))


#: MiniWoB task name -> expert.
EXPERTS: dict[str, Expert] = {
    "click-test": _click_test,
    "click-test-2": _click_target,
    "click-button": _click_target,
    "click-button-sequence": _sequence,
    "click-link": _link,
    "click-dialog": _dialog,
    "click-dialog-2": _dialog,
    "click-tab": _tab,
    "click-widget": _widget,
    "click-collapsible-nodelay": _collapsible,
    "click-option": _option,
    "click-checkboxes": _checkboxes,
    "choose-list": _choose_list,
    "enter-text": _enter_text,
    "enter-text-dynamic": _enter_text,
    "enter-password": _password,
    "login-user": _login,
}


def expert_action(task: str, fields: Sequence[tuple[str, str]], elements: Sequence[Element]) -> str | None:
    """The expert's next action on this page, or None (no expert for ``task``, or nothing it can plan)."""
    fn = EXPERTS.get(task)
    if fn is None:
        return None
    try:
        return fn(dict(fields), elements)
    except (KeyError, ValueError):  # a field the utterance did not carry
        return None
