"""The CI subset of the slow suite (``tests/conftest.py::CI_SLOW_TESTS``) names tests that exist, and CI runs it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import echorl_envs
from tests.conftest import CI_SLOW_TESTS, _in_ci_subset

ROOT = Path(__file__).resolve().parents[1]


def test_every_ci_entry_names_an_existing_slow_test():
    for pattern in CI_SLOW_TESTS:
        path, _, rest = pattern.partition("::")
        name = re.split(r"[\[*]", rest)[0]
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        if name:
            assert callable(getattr(module, name, None)), f"{pattern}: no test {name!r} in {path}"
        ids = re.findall(r"\[(EchoRL/[^\]]+)\]", pattern)
        assert all(i in echorl_envs.env_ids() for i in ids), pattern


def test_matching_of_node_ids():
    assert _in_ci_subset("tests/test_examples.py::test_example_prints_what_it_demonstrates[train_sb3.py]")
    assert _in_ci_subset("tests/test_envs_registry.py::test_check_env[EchoRL/MiniWoB-choose-list-v0]")
    assert not _in_ci_subset("tests/test_envs_registry.py::test_check_env[EchoRL/MiniWoB-click-tab-v0]")
    assert not _in_ci_subset("tests/test_alfworld.py::test_expert_sweep_vs_random[PickCoolAndPlace]")


def test_ci_runs_the_default_suite_and_the_ci_subset():
    run = (ROOT / ".ci" / "run").read_text()
    assert "make test\n" in run and "make test-slow-ci" in run
    assert re.search(r"test-slow-ci:.*\n\t.*-m \"slow and ci\"", (ROOT / "Makefile").read_text())
