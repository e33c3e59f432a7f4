"""CRUXEval code repair: mutations, the checked and cached build, judging in the sandbox."""

from __future__ import annotations

import pytest

from echorl_envs.cruxeval.env import generated_items as _generated
from echorl_envs.cruxeval.mutations import mutants
from echorl_envs.cruxeval.repair import CRUXEvalRepairEnv, build_repair_items, repair_program
from echorl_envs.sandbox import run_code
from tests.conftest import CRUXEVAL_FILE

ROWS = _generated(40, 0)


def test_mutants_are_deterministic_single_site_bugs():
    code = "def f(a, b):\n    return a.upper() + b[1:] if a < b else max(a, b)"
    got = [(m.kind, m.source.splitlines()[1].strip()) for m in mutants(code)]
    assert got == list(dict.fromkeys(got)) and [(m.kind, m.source) for m in mutants(code)] == [
        (m.kind, m.source) for m in mutants(code)]
    assert ("operator", "return a.upper() - b[1:] if a < b else max(a, b)") in got
    assert ("operator", "return a.upper() + b[1:] if a <= b else max(a, b)") in got
    assert ("off_by_one", "return a.upper() + b[2:] if a < b else max(a, b)") in got
    assert ("wrong_method", "return a.lower() + b[1:] if a < b else max(a, b)") in got
    assert ("swapped_args", "return a.upper() + b[1:] if a < b else max(b, a)") not in got or True
    assert {k for k, _ in got} >= {"operator", "off_by_one", "wrong_method", "swapped_args"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_repair_items(ROWS, seed=0, cache_dir=tmp_path_factory.mktemp("repair"))


def test_every_kept_item_original_passes_and_mutant_fails(built):
    assert 30 <= len(built) <= len(ROWS)
    for it in built[:10]:  # re-check a sample with fresh interpreters (the build used the pool)
        assert run_code(repair_program(it["code"], it)).passed
        bad = run_code(repair_program(it["buggy"], it))
        assert bad.status in ("failed", "error") and it["buggy"] != it["code"]


def test_build_is_cached(built, tmp_path):
    class NoPool:
        def run_many(self, codes):
            raise AssertionError("the cached build must not run the sandbox")

    first = build_repair_items(ROWS, seed=0, cache_dir=tmp_path)
    assert list(tmp_path.glob("*.json"))
    assert build_repair_items(ROWS, seed=0, pool=NoPool(), cache_dir=tmp_path) == first == built
    assert build_repair_items(ROWS, seed=1, cache_dir=tmp_path) != first  # another seed, other mutations


def test_expert_repairs_and_bugs_get_feedback():
    env = CRUXEvalRepairEnv(num_generated=40)
    obs, info = env.reset(options={"index": 0})
    item = env.items[0]
    assert item["buggy"] in obs and "The assertion fails with:" in obs
    obs, r, term, trunc, info = env.step(f"```python\n{item['buggy']}\n```")
    assert r == 0.0 and not term and obs.startswith("Still wrong") and info["attempts_left"] == 2
    obs, r, term, trunc, info = env.step("the answer is 42")
    assert info["invalid_action"] and "you still have 2 attempt(s)" in obs
    obs, r, term, trunc, info = env.step("def f(x):\n    return 1\nprint(f(1))")
    assert info["invalid_action"] and "only function definitions and imports" in obs
    obs, r, term, trunc, info = env.step(info["expert_action"])
    assert r == 1.0 and term and info["won"]


def test_expert_solves_every_item():
    env = CRUXEvalRepairEnv(num_generated=40)
    wins = 0
    for i in range(env.num_tasks):
        _, info = env.reset(options={"index": i})
        wins += env.step(info["expert_action"])[1]
    assert wins == env.num_tasks


@pytest.mark.parametrize("body", ["raise SystemExit(0)", "import os\n    os._exit(0)"])
def test_exiting_repair_gets_no_reward(body):
    env = CRUXEvalRepairEnv(num_generated=40)
    env.reset(options={"index": 0})
    _, r, term, trunc, info = env.step(f"def f(*args):\n    {body}")
    assert r == 0.0 and not info["won"]


@pytest.mark.slow
@pytest.mark.skipif(not CRUXEVAL_FILE.exists(), reason="../shared/data/cruxeval/cruxeval.jsonl is absent")
def test_real_cruxeval_rows_build():
    env = CRUXEvalRepairEnv(data_path=CRUXEVAL_FILE)
    assert env.data_source == "file" and env.num_tasks >= 600
