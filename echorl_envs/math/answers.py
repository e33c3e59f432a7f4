"""Numeric answer extraction and exact comparison for math environments.

The extraction order follows the conventions of GSM8K graders (OpenAI's ``grade-school-math`` marks the
final answer with ``#### N``; lm-evaluation-harness' "flexible extract" falls back to the last number in
the text; MATH-style answers put it in ``\\boxed{}``):

1. the text after the last ``####`` marker;
2. the content of the last ``\\boxed{...}`` (``\\frac``, ``\\$``, ``\\text{}`` understood);
3. the text after the last "answer is" / "answer:" / "answer =" phrase;
4. the whole text.

After ``####`` or an answer phrase the *first* number is taken ("The answer is 18. Check: 9 * 2" gives
18); inside ``\\boxed{}`` and in the whole text the *last* ("12 x 2 = 24, so 24 + 46 = 70" gives 70).
Numbers may carry a currency sign, thousands separators, a decimal part, an exponent, a percent sign or
be a fraction ``a/b``; values are :class:`fractions.Fraction`, so "1,000.00", "1000" and
"$1,000" compare equal exactly and 0.1 + 0.2 style float fuzz never enters.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

__all__ = [
    "MAX_DIGITS",
    "ascii_text",
    "extract_answer",
    "format_number",
    "parse_number",
    "same_number",
]

#: Longest digit string accepted as a number (Python refuses int() on > 4300 digits; answers never need this).
MAX_DIGITS = 64

# A number: optional sign (only when not glued to a preceding digit/word, so "16-3-4" is not "-4"),
# thousands-grouped or plain integer part, optional decimal part and exponent, optional "/denominator".
_NUMBER = re.compile(
    r"(?:(?<![\w)\].])(?P<sign>[-+]))?(?=\.?\d)"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)?"
    r"(?P<frac>\.\d+)?"
    r"(?P<exp>[eE][-+]?\d{1,3}(?!\w))?"
    r"(?:/(?P<den>\d+(?:\.\d+)?))?"
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*", re.IGNORECASE)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_DROP = re.compile(r"\\[,!;:]|\\left|\\right|\\\$|\$")

_ASCII_MAP = {
    "\u2212": "-",
    "\u2013": "-",
    "\u2014": "-",
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00d7": "x",
    "\u00f7": "/",
    "\u20ac": "EUR ",
    "\u00a3": "GBP ",
    "\u00a5": "JPY ",
    "\u20b9": "INR ",
    "\u00a2": " cents",
    "\u00b0": " degrees",
    "\u00bd": "1/2",
    "\u00bc": "1/4",
    "\u00be": "3/4",
    "\u2026": "...",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
}
_ASCII_TABLE = str.maketrans(_ASCII_MAP)


def ascii_text(text: str) -> str:
    """Readable ASCII for questions: curly quotes, dashes, currency and fraction signs spelled out.

    Observations must be printable ASCII; the base class would escape the euro sign as ``\\u20ac``,
    which a language model reads worse than "EUR". Remaining accents are stripped by NFKD decomposition.
    """
    text = text.translate(_ASCII_TABLE)
    if text.isascii():
        return text
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` whose braces balance.

    One pass pairs every brace (a stack), so even adversarial replies ("\\boxed{" repeated 20,000 times,
    never closed) cost linear time.
    """
    starts = [m.end() - 1 for m in _BOXED.finditer(text)]  # index of each candidate's "{"
    if not starts:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            closing[stack.pop()] = i
    for brace in reversed(starts):
        if brace in closing:
            return text[brace + 1 : closing[brace]]
    return None


def _delatex(text: str) -> str:
    for _ in range(3):  # nested \frac{\frac{}{}}{} is rare; three passes cover realistic answers
        new = _LATEX_FRAC.sub(r"(\1)/(\2)", _LATEX_TEXT.sub(r"\1", text))
        if new == text:
            break
        text = new
    return _LATEX_DROP.sub("", text).replace("(", "").replace(")", "")


def _answer_span(text: str) -> tuple[str, str]:
    """The part of ``text`` holding the answer and which of its numbers to take ("first" or "last")."""
    if "####" in text:
        return text[text.rfind("####") + 4 :], "first"
    boxed = _last_boxed(text)
    if boxed is not None:
        return _delatex(boxed), "last"
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        tail = text[phrases[-1].end() :]
        if any(c.isdigit() for c in tail):
            return tail, "first"
    return text, "last"


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    int_part, frac_part, den = m.group("int"), m.group("frac"), m.group("den")
    if int_part is None and frac_part is None:
        return None
    digits = (int_part or "").replace(",", "") + (frac_part or "")[1:]
    exp = int(m.group("exp")[1:]) if m.group("exp") else 0
    if len(digits) > MAX_DIGITS or abs(exp) > MAX_DIGITS or (den is not None and len(den) > MAX_DIGITS):
        raise ValueError(f"a number with more than {MAX_DIGITS} digits")
    value = Fraction((int_part or "0").replace(",", "") + (frac_part or "") + (m.group("exp") or ""))
    if den is not None:
        d = Fraction(den)
        if d == 0:
            return None  # "3/0" is not a number; the numerator alone would be a guess
        value /= d
    if m.group("sign") == "-":
        value = -value
    return value


def parse_number(text: str, which: str = "last") -> Fraction | None:
    """The last (or first) number in ``text`` as a Fraction, or None.

    Raises:
        ValueError: when that number is absurdly long (more than :data:`MAX_DIGITS` digits).
    """
    if which not in ("first", "last"):
        raise ValueError(f"which must be 'first' or 'last', got which={which!r}")
    text = ascii_text(text).replace("$", "")
    matches = _NUMBER.finditer(text) if which == "first" else reversed(list(_NUMBER.finditer(text)))
    for m in matches:  # only the chosen number is converted (replies may hold 60k numbers)
        value = _to_fraction(m)
        if value is not None:
            return value
    return None


def extract_answer(text: str) -> Fraction | None:
    """The final numeric answer in a model's free-text reply (see the module docstring for the rules).

    Returns:
        The value as a Fraction, or None when the reply holds no number.

    Raises:
        ValueError: when the number is absurdly long (more than :data:`MAX_DIGITS` digits).
    """
    text = ascii_text(text)
    value = parse_number(*_answer_span(text))
    if value is None and "####" in text:  # "#### " with nothing after: fall back to the whole reply
        value = parse_number(text)
    return value


def format_number(value: Fraction) -> str:
    """Canonical text of a value: ``42``, ``-3``, ``2.5`` (terminating decimals) or ``1/3``."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value) * 10**places
    digits = str(scaled.numerator).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def same_number(a: Fraction | int | str, b: Fraction | int | str) -> bool:
    """Exact equality of two answers (strings go through :func:`extract_answer`)."""
    fa = extract_answer(a) if isinstance(a, str) else Fraction(a)
    fb = extract_answer(b) if isinstance(b, str) else Fraction(b)
    return fa is not None and fb is not None and fa == fb
