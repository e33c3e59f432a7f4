"""The import graph keeps its floors (docs/architecture.md): no cycles, and every arrow points down.

The graph is read from the source with :mod:`ast`, so imports inside functions (the lazy ones that hide cycles from
an ``import`` at start-up) count exactly like module-level ones, and so does ``importlib.import_module("a.b")`` with a
literal name, a lazy export table (``_EXPORTS = {"Name": "submodule"}`` read by ``import_module(f"pkg.{...}")``), and
a ``"package.module:attr"`` entry point string (the env and agent registries). An edge ``a -> b`` means module ``a``
imports module ``b`` (``from pkg import name`` points at the submodule ``pkg.name`` when that is a module, else at
``pkg``).

Known violations that live in files another change is rewriting are listed in :data:`ALLOWED`, each with the
reason; the tests fail on anything not listed, and on a listed edge that no longer exists (so the list only shrinks).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("echorl_envs", "echorl_agent")

#: Floors of the library, lowest first: a module may import modules on its own floor or below, never above.
#: A name stands for the module and everything under it; the longest matching name decides.
FLOORS: list[tuple[str, ...]] = [
    ("echorl_envs",),
    ("echorl_agent.config", "echorl_agent.argtypes", "echorl_agent.kernels"),
    ("echorl_agent.llm",),
    ("echorl_agent.replay", "echorl_agent.policies", "echorl_agent.callbacks",
     "echorl_agent.priors", "echorl_agent.experience", "echorl_agent.algorithms"),
    ("echorl_agent.llm_rl",),
    ("echorl_agent.agents",),
    ("echorl_agent.eval",),
    ("echorl_agent.cli", "echorl_agent"),  # the package facade re-exports the SB3 parts; nothing imports it back
]

#: What the inference engine may import from the library: itself and the kernels (never the envs, never an agent).
ENGINE = "echorl_agent.llm"
ENGINE_MAY_IMPORT = ("echorl_agent.llm", "echorl_agent.kernels")

#: Known edges that break a rule, to be emptied by the change that owns the file (edge -> why it is still here).
ALLOWED: dict[tuple[str, str], str] = {
}


# ----------------------------------------------------------------------------------------------- the graph
def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    """The longest prefix of dotted ``name`` that is one of our modules (None for third-party names)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


_ENTRY_POINT = re.compile(r"^((?:echorl_envs|echorl_agent)(?:\.\w+)*):\w+$")


