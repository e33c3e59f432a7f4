"""CRUXEval envs: the real 800 items judge 800/800 gold outputs and inputs, perturbed answers fail,
the offline generator is correct by construction, and the env's attempts/feedback work."""

from __future__ import annotations

import ast
import json
import os
import random
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import echorl_envs  # noqa: F401 - registers the ids
from echorl_envs.core import InvalidAction
from echorl_envs.cruxeval import (
    CRUXEvalEnv,
    check_program,
    gold_answer,
    judge,
    judge_many,
    load_cruxeval,
    parse_answer,
)
from echorl_envs.cruxeval.generator import TEMPLATES, generate_items
from echorl_envs.sandbox import SandboxConfig, SandboxPool

torch.set_num_threads(1)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cruxeval" / "cruxeval.jsonl"
needs_data = pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/cruxeval/cruxeval.jsonl is absent")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(wall_seconds=3.0, cpu_seconds=1), num_workers=2) as p:
        yield p


def perturb(item: dict, mode: str) -> str:
    """A wrong answer: the output with one more element/char, or the input with an extra argument."""
    if mode == "output":
        value = ast.literal_eval(item["output"])
        if isinstance(value, str):
            return repr(value + "#")
        return repr((value,))
    return (item["input"] + ", 0") if item["input"].strip() else "0"


def _check_gold_and_perturbed(items: list[dict], pool) -> None:
    for mode in ("output", "input"):
        gold = judge_many(items, [gold_answer(it, mode) for it in items], mode, pool)
        bad = [(it["id"], r.status, r.message) for it, r in zip(items, gold, strict=True) if not r.passed]
        assert not bad, f"{mode}: {len(bad)} gold answers rejected, e.g. {bad[:3]}"
        wrong = judge_many(items, [perturb(it, mode) for it in items], mode, pool)
        passed = [it["id"] for it, r in zip(items, wrong, strict=True) if r.passed]
        assert not passed, f"{mode}: perturbed answers accepted for {passed[:5]}"


@needs_data
def test_real_cruxeval_sample_gold_passes_perturbed_fails(pool):
    items = load_cruxeval(DATA)
    assert len(items) == 800 and items[0]["id"] == "sample_0"
    _check_gold_and_perturbed(random.Random(0).sample(items, 50), pool)


@needs_data
@pytest.mark.slow
def test_real_cruxeval_all_800_gold_outputs_and_inputs_pass(pool):
    _check_gold_and_perturbed(load_cruxeval(DATA), pool)


def test_generated_items_are_correct_by_construction(pool):
    items = generate_items(64, seed=3)
    assert items == generate_items(64, seed=3)
    assert items != generate_items(64, seed=4)
    assert len({(it["code"], it["input"]) for it in items}) == 64
    assert {it["id"].split("_", 2)[2] for it in items} == set(TEMPLATES)
    for it in items:
        assert set(it) == {"code", "input", "output", "id"}
        ast.literal_eval(it["output"])
    _check_gold_and_perturbed(items, pool)


def test_parse_answer_forms_and_refusals():
    assert parse_answer("[1, 2]", "output") == "[1, 2]"
    assert parse_answer("```python\n'ab'\n```", "output") == "'ab'"
    assert parse_answer("assert f('x') == {'a': 1}", "output") == "{'a': 1}"
    assert parse_answer("set()", "output") == "set()"
    assert parse_answer("-3", "output") == "-3"
    assert parse_answer("f('abc', 3)", "input") == "'abc', 3"
    assert parse_answer("'abc', 3", "input") == "'abc', 3"
    assert parse_answer("assert f([1, 2]) == 3", "input") == "[1, 2]"
    assert parse_answer("[6, 4], (lambda x: x.reverse())", "input") == "[6, 4], (lambda x: x.reverse())"
    refused = [
        ("f('abc')", "output"),  # CRUXEval's harness zeroes an output that calls f
        ("x", "output"),
        ("sorted([2, 1])", "output"),
        ("__import__('os')._exit(0)", "output"),
        ("[1, 2", "output"),
        ("", "output"),
        ("", "input"),
        ("setattr(f, '__code__', (lambda *a: 1).__code__)", "input"),
        ("(lambda: 0).__globals__", "input"),
        ("eval('1')", "input"),
        ("1) or (2", "input"),
    ]
    for answer, mode in refused:
        with pytest.raises(InvalidAction):
            parse_answer(answer, mode)
    with pytest.raises(ValueError, match="mode"):
        parse_answer("1", "both")


def test_judge_statuses(pool):
    item = {"code": "def f(s):\n    return s[::-1]", "input": "'abc'", "output": "'cba'", "id": "t"}
    assert judge(item, "'cba'", "output").status == "passed"
    assert judge(item, "'abc'", "output").status == "failed"
    assert judge(item, "'cba'", "input").status == "failed"
    assert judge(item, "'abc'", "input").status == "passed"
    r = judge(item, "f('abc')", "output")
    assert r.status == "error" and "invalid answer" in r.message
    loop = {"code": "def f(n):\n    while n:\n        pass", "input": "1", "output": "None", "id": "l"}
    assert judge(loop, "None", "output", pool).status == "timeout"


