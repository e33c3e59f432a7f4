"""Game of 24: our own exact-rational solver, puzzle pool and safe expression checker.

Rules (the classic card game, as in Yao et al., 2023, "Tree of Thoughts"): combine the given numbers, each
exactly once, with ``+ - * /`` and parentheses to reach the target (24). Intermediate values may be
fractions (``8 / (3 - 8 / 3) = 24``), so every computation here uses :class:`fractions.Fraction`.

The checker never calls ``eval``: it parses with :func:`ast.parse` and walks the tree, accepting only
integer literals, the four binary operators and parentheses (which leave no node). Names, calls,
attribute access, ``**``, ``//``, ``%``, unary signs, floats, strings, comparisons and huge literals are
rejected with a message saying what was found.
"""

from __future__ import annotations

import ast
import itertools
import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from functools import cache, lru_cache
from typing import ClassVar

from echorl_envs.core import MAX_TEXT, InvalidAction
from echorl_envs.core.actions import describe_text
from echorl_envs.math.answers import format_number
from echorl_envs.math.base import MathAnswerEnv, MathItem, Verdict

__all__ = [
    "ExpressionError",
    "Game24Env",
    "check_expression",
    "evaluate_expression",
    "pool",
    "reaches",
    "solvable_puzzles",
    "solve",
]

#: Longest expression the checker parses (a 4-number answer needs about 25 characters).
MAX_EXPRESSION_CHARS = 300
#: Largest integer literal the checker accepts.
MAX_LITERAL = 10**6

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_FORBIDDEN = {
    ast.Pow: "'**' (powers)",
    ast.FloorDiv: "'//' (floor division)",
    ast.Mod: "'%' (modulo)",
    ast.MatMult: "'@'",
    ast.LShift: "'<<'",
    ast.RShift: "'>>'",
    ast.BitAnd: "'&'",
    ast.BitOr: "'|'",
    ast.BitXor: "'^'",
}


class ExpressionError(ValueError):
    """An answer that is not a well-formed, allowed Game-of-24 expression (message says why)."""


# ----------------------------------------------------------------------------- solver
def _combine(a: Fraction, b: Fraction):
    """All values of one operation on ``a`` and ``b`` (both orders for - and /), with the operator."""
    yield a + b, "+", False
    yield a * b, "*", False
    yield a - b, "-", False
    yield b - a, "-", True
    if b != 0:
        yield a / b, "/", False
    if a != 0:
        yield b / a, "/", True


def solve(numbers: Sequence[int], target: int = 24) -> str | None:
    """An expression using every number once that equals ``target`` exactly, or None if none exists.

    Exhaustive search over pairs: pick two values, replace them by one of their combinations, recurse
    (the standard 24-game search; states already shown unsolvable are memoised by their sorted values).
    The returned expression is fully parenthesised below the top level and passes :func:`check_expression`.
    """
    goal = Fraction(target)
    dead: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in dead:
            return None
        for i, j in itertools.combinations(range(len(items)), 2):
            (a, ea), (b, eb) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k != i and k != j]
            for value, op, swapped in _combine(a, b):
                left, right = (eb, ea) if swapped else (ea, eb)
                found = search([*rest, (value, f"({left} {op} {right})")])
                if found is not None:
                    return found
        dead.add(key)
        return None

    expr = search([(Fraction(n), str(n)) for n in numbers])
    if expr is not None and expr.startswith("(") and expr.endswith(")") and len(numbers) > 1:
        expr = expr[1:-1]
    return expr


@cache
def _reachable(values: tuple[Fraction, ...]) -> frozenset[Fraction]:
    """Every value an expression over the sorted multiset ``values`` (each used once) can take."""
    if len(values) == 1:
        return frozenset(values)
    out: set[Fraction] = set()
    for part in _splits(values):
        for a in _reachable(part[0]):
            for b in _reachable(part[1]):
                out.update(v for v, _, _ in _combine(a, b))
    return frozenset(out)


def _splits(values: tuple[Fraction, ...]):
    """Each split of ``values`` into two non-empty sorted parts, once (the first part holds values[0])."""
    n = len(values)
    seen = set()
    for mask in range(1, (1 << n) - 1, 2):  # odd masks: values[0] is in the first part
        a = tuple(values[i] for i in range(n) if mask >> i & 1)
        b = tuple(values[i] for i in range(n) if not mask >> i & 1)
        if (a, b) not in seen:
            seen.add((a, b))
            yield a, b