def _export_table(tree: ast.Module) -> list[str]:
    """The submodule names of a module-level ``_EXPORTS = {"Name": "submodule", ...}`` table."""
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            return [v.value for v in node.value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def _targets(module: str, path: Path, node: ast.AST, exports: list[str]) -> Iterator[str]:
    """Dotted names ``node`` imports (absolute; relative imports resolved against ``module``)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        for a in node.names:
            yield f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
          and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        yield node.args[0].value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
          and node.args and isinstance(node.args[0], ast.JoinedStr) and node.args[0].values
          and isinstance(node.args[0].values[0], ast.Constant)):
        yield from (str(node.args[0].values[0].value) + e for e in exports)  # the lazy export table
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENTRY_POINT.match(node.value):
        yield _ENTRY_POINT.match(node.value).group(1)


def _edges() -> dict[tuple[str, str], int]:
    """Every import edge between our modules, and to ``benchmarks``/``tests``/``examples`` (edge -> line)."""
    edges: dict[tuple[str, str], int] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exports = _export_table(tree)
        for node in ast.walk(tree):
            for name in _targets(module, path, node, exports):
                target = _known(name) or (name.split(".")[0] if name.split(".")[0] in
                                          ("benchmarks", "tests", "examples") else None)
                if target is not None and target != module:
                    edges.setdefault((module, target), node.lineno)
    return edges


EDGES = _edges()


def _where(edge: tuple[str, str]) -> str:
    return f"{MODULES[edge[0]].relative_to(ROOT)}:{EDGES[edge]} imports {edge[1]}"


def _floor(module: str) -> int:
    best, floor = -1, -1
    for i, names in enumerate(FLOORS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, floor = len(n), i
    assert floor >= 0, f"{module} is on no floor: add it to FLOORS (and to docs/architecture.md)"
    return floor


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {m: [] for m in MODULES}
    for a, b in edges:
        if b in graph:
            graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(graph[w])))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return out


def _violations(rule) -> list[str]:
    return [_where(e) for e in sorted(EDGES) if rule(*e) and e not in ALLOWED]


# ----------------------------------------------------------------------------------------------- the tests
def test_walker_sees_lazy_and_relative_imports():
    # a function-level import (agents.incompatibility imports echorl_envs inside the function)...
    assert ("echorl_agent.eval.agents", "echorl_envs") in EDGES
    # ...a lazy export table, a registry entry point string, and the package facade's eager imports
    assert ("echorl_agent.llm", "echorl_agent.llm.engine.llm_engine") in EDGES
    assert ("echorl_agent.eval.agents", "echorl_agent.agents.sb3") in EDGES
    assert ("echorl_agent", "echorl_agent.replay") in EDGES
    # a cycle made of lazy imports only is found
    assert _cycles({("echorl_envs.core", "echorl_envs.core.base"), ("echorl_envs.core.base", "echorl_envs.core")})


def test_no_import_cycles():
    cycles = _cycles(set(EDGES) - set(ALLOWED))
    assert not cycles, "import cycles (function-level imports included): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_envs_never_import_the_agent_package():
    bad = _violations(lambda a, b: a.startswith("echorl_envs") and b.split(".")[0] == "echorl_agent")
    assert not bad, "echorl_envs must not import echorl_agent:\n" + "\n".join(bad)


def test_engine_imports_only_itself_and_the_kernels():
    bad = _violations(lambda a, b: (a == ENGINE or a.startswith(ENGINE + "."))
                      and not any(b == n or b.startswith(n + ".") for n in ENGINE_MAY_IMPORT))
    assert not bad, "the inference engine (echorl_agent/llm/) must not import envs, agents or learners:\n" + "\n".join(bad)


def test_library_never_imports_benchmarks_tests_or_examples():
    bad = _violations(lambda a, b: b in ("benchmarks", "tests", "examples"))
    assert not bad, "library code imports benchmarks/tests/examples:\n" + "\n".join(bad)


def test_arrows_point_down_the_floors():
    bad = _violations(lambda a, b: b in MODULES and _floor(b) > _floor(a))
    assert not bad, "upward imports (see FLOORS / docs/architecture.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("edge", sorted(ALLOWED), ids="->".join)
def test_allowed_edges_still_exist(edge):
    assert edge in EDGES, f"{edge} is gone: remove it from ALLOWED"


# ----------------------------------------------------------------------------------------------- one home per name
#: The package facade re-exports the SB3 parts and ``LLMPolicy``/``LLMPPO`` (``from echorl_agent import EchoPPO``, as
#: ``from stable_baselines3 import PPO``); every other public name is exported by exactly one package.
FACADE = "echorl_agent"


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


def _export_dict(tree: ast.Module) -> dict[str, str]:
    """The module-level lazy export table ``{"Name": "submodule"}`` (empty when there is none)."""
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values, strict=True)}
    return {}


def _public(module: str) -> list[str]:
    """The names of ``module.__all__`` (a literal list, plus the keys of ``_EXPORTS`` when ``__all__`` uses it)."""
    tree = _tree(module)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if any(isinstance(n, ast.Name) and n.id == "_EXPORTS" for n in ast.walk(node.value)):
                names += list(_export_dict(tree))
            return names
    return []


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those inside ``if``/``try``/``with`` blocks (not inside functions)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *(h.body for h in getattr(node, "handlers", []))):
                yield from _top_level(block)


def _origin(module: str, name: str, seen: tuple[str, ...] = ()) -> str | None:
    """The module that defines ``name`` as ``module`` exposes it, following ``from x import name`` and the lazy
    export table (a submodule ``name`` is its own origin); None when ``module`` does not have ``name``."""
    if module not in MODULES or module in seen:
        return None
    if f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    tree = _tree(module)
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return module
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == name  # ``A = ...`` and ``A, B = ...``
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                for t in ast.walk(target)):
            return module
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if (a.asname or a.name) == name:
                    return _origin(node.module, a.name, (*seen, module))
    table = _export_dict(tree)
    return _origin(f"{module}.{table[name]}", name, (*seen, module)) if name in table else None


def _packages() -> list[str]:
    return [m for m, path in MODULES.items() if path.name == "__init__.py"]


def test_origin_follows_imports_and_the_lazy_export_table():
    assert _origin("echorl_agent.llm", "LLMEngine") == "echorl_agent.llm.engine.llm_engine"
    assert _origin("echorl_agent.llm", "SamplingParams") == "echorl_agent.llm.engine.config"
    assert _origin("echorl_agent.agents", "Agent") == "echorl_agent.agents.base"
    assert _origin("echorl_envs.core", "cache_root") == "echorl_envs.core.cache"
    assert _origin("echorl_agent.llm.engine", "LLMEngine") is None
    assert "LLMEngine" in _public("echorl_agent.llm") and "Agent" in _public("echorl_agent.agents")


def test_every_public_name_has_one_home():
    homes: dict[tuple[str, str], list[str]] = {}
    for pkg in _packages():
        if pkg == FACADE:
            continue
        for name in _public(pkg):
            origin = _origin(pkg, name)
            assert origin is not None, f"{pkg}.__all__ lists {name!r}, which {pkg} neither defines nor imports"
            homes.setdefault((origin, name), []).append(pkg)
    dup = {f"{o}.{n}": pkgs for (o, n), pkgs in homes.items() if len(pkgs) > 1}
    assert not dup, f"names exported by more than one package (export each from one): {dup}"
    assert all(_origin(FACADE, name) for name in _public(FACADE))


def _changelog_moves() -> list[tuple[str, str]]:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    section = text.split("### 0.x → 1.0 moved modules", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", section, re.M)


def test_changelog_lists_each_moved_path_once_old_gone_new_resolves():
    import importlib

    moves = _changelog_moves()
    assert len(moves) >= 40 and len({old for old, _ in moves}) == len(moves)
    for old, new in moves:
        # the new path: a module of ours, or a name its module defines or imports
        parent, _, name = new.rpartition(".")
        assert new in MODULES or _origin(parent, name) is not None, f"CHANGELOG: {new} does not resolve"
        # the old path: no module of that name and no attribute either (no import hook, no shim, no re-export)
        assert old not in MODULES, f"{old} still exists"
        parent, _, name = old.rpartition(".")
        if parent in MODULES and _origin(parent, name) is not None:
            pytest.fail(f"{old} still resolves (to {_origin(parent, name)})")
    # ...and nothing answers for an old name at run time: no import hook of ours, no lazy re-export
    import sys

    for pkg in ("echorl_envs", "echorl_agent", "echorl_agent.llm", "echorl_agent.priors"):
        assert not hasattr(importlib.import_module(pkg), "MOVED_MODULES"), pkg
    assert not [f for f in sys.meta_path if type(f).__module__.split(".")[0] in PACKAGES]
    with pytest.raises(AttributeError):
        importlib.import_module("echorl_agent.llm").ReActAgent  # noqa: B018
    with pytest.raises(AttributeError):
        importlib.import_module("echorl_agent.priors").CachedScoringAgent  # noqa: B018


#: The wings of ``echorl_envs`` that are infrastructure; every other subpackage is one env family.
ENV_WINGS = ("core", "sandbox", "service", "wrappers", "integrations")


def _env_family(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "echorl_envs" and len(parts) > 1 and parts[1] not in ENV_WINGS else None


def test_env_families_are_siblings():
    # a family imports core/ and the wings it needs, never another family; core/ imports no family
    assert (_env_family("echorl_envs.textworld.env"), _env_family("echorl_envs.core.base")) == ("textworld", None)
    bad = _violations(lambda a, b: a.startswith("echorl_envs.") and _env_family(b) not in (None, _env_family(a)))
    assert not bad, "an env family is imported by another family or by a wing:\n" + "\n".join(bad)


def test_every_import_of_our_names_resolves():
    """``from echorl_agent.x import name`` anywhere (library, tests, benchmarks, examples; function-level imports
    included) names a module of ours or a name its module defines or imports: a name that moved is caught here, at
    once, not when the one test that imports it runs (a branch merged after a move still using the old path)."""
    broken = []
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    files += [p for d in ("tests", "benchmarks", "examples") for p in sorted((ROOT / d).rglob("*.py"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level
                    and node.module.split(".")[0] in PACKAGES):
                continue
            for a in node.names:
                if a.name != "*" and _origin(node.module, a.name) is None:
                    broken.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}")
    assert not broken, "imports of names that do not exist there:\n" + "\n".join(broken)