def test_env_expert_wins_and_feedback():
    env = gym.make("EchoRL/CRUXEval-O-v0")
    obs, info = env.reset(seed=0, options={"index": 7})
    assert "assert f(" in obs and "== ??" in obs and info["task_id"].startswith("gen_7_")
    assert info["attempts_left"] == 3
    obs, r, term, trunc, info = env.step(info["expert_action"])
    assert (r, term, info["won"], info["judge_status"]) == (1.0, True, True, "passed")
    env.close()


def test_env_attempts_invalid_answers_and_reveal(tmp_path):
    item = {"code": "def f(a, b):\n    return a * b", "input": "3, 4", "output": "12", "id": "mul"}
    path = tmp_path / "cruxeval.jsonl"
    path.write_text(json.dumps(item) + "\n")
    env = CRUXEvalEnv(mode="output", data_path=tmp_path, max_attempts=2)
    assert env.num_tasks == 1 and env.data_source == "file"
    obs, info = env.reset(seed=1)
    assert "assert f(3, 4) == ??" in obs and info["expert_action"] == "12"
    obs, r, term, _, info = env.step("f(3, 4)")
    assert info["invalid_action"] and r == 0.0 and not term and "you still have 2 attempt(s)" in obs
    obs, r, term, _, info = env.step("13")
    assert (r, term, info["attempts_left"], info["judge_status"]) == (0.0, False, 1, "failed")
    assert "1 attempt(s) left" in obs
    obs, r, term, _, info = env.step("'12'")
    assert (r, term, info["won"]) == (0.0, True, False)
    assert "A correct answer was: 12" in obs

    env_i = CRUXEvalEnv(mode="input", data_path=path)
    obs, info = env_i.reset(seed=0)
    assert "assert f(??) == 12" in obs
    obs, r, term, _, info = env_i.step("2, 6")  # any input that gives the output is right
    assert (r, term, info["won"]) == (1.0, True, True)


def test_env_data_sources(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="data_path"):
        CRUXEvalEnv(data_path=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="mode"):
        CRUXEvalEnv(mode="outputs")
    with pytest.raises(ValueError, match="max_attempts"):
        CRUXEvalEnv(max_attempts=0)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"code": "def f(): pass"}) + "\n")
    with pytest.raises(ValueError, match="missing"):
        load_cruxeval(tmp_path / "bad.jsonl")
    gen = CRUXEvalEnv(num_generated=40)
    assert gen.num_tasks == 40 and gen.data_source == "generated"
    if DATA.is_file():
        monkeypatch.setenv("ECHORL_DATA_DIR", str(DATA.parents[1]))
        assert CRUXEvalEnv().num_tasks == 800


# ---- reward hacking (issue 15) --------------------------------------------------------------------------------

_B = "(x for x in ()).gi_frame.f_builtins"
HACKS = [
    "(x for x in ()).throw(SystemExit)",
    f"{_B}['__import__']('sys').exit(0)",
    f"{_B}['__import__']('os')._exit(0)",
    f"{_B}['__import__']('os').write(3, b'{{\"status\": \"passed\"}}\\n' * 20)",
    f"{{}}[{_B}['open']('/etc/passwd').read()]",
]


def _hack_items() -> list[dict]:
    """50 real CRUXEval items when ../shared/data (or $ECHORL_DATA_DIR) holds them, else generated ones."""
    env_dir = os.environ.get("ECHORL_DATA_DIR")
    real = DATA if DATA.is_file() else Path(env_dir or "/nonexistent") / "cruxeval" / "cruxeval.jsonl"
    items = load_cruxeval(real) if real.is_file() else generate_items(50, seed=5)
    return random.Random(15).sample(items, 50)


@pytest.mark.parametrize("hack", HACKS)
def test_hacks_earn_nothing_from_the_parser_or_the_sandbox(pool, hack):
    """Each hack is refused by parse_answer; put straight into the assertion (parser bypassed), the sandbox
    still never calls it a pass, and wrong answers judged right after still fail."""
    items = _hack_items()
    with pytest.raises(InvalidAction):
        parse_answer(hack, "input")
    results = pool.run_many([check_program(it, hack, "input") for it in items])
    assert [r.status for r in results if r.passed] == []
    wrong = judge_many(items[:3], [perturb(it, "input") for it in items[:3]], "input", pool)
    assert [r.passed for r in wrong] == [False, False, False]


def test_env_forged_results_do_not_leak_into_later_steps(tmp_path):
    """The issue's reproduction through two envs of one process: forge, then wrong answers must score 0."""
    items = [{"code": "def f(x):\n    return x + 1", "input": "1", "output": "2", "id": f"i{i}"} for i in range(2)]
    path = tmp_path / "cruxeval.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    forge = "[os.write(fd, b'{\"status\": \"passed\"}\\n' * 20) for fd in range(3, 9)]"
    program = check_program(items[0], forge, "input").replace("assert", "import os\nassert", 1)
    a = CRUXEvalEnv(mode="input", data_path=path, max_attempts=3)
    b = CRUXEvalEnv(mode="input", data_path=path, max_attempts=3)
    from echorl_envs.sandbox import shared_pool

    assert not shared_pool(a.sandbox_config).run(program).passed
    for env in (a, b):
        env.reset(seed=0)
        rewards = [env.step(answer)[1] for answer in ("5", "7", "9")]
        assert rewards == [0.0, 0.0, 0.0]