def reaches(numbers: Sequence[int], target: int = 24) -> bool:
    """Whether ``numbers`` (each once) can make ``target``: a fast exact test for building pools.

    Splits the numbers into two groups, takes the reachable values ``a`` of the smaller group and looks up
    the value ``b`` the other group would need for each operator (``a + b``: ``t - a``; ``a - b``:
    ``a - t``; ``b - a``: ``t + a``; ``a * b``: ``t / a``; ``b / a``: ``t * a``; ``a / b``: ``a / t``) in
    the other group's reachable set. :func:`solve` then finds the expression of the puzzles played.
    """
    t = Fraction(target)
    values = tuple(sorted(Fraction(n) for n in numbers))
    if len(values) == 1:
        return values[0] == t
    for a_part, b_part in _splits(values):
        small, big = sorted((a_part, b_part), key=len)
        rb = _reachable(big)
        for a in _reachable(small):
            needs = [t - a, a - t, t + a]
            if a != 0:
                needs += [t / a, t * a]
                if t != 0:
                    needs.append(a / t)
            elif t == 0:
                return True  # 0 * b == 0
            if any(x in rb for x in needs):
                return True
    return False


@lru_cache(maxsize=8)
def solvable_puzzles(
    num_numbers: int = 4, max_number: int = 13, target: int = 24
) -> tuple[tuple[int, ...], ...]:
    """Every sorted multiset of ``num_numbers`` numbers in 1..``max_number`` that reaches ``target``
    (1362 of the 1820 classic 4-card hands for 24), in lexicographic order."""
    hands = itertools.combinations_with_replacement(range(1, max_number + 1), num_numbers)
    return tuple(h for h in hands if reaches(h, target))


def pool(size: int, seed: int, num_numbers: int = 4, max_number: int = 13, target: int = 24):
    """A deterministic pool of ``size`` distinct solvable puzzles (a seeded shuffle of
    :func:`solvable_puzzles`); ``size`` is capped by the number of solvable hands."""
    hands = list(solvable_puzzles(num_numbers, max_number, target))
    random.Random(seed).shuffle(hands)
    return hands[:size]


# ----------------------------------------------------------------------------- checker
def _unwrap(t: str) -> str:
    t = t.strip().strip("`$").strip().rstrip(".").strip()
    if t.startswith("\\boxed{") and t.endswith("}"):
        t = t[len("\\boxed{") : -1].strip()
    return t


def _normalise(text: str, target: int) -> str:
    """Tolerated wrapping -> bare expression: backticks/dollars, a trailing period, ``\\boxed{}``,
    the multiplication/division/minus signs, and one ``= target`` on either side."""
    t = _unwrap(text)
    for sign, op in (
        ("\u00d7", "*"),
        ("\u00f7", "/"),
        ("\u2212", "-"),
        ("\\times", "*"),
        ("\\div", "/"),
        ("\\cdot", "*"),
    ):
        t = t.replace(sign, op)
    if "=" in t:
        sides = [s.strip() for s in t.split("=")]
        if len(sides) == 2 and _unwrap(sides[1]) == str(target):
            t = sides[0]
        elif len(sides) == 2 and _unwrap(sides[0]) == str(target):
            t = sides[1]
        else:
            raise ExpressionError(
                f"write one expression (optionally followed by '= {target}'), not an equation chain"
            )
        t = _unwrap(t)
    return t


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body, used)
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op not in _OPS:
            raise ExpressionError(f"{_FORBIDDEN.get(op, op.__name__)} is not allowed; use only + - * /")
        a, b = _walk(node.left, used), _walk(node.right, used)
        if op is ast.Add:
            return a + b
        if op is ast.Sub:
            return a - b
        if op is ast.Mult:
            return a * b
        if b == 0:
            raise ExpressionError("the expression divides by zero")
        return a / b
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int):
            kind = "a decimal number" if isinstance(v, float) else f"a {type(v).__name__} literal"
            raise ExpressionError(f"{kind} ({v!r:.20}) is not allowed; use the given integers")
        if v > MAX_LITERAL:
            raise ExpressionError(f"the literal {str(v)[:20]}... is far too large; use the given numbers")
        used.append(v)
        return Fraction(v)
    if isinstance(node, ast.UnaryOp):
        raise ExpressionError("unary signs are not allowed; use each given number as it is")
    what = {
        ast.Name: "a name",
        ast.Attribute: "attribute access",
        ast.Call: "a function call",
        ast.Subscript: "indexing",
        ast.Compare: "a comparison",
        ast.BoolOp: "a boolean operator",
        ast.Lambda: "a lambda",
    }.get(type(node), f"'{type(node).__name__}'")
    raise ExpressionError(f"{what} is not allowed; use only numbers, + - * / and parentheses")


