"""Deterministic AST mutations that put one realistic bug into a CRUXEval function ``f``.

Each mutation kind walks the function's AST in source order and yields one mutant per site it can change:

* ``operator``: ``+``<->``-``, ``*``->``+``, ``//``->``/``... and comparisons ``<``<->``<=``, ``==``<->``!=``...;
* ``boolean``: ``and``<->``or``, dropping a ``not``;
* ``off_by_one``: an integer literal ``n`` -> ``n + 1`` (slice bounds, ``range`` arguments, indices, counts);
* ``wrong_method``: a method call replaced by its usual confusion (``upper``<->``lower``, ``startswith``<->
  ``endswith``, ``find``<->``rfind``, ``append``->``extend``, ``strip``->``lstrip``...);
* ``swapped_args``: the first two positional arguments of a call swapped.

:func:`mutants` lists every (kind, site, source) in a fixed order; the repair set picks, per item, the first
one (in an order seeded by the item id) that makes the item's assertion fail.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator

__all__ = ["Mutant", "mutants", "KINDS"]

KINDS = ("operator", "boolean", "off_by_one", "wrong_method", "swapped_args")

_BINOPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv,
    ast.Div: ast.Mult,
}
_CMPOPS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_METHODS = {
    "upper": "lower", "lower": "upper", "startswith": "endswith", "endswith": "startswith", "find": "rfind",
    "rfind": "find", "index": "rindex", "rindex": "index", "append": "extend", "strip": "lstrip",
    "lstrip": "rstrip", "rstrip": "lstrip", "split": "rsplit", "rsplit": "split", "isdigit": "isalpha",
    "isalpha": "isdigit", "isupper": "islower", "islower": "isupper", "title": "capitalize",
    "capitalize": "title", "pop": "remove", "insert": "append", "count": "find", "replace": "split",
    "join": "split", "keys": "values", "values": "keys", "items": "keys", "ljust": "rjust", "rjust": "ljust",
    "partition": "rpartition", "rpartition": "partition", "swapcase": "upper", "zfill": "center",
}


class Mutant(tuple):
    """``(kind, site, source)``: the mutation kind, its index among that kind's sites, the mutated code."""

    __slots__ = ()

    def __new__(cls, kind: str, site: int, source: str) -> Mutant:
        return super().__new__(cls, (kind, site, source))

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def site(self) -> int:
        return self[1]

    @property
    def source(self) -> str:
        return self[2]


def _sites(tree: ast.AST, kind: str) -> list[ast.AST]:
    out = []
    for node in ast.walk(tree):
        if kind == "operator" and (
            (isinstance(node, ast.BinOp) and type(node.op) in _BINOPS)
            or (isinstance(node, ast.AugAssign) and type(node.op) in _BINOPS)
            or (isinstance(node, ast.Compare) and type(node.ops[0]) in _CMPOPS)
        ):
            out.append(node)
        elif kind == "boolean" and (
            isinstance(node, ast.BoolOp) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))
        ):
            out.append(node)
        elif kind == "off_by_one" and (
            isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 1000
        ):
            out.append(node)
        elif kind == "wrong_method" and (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS
        ):
            out.append(node)
        elif kind == "swapped_args" and (
            isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2])
            and ast.dump(node.args[0]) != ast.dump(node.args[1])
        ):
            out.append(node)
    return out


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str) -> None:
        self.target, self.kind = target, kind

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        k = self.kind
        if k == "operator":
            if isinstance(node, (ast.BinOp, ast.AugAssign)):
                node.op = _BINOPS[type(node.op)]()
            else:
                node.ops = [_CMPOPS[type(node.ops[0])](), *node.ops[1:]]
        elif k == "boolean":
            if isinstance(node, ast.BoolOp):
                node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            else:
                return node.operand
        elif k == "off_by_one":
            node.value = node.value + 1
        elif k == "wrong_method":
            node.func.attr = _METHODS[node.func.attr]
        elif k == "swapped_args":
            node.args = [node.args[1], node.args[0], *node.args[2:]]
        return node


def mutants(code: str) -> Iterator[Mutant]:
    """Every single-site mutant of ``code`` whose source differs from the original, kind by kind."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return
    original = ast.unparse(tree)
    for kind in KINDS:
        for site in range(len(_sites(tree, kind))):
            clone = copy.deepcopy(tree)
            target = _sites(clone, kind)[site]
            new = _Replace(target, kind).visit(clone)
            ast.fix_missing_locations(new)
            try:
                src = ast.unparse(new)
                compile(src, "<mutant>", "exec")
            except (SyntaxError, ValueError, TypeError):
                continue
            if src != original:
                yield Mutant(kind, site, src)
