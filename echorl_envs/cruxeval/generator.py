"""An offline generator of CRUXEval-style items: short Python functions over strings, lists and dicts.

CRUXEval (Gu et al., 2024) items are ``{"code", "input", "output", "id"}`` where ``code`` defines ``f``,
``input`` is the argument list as Python source and ``output`` the ``repr`` of ``f(*input)``. The real set
was written by Code Llama and filtered by execution; this module builds items of the same shape from a fixed
set of templates (string scanning, list mutation inside loops, dict counting, slicing, sorting with keys,
while loops) with random constants and random inputs, and gets each output by executing the function, so every
item is correct by construction. Deterministic for a given seed.
"""

from __future__ import annotations

import ast
import random
import string
from collections.abc import Callable

__all__ = ["generate_items", "TEMPLATES"]

_WORDS = ("apple", "kiwi", "banana", "cherry", "fig", "grape", "lemon", "mango", "pear", "plum", "date", "lime",
          "berry", "melon", "olive", "peach", "nut", "yam", "bean", "corn")


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def _text(rng: random.Random, lo: int = 4, hi: int = 12, alphabet: str = string.ascii_lowercase + "  ") -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))).strip() or "ab"


def _nums(rng: random.Random, lo: int = 3, hi: int = 8, vmax: int = 12) -> list[int]:
    return [rng.randint(-3, vmax) for _ in range(rng.randint(lo, hi))]