def evaluate_expression(text: str, target: int = 24) -> tuple[Fraction, list[int]]:
    """Exact value of an answer expression and the integer literals it uses (left to right).

    Raises:
        ExpressionError: the text is too long, not an expression, or uses anything but integers,
            ``+ - * /`` and parentheses.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"the answer must be a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"the answer is too long ({len(text)} > {MAX_EXPRESSION_CHARS} characters)")
    t = _normalise(text, target)
    if not t:
        raise ExpressionError("the answer is empty")
    try:
        tree = ast.parse(t, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(f"not a valid arithmetic expression ({type(e).__name__})") from None
    used: list[int] = []
    try:
        value = _walk(tree, used)
    except RecursionError:
        raise ExpressionError("the expression is nested too deeply") from None
    return value, used


def check_expression(text: str, numbers: Sequence[int], target: int = 24) -> Fraction:
    """Validate an answer to the puzzle ``numbers`` and return its exact value.

    Raises:
        ExpressionError: unsafe/malformed (see :func:`evaluate_expression`) or not using each number of
            ``numbers`` exactly once.
    """
    value, used = evaluate_expression(text, target)
    if Counter(used) != Counter(numbers):
        want = " ".join(map(str, sorted(numbers)))
        got = " ".join(map(str, sorted(used))) or "none"
        raise ExpressionError(f"use each of the numbers {want} exactly once (the expression uses {got})")
    return value


# ----------------------------------------------------------------------------- environment
class Game24Env(MathAnswerEnv):
    """The Game of 24: reach the target from the given numbers with + - * / and parentheses.

    **Description**: a pool of ``size`` distinct solvable hands (a seeded shuffle of every solvable sorted
    hand of ``num_numbers`` numbers in 1..``max_number``; 1362 hands for the classic 4 cards 1-13 and 24).
    Solvability is decided by our exact search; each played puzzle's solution comes from :func:`solve`.

    **Observation**: the numbers, the target and the rules, then the number of attempts; after a wrong
    answer, "Incorrect: <expression> = <value> ..." and the puzzle again.

    **Actions**: one arithmetic expression, optionally followed by ``= 24`` (``\\boxed{}``, the
    U+00D7/U+00F7 signs, LaTeX ``\\times``/``\\div`` and a trailing period are tolerated). It is parsed
    with :mod:`ast`, never evaluated by Python: only integer literals, ``+ - * /`` and parentheses are
    allowed and each given number must be used exactly once. Anything else (names, calls, attribute
    access, ``**``, unary signs, floats, huge literals, division by zero, wrong numbers) is an invalid
    action with feedback (no attempt used).

    **Rewards**: 1 when the expression equals the target exactly (rational arithmetic), else 0.

    **Termination**: on success, or after ``max_attempts`` valid but wrong expressions; truncation by the
    registered ``max_episode_steps``.

    **Info**: ``task_id`` ("game24/<numbers>"), ``attempts_left``, ``expert_action`` (the oracle: our
    solver's expression for the puzzle).

    **Registered ids**: ``EchoRL/Game24-v0``.

    Args:
        size: pool size (``num_tasks``; capped at the number of solvable hands).
        seed: seed of the pool's shuffle.
        target: the value to reach.
        num_numbers: numbers per puzzle (2 to 5).
        max_number: numbers are drawn from 1..max_number (1 to 20).
        max_attempts: valid answers allowed per episode.
    """

    answer_hint: ClassVar[str] = "Answer with one expression, e.g. (a + b) * (c - d)."

    def __init__(
        self,
        size: int = 1000,
        seed: int = 0,
        target: int = 24,
        num_numbers: int = 4,
        max_number: int = 13,
        max_attempts: int = 3,
        render_mode: str | None = None,
        max_text_length: int = MAX_TEXT,
    ):
        super().__init__(max_attempts=max_attempts, render_mode=render_mode, max_text_length=max_text_length)
        for name, value, lo, hi in (
            ("size", size, 1, None),
            ("seed", seed, 0, None),
            ("target", target, -MAX_LITERAL, MAX_LITERAL),
            ("num_numbers", num_numbers, 2, 5),
            ("max_number", max_number, 1, 20),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < lo
                or (hi is not None and value > hi)
            ):
                rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise ValueError(f"{name} must be an int {rng}, got {name}={value!r}")
        self.size, self.seed, self.target = size, seed, target
        self.num_numbers, self.max_number = num_numbers, max_number
        self._hands = pool(size, seed, num_numbers, max_number, target)
        self._solutions: dict[int, str] = {}
        if not self._hands:
            raise ValueError(
                f"no hand of {num_numbers} numbers in 1..{max_number} reaches target={target}; "
                "change target, num_numbers or max_number"
            )

    @property
    def num_tasks(self) -> int:
        return len(self._hands)

    def _item(self, index: int) -> MathItem:
        hand = self._hands[index]
        expr = self._solutions.get(index)
        if expr is None:  # the search takes milliseconds; replays of a puzzle reuse its solution
            expr = solve(hand, self.target)
            assert expr is not None, f"pool hand {hand} was judged solvable"
            self._solutions[index] = expr
        nums = " ".join(map(str, hand))
        question = (
            f"Use the numbers {nums} to make {self.target}. Use each number exactly once, combined with "
            "+ - * / and parentheses (intermediate results may be fractions)."
        )
        return MathItem(
            task_id=f"game24/{'-'.join(map(str, hand))}",
            question=question,
            answer=expr,
            meta={"numbers": hand},
        )

    def _check(self, answer: str, item: MathItem) -> Verdict:
        try:
            value = check_expression(answer, item.meta["numbers"], self.target)
        except ExpressionError as e:
            raise InvalidAction(f"{describe_text(answer)}: {e}.") from None
        shown = f"{_normalise(answer, self.target)} = {format_number(value)}"
        return Verdict(value == self.target, shown)
