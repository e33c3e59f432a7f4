"""Docs stay true: doctests of the package's docstrings and of docs/*.md run, and env pages match the code."""

from __future__ import annotations

import doctest
import importlib
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Modules whose doctests need an optional dependency (skipped when it is missing).
_NEEDS = {"echorl_envs.integrations.trl": "trl", "echorl_agent.eval.record": "datasets"}


def _modules_with_examples() -> list[str]:
    """Every module of both packages whose source holds a ``>>>`` example (found from the files, not a list)."""
    found = []
    for pkg in ("echorl_envs", "echorl_agent"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found)


#: Modules whose doctests already run in their own test files (test_echo_policy.py, test_wrappers.py).
_COVERED_ELSEWHERE = {"echorl_agent.policies", "echorl_agent.algorithms.echo_ppo", "echorl_envs.wrappers.encoders",
                      "echorl_envs.wrappers.actions", "echorl_envs.wrappers.observations", "echorl_envs.wrappers.sb3"}
MODULES = [m for m in _modules_with_examples() if m not in _COVERED_ELSEWHERE]
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
               if "\n>>> " in p.read_text(encoding="utf-8"))


def test_discovery_finds_the_documented_modules():
    assert _COVERED_ELSEWHERE <= set(_modules_with_examples())
    assert {"echorl_envs.integrations.trl", "echorl_agent.eval.record", "echorl_envs.sandbox.host"} <= set(MODULES)
    assert {"plug-new-env.md", "plug-sb3.md", "plug-datasets.md"} <= set(PAGES)


@pytest.mark.parametrize("module", MODULES)
def test_module_doctests(module):
    if module in _NEEDS:
        pytest.importorskip(_NEEDS[module])
    mod = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("page", PAGES)
def test_docs_page_doctests(page):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = doctest.testfile(str(DOCS / page), module_relative=False,
                                  optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_env_pages_match_the_code():
    sys.path.insert(0, str(DOCS))
    try:
        gen = importlib.import_module("gen_env_pages")
    finally:
        sys.path.remove(str(DOCS))
    import echorl_envs

    assert set(gen.FAMILIES) == {e.family for e in echorl_envs.ENVS}, "a family has no docs page"
    for path, text in gen.render_all().items():
        assert path.exists(), f"{path} missing: run docs/gen_env_pages.py"
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: run docs/gen_env_pages.py"
        for section in ("### Description", "### Observation", "### Actions", "### Rewards", "### Termination",
                        "## Registered ids"):
            assert section in text, f"{path.name} lacks {section!r}"


def test_docs_links_resolve():
    import re

    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#]+?\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().exists(), f"{page.name} links to missing {target}"
    assert "(docs/index.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