# Each template returns (code, input_source); constants are drawn from rng.
def _t_case_every_k(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(2, 4)
    code = (
        "def f(text):\n    result = ''\n    for i, ch in enumerate(text):\n"
        f"        if i % {k} == 0:\n            result += ch.upper()\n        else:\n            result += ch\n"
        "    return result"
    )
    return code, repr(_text(rng))


def _t_mod_insert(rng: random.Random) -> tuple[str, str]:
    k, m = rng.randint(2, 4), rng.randint(2, 5)
    r = rng.randint(0, k - 1)
    code = (
        "def f(nums):\n    out = []\n    for n in nums:\n"
        f"        if n % {k} == {r}:\n            out.append(n * {m})\n        else:\n            out.insert(0, n)\n"
        "    return out"
    )
    return code, repr(_nums(rng))


def _t_char_counts(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(2, 4)
    code = (
        "def f(s):\n    counts = {}\n    for ch in s:\n        counts[ch] = counts.get(ch, 0) + 1\n"
        f"    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:{k}]"
    )
    return code, repr(_text(rng, 6, 14, "abcdeab"))


def _t_split_reverse(rng: random.Random) -> tuple[str, str]:
    sep, joiner = rng.choice([",", "-", " ", ";"]), rng.choice(["+", "", "_", "|"])
    text = sep.join(_word(rng) for _ in range(rng.randint(2, 4)))
    if rng.random() < 0.5:
        text += sep
    code = f"def f(text, sep):\n    parts = text.split(sep)\n    return {joiner!r}.join(p[::-1] for p in parts if p)"
    return code, f"{text!r}, {sep!r}"


def _t_rotate(rng: random.Random) -> tuple[str, str]:
    code = "def f(items, k):\n    k = k % len(items)\n    return items[k:] + items[:k]"
    items = [_word(rng) for _ in range(rng.randint(2, 5))] if rng.random() < 0.5 else _nums(rng)
    return code, f"{items!r}, {rng.randint(-6, 9)}"


def _t_collatz(rng: random.Random) -> tuple[str, str]:
    a, cap = rng.choice([3, 5]), rng.randint(4, 12)
    code = (
        f"def f(n):\n    steps = 0\n    while n != 1 and steps < {cap}:\n"
        f"        n = n // 2 if n % 2 == 0 else {a} * n + 1\n        steps += 1\n    return (n, steps)"
    )
    return code, repr(rng.randint(2, 40))


def _t_prefix(rng: random.Random) -> tuple[str, str]:
    strip_c, part_c = rng.choice("xyz*"), rng.choice("aeo")
    prefix = _word(rng)[:3]
    text = (prefix if rng.random() < 0.6 else "") + strip_c * rng.randint(0, 2) + _word(rng) + strip_c
    code = (
        "def f(text, prefix):\n    if text.startswith(prefix):\n"
        f"        return text[len(prefix):].strip({strip_c!r})\n    return text.rpartition({part_c!r})"
    )
    return code, f"{text!r}, {prefix!r}"


def _t_pairs(rng: random.Random) -> tuple[str, str]:
    a, b, m = rng.randint(1, 3), rng.randint(1, 3), rng.randint(2, 5)
    code = f"def f(nums):\n    return [x * y for x in nums[:{a}] for y in nums[-{b}:] if (x + y) % {m} != 0]"
    return code, repr(_nums(rng, 3, 6))


def _t_invert(rng: random.Random) -> tuple[str, str]:
    code = (
        "def f(d):\n    inv = {}\n    for key, value in d.items():\n        inv.setdefault(value, []).append(key)\n"
        "    return {k: sorted(v) for k, v in sorted(inv.items())}"
    )
    d = {_word(rng): rng.randint(0, 3) for _ in range(rng.randint(2, 5))}
    return code, repr(d)


def _t_chain(rng: random.Random) -> tuple[str, str]:
    a = rng.choice("aeiou")
    b = rng.choice(["", "#", "AA", "o"])
    w, fill = rng.randint(4, 16), rng.choice("*-.")
    code = f"def f(text):\n    return text.swapcase().replace({a.upper()!r}, {b!r}).center({w}, {fill!r})"
    return code, repr(_text(rng, 3, 9, string.ascii_letters))


def _t_pop_append(rng: random.Random) -> tuple[str, str]:
    cap = rng.randint(2, 5)
    code = (
        "def f(nums, target):\n    nums = list(nums)\n    moves = 0\n"
        f"    while target in nums and moves < {cap}:\n        idx = nums.index(target)\n"
        "        nums.pop(idx)\n        nums.append(idx)\n        moves += 1\n    return nums"
    )
    nums = [rng.randint(0, 4) for _ in range(rng.randint(3, 7))]
    return code, f"{nums!r}, {rng.randint(0, 4)}"


def _t_range_sum(rng: random.Random) -> tuple[str, str]:
    k, m = rng.randint(1, 4), rng.randint(2, 4)
    code = f"def f(a, b):\n    return sum(i * {k} for i in range(a, b) if i % {m} == 0) - len(str(a * b))"
    a = rng.randint(-5, 10)
    return code, f"{a}, {a + rng.randint(0, 12)}"


def _t_zip(rng: random.Random) -> tuple[str, str]:
    code = "def f(keys, values):\n    return dict(zip(keys, values[::-1]))"
    keys = list(dict.fromkeys(_word(rng) for _ in range(rng.randint(2, 5))))
    return code, f"{keys!r}, {_nums(rng, 1, 6)!r}"


def _t_stride(rng: random.Random) -> tuple[str, str]:
    code = "def f(text, n):\n    return ''.join(text[(i * n) % len(text)] for i in range(len(text)))"
    return code, f"{_text(rng, 3, 9, string.ascii_lowercase)!r}, {rng.randint(2, 5)}"


def _t_sort_key(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(2, 4)
    code = f"def f(words):\n    return sorted(words, key=lambda w: (len(w) % {k}, w[::-1]))"
    return code, repr([_word(rng) for _ in range(rng.randint(3, 6))])


def _t_running(rng: random.Random) -> tuple[str, str]:
    cap = rng.randint(5, 20)
    code = (
        "def f(nums):\n    total, best = 0, []\n    for n in nums:\n        total += n\n"
        f"        if total > {cap}:\n            best.append(total)\n            total = 0\n    return best, total"
    )
    return code, repr(_nums(rng, 4, 9))


#: The templates, by name (each draws its constants and input from the given ``random.Random``).
TEMPLATES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "case_every_k": _t_case_every_k, "mod_insert": _t_mod_insert, "char_counts": _t_char_counts,
    "split_reverse": _t_split_reverse, "rotate": _t_rotate, "collatz": _t_collatz, "prefix": _t_prefix,
    "pairs": _t_pairs, "invert": _t_invert, "chain": _t_chain, "pop_append": _t_pop_append,
    "range_sum": _t_range_sum, "zip": _t_zip, "stride": _t_stride, "sort_key": _t_sort_key,
    "running": _t_running,
}


def _execute(code: str, input_src: str) -> object:
    """Run our own template code (trusted, loop-bounded) to get the output, as CRUXEval did by execution."""
    namespace: dict[str, object] = {}
    exec(compile(code, "<cruxeval-generated>", "exec"), namespace)  # noqa: S102 - generated by this module
    args = ast.literal_eval(f"({input_src},)")
    return namespace["f"](*args)  # type: ignore[operator]


def generate_items(num_items: int = 500, seed: int = 0) -> list[dict[str, str]]:
    """``num_items`` CRUXEval-format items (``code``, ``input``, ``output``, ``id``), cycling the templates.

    Items whose output does not survive ``ast.literal_eval(repr(output))`` (so that the answer is a literal,
    as CRUXEval requires) or whose code raises are skipped and redrawn.
    """
    if isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"num_items must be an int >= 1, got num_items={num_items!r}")
    rng = random.Random(seed)
    names = sorted(TEMPLATES)
    items: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    attempts = 0
    while len(items) < num_items:
        attempts += 1
        if attempts > 50 * num_items:
            raise ValueError(f"could not generate {num_items} distinct items; lower num_items")
        name = names[len(items) % len(names)]
        code, input_src = TEMPLATES[name](rng)
        if (code, input_src) in seen:
            continue
        try:
            output = _execute(code, input_src)
            output_src = repr(output)
            if ast.literal_eval(output_src) != output:
                continue
        except Exception:  # noqa: BLE001 - e.g. modulo by zero on a random input: redraw
            continue
        seen.add((code, input_src))
        items.append({"code": code, "input": input_src, "output": output_src, "id": f"gen_{len(items)}_{name}"})
    return items
