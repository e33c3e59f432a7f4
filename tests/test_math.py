"""Math environments: GSM8K gold answers, answer extraction, reasoning-gym pools, Game of 24 solver/checker."""

from __future__ import annotations

import builtins
import itertools
import json
from fractions import Fraction
from pathlib import Path

import gymnasium as gym
import pytest
import reasoning_gym

import echorl_envs  # noqa: F401  (registers the ids)
from echorl_envs.math import (
    ArithmeticEnv,
    ExpressionError,
    Game24Env,
    GSM8KEnv,
    GSMSymbolicEnv,
    check_expression,
    extract_answer,
    find_gsm8k_file,
    format_number,
    load_gsm8k,
    reaches,
    same_number,
    solvable_puzzles,
    solve,
)

GSM8K_FILE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
needs_gsm8k = pytest.mark.skipif(not GSM8K_FILE.exists(), reason="../shared/data/gsm8k/test.jsonl is absent")


def answer(env, text):
    """One step; returns (obs, reward, terminated, info)."""
    obs, r, term, trunc, info = env.step(text)
    assert not trunc
    return obs, r, term, info


# ----------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("$1,000.00", 1000),
        ("It costs $1,000.", 1000),
        ("\\boxed{42}", 42),
        ("so the total is \\boxed{\\$18.00}.", 18),
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{\\dfrac{-1}{2}}", Fraction(-1, 2)),
        ("The answer is 42.", 42),
        ("the answer is: 7 apples", 7),
        ("He needs 18 dollars", 18),
        ("It takes 45 minutes.", 45),
        ("12 x 2 = 24 students; 12 + 24 + 34 = 70", 70),
        ("16-3-4=9", 9),
        ("#### 42", 42),
        ("Step 1: 5 + 5 = 10\n#### 1,450,000", 1450000),
        ("The answer is -3.", -3),
        ("\u22127", -7),
        ("0.5", Fraction(1, 2)),
        (".25 of it", Fraction(1, 4)),
        ("3/8", Fraction(3, 8)),
        ("1/2, so", Fraction(1, 2)),
        ("62.50", Fraction(125, 2)),
        ("50%", 50),
        ("1e3", 1000),
        ("The answer is 18. Check: 9 * 2 = 18 and 4 - 1 = 3", 18),
        ("so the answer is therefore 42 dollars, since 6 * 7", 42),
        ("1, 2, 3", 3),
        ("\u20ac57 per hour", 57),
    ],
)
def test_extract_answer(text, value):
    assert extract_answer(text) == Fraction(value)


@pytest.mark.parametrize("text", ["", "hello", "no digits here.", "#### ", "\\boxed{}", "- . /"])
def test_extract_answer_none(text):
    assert extract_answer(text) is None


def test_extract_answer_rejects_absurd_numbers():
    with pytest.raises(ValueError, match="more than 64 digits"):
        extract_answer("9" * 5000)


def test_exact_comparison_is_rational():
    assert extract_answer("0.1") + extract_answer("0.2") == extract_answer("0.3")  # no float fuzz
    assert extract_answer("1000") == extract_answer("$1,000.00") == extract_answer("1e3")
    assert extract_answer("0.3333") != Fraction(1, 3)
    assert same_number("$1,000", "The answer is 1000.") and not same_number("999", 1000)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(42), "42"),
        (Fraction(-3), "-3"),
        (Fraction(5, 2), "2.5"),
        (Fraction(-1, 8), "-0.125"),
        (Fraction(1, 3), "1/3"),
        (Fraction(3, 100), "0.03"),
        (Fraction(0), "0"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text
    assert extract_answer(text) == value


# ----------------------------------------------------------------------------- GSM8K
@needs_gsm8k
def test_gsm8k_every_gold_answer_wins_and_wrong_loses():
    env = GSM8KEnv(data_path=GSM8K_FILE, max_attempts=1)
    assert env.num_tasks == 1319
    raw = [json.loads(line)["answer"] for line in GSM8K_FILE.read_text(encoding="utf-8").splitlines()]
    won = lost = 0
    for i, solution in enumerate(raw):
        gold_text = solution.rsplit("####", 1)[1].strip()  # as written in the file, e.g. "1,450,000"
        _, info = env.reset(options={"index": i})
        assert info["task_id"] == f"gsm8k/test/{i}"
        assert Fraction(info["expert_action"]) == Fraction(gold_text.replace(",", ""))
        _, r, term, info = answer(env, gold_text)
        won += r == 1.0 and term and info["won"]
        env.reset(options={"index": i})
        wrong = format_number(Fraction(gold_text.replace(",", "")) + 1)
        _, r, term, info = answer(env, f"The answer is {wrong}.")
        lost += r == 0.0 and term and not info["won"] and not info["invalid_action"]
    assert (won, lost) == (1319, 1319)


@needs_gsm8k
def test_gsm8k_official_worked_solutions_are_accepted():
    env = GSM8KEnv(data_path=GSM8K_FILE)
    rows = load_gsm8k(GSM8K_FILE)
    for i in range(0, len(rows), 7):
        env.reset(options={"index": i})
        assert answer(env, rows[i][1])[1] == 1.0


def _write_rows(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows), encoding="utf-8"
    )


ROWS = [
    ("Tom has 3 apples and buys 4 more. How many apples?", "3 + 4 = <<3+4=7>>7\n#### 7"),
    ("A car costs $1,200 less than $3,450. What does it cost?", "3450 - 1200 = 2250\n#### 2,250"),
    ("Janet\u2019s ducks: what is half of 5?", "5 / 2 = 2.5\n#### 2.5"),
]


def test_gsm8k_data_lookup_and_multi_turn(tmp_path, monkeypatch):
    monkeypatch.delenv("ECHORL_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        GSM8KEnv()
    for needle in ("data_path", "ECHORL_DATA_DIR", "download_gsm8k"):
        assert needle in str(err.value)

    _write_rows(tmp_path / "gsm8k" / "test.jsonl", ROWS)
    monkeypatch.setenv("ECHORL_DATA_DIR", str(tmp_path))
    assert find_gsm8k_file() == tmp_path / "gsm8k" / "test.jsonl"
    flat = tmp_path / "flat"
    _write_rows(flat / "gsm8k_test.jsonl", ROWS[:2])
    assert GSM8KEnv(data_path=flat).num_tasks == 2  # folder with gsm8k_<split>.jsonl, beats ECHORL_DATA_DIR

    env = gym.make("EchoRL/GSM8K-v0", max_attempts=2)
    obs, info = env.reset(options={"index": 2})
    assert "Janet's ducks" in obs and obs.isascii() and "2 attempts" in obs
    assert info["expert_action"] == "2.5" and info["attempts_left"] == 2
    obs, r, term, info = answer(env, "I am not sure.")
    assert (r, term, info["invalid_action"], info["attempts_left"]) == (0.0, False, True, 2)
    assert "no number found" in obs and info["task_id"] == "gsm8k/test/2"
    obs, r, term, info = answer(env, "The answer is 3.")
    assert (r, term, info["attempts_left"]) == (0.0, False, 1) and "Incorrect" in obs and "Try again" in obs
    obs, r, term, info = answer(env, "\\boxed{5/2}")
    assert (r, term, info["won"]) == (1.0, True, True)

    env.reset(options={"index": 1})
    answer(env, "2250.5")
    obs, r, term, info = answer(env, "$2,251")
    assert (r, term, info["won"]) == (0.0, True, False) and "expected answer was 2250" in obs
    obs, r, term, info = answer(env, "2250")
    assert info["invalid_action"] and r == 0.0  # the episode is over


def test_download_gsm8k_offline_via_file_url(tmp_path, monkeypatch):
    """The real download path (urllib + validation + atomic rename), fed from a local file:// URL."""
    import echorl_envs.math.gsm8k as gsm8k_module

    _write_rows(tmp_path / "src" / "test.jsonl", ROWS)
    monkeypatch.setattr(gsm8k_module, "GSM8K_URL", (tmp_path / "src").as_uri() + "/{split}.jsonl")
    path = gsm8k_module.download_gsm8k(tmp_path / "dest")
    assert path == tmp_path / "dest" / "gsm8k" / "test.jsonl"
    assert [g for _, _, g in load_gsm8k(path)] == ["7", "2250", "2.5"]
    assert GSM8KEnv(data_path=tmp_path / "dest").num_tasks == 3
    (tmp_path / "src" / "test.jsonl").write_text("not json\n", encoding="utf-8")
    assert gsm8k_module.download_gsm8k(tmp_path / "dest") == path  # an existing file is kept
    with pytest.raises(ValueError, match="not a GSM8K row"):
        gsm8k_module.download_gsm8k(tmp_path / "other")
    assert not any((tmp_path / "other" / "gsm8k").iterdir())  # neither the file nor a .part left behind


def test_gsm8k_bad_rows_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    _write_rows(bad, [ROWS[0], ("q", "no final marker")])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*####"):
        GSM8KEnv(data_path=bad)
    with pytest.raises(ValueError, match="split"):
        GSM8KEnv(data_path=bad, split="validation")
    with pytest.raises(ValueError, match="max_attempts must be an int >= 1, got max_attempts=0"):
        GSM8KEnv(data_path=bad, max_attempts=0)


# ----------------------------------------------------------------------------- reasoning-gym
@pytest.mark.parametrize(
    ("cls", "name"), [(GSMSymbolicEnv, "gsm_symbolic"), (ArithmeticEnv, "basic_arithmetic")]
)
def test_reasoning_gym_gold_answers(cls, name):
    env = cls(size=150, seed=3, max_attempts=1)
    ref = reasoning_gym.create_dataset(name, size=150, seed=3)
    assert env.num_tasks == 150
    for i in range(150):
        obs, info = env.reset(options={"index": i})
        entry = ref[i]
        assert Fraction(info["expert_action"]) == Fraction(entry["answer"])
        assert info["task_id"] == f"{name}/seed3/{i}" and obs.isascii()
        _, r, term, info = answer(env, f"Step by step... so the answer is {info['expert_action']}.")
        assert (r, term, info["won"]) == (1.0, True, True)
        assert info["rg_score"] == ref.score_answer(
            f"Step by step... so the answer is {entry['answer']}.", entry
        )
        env.reset(options={"index": i})
        _, r, term, info = answer(env, format_number(Fraction(entry["answer"]) - 1))
        assert (r, term, info["won"]) == (0.0, True, False)


def test_reasoning_gym_pool_is_seeded_and_configurable():
    a, b, c = ArithmeticEnv(seed=1), ArithmeticEnv(seed=1), ArithmeticEnv(seed=2)
    assert [a.item(i).question for i in range(20)] == [b.item(i).question for i in range(20)]
    assert [a.item(i).question for i in range(20)] != [c.item(i).question for i in range(20)]
    kw = {"max_terms": 3, "max_digits": 1, "operators": ("+",), "allow_parentheses": False}
    small = ArithmeticEnv(dataset_kwargs=kw)
    for i in range(30):
        expr = small.item(i).meta["entry"]["metadata"]["expression"]
        assert Fraction(small.item(i).answer) == sum(int(t) for t in expr.split(" + "))
    with pytest.raises(ValueError, match="did you mean 'max_terms'"):
        ArithmeticEnv(dataset_kwargs={"max_term": 3})
    with pytest.raises(ValueError, match="did you mean 'gsm_symbolic'"):
        GSMSymbolicEnv(dataset="gsm_symbolc")
    with pytest.raises(ValueError, match="size must be"):
        ArithmeticEnv(size=0)


# ----------------------------------------------------------------------------- Game of 24
def test_game24_pool_counts_and_solver_agreement():
    assert len(solvable_puzzles()) == 1362  # of the 1820 sorted 4-card hands over 1..13
    assert solve([1, 1, 1, 1]) is None and not reaches([1, 1, 1, 1])
    assert check_expression(solve([3, 3, 8, 8]), [3, 3, 8, 8]) == 24  # needs 8 / (3 - 8 / 3)
    for hand in itertools.combinations_with_replacement(range(1, 9), 4):  # the fast test == the search
        assert reaches(hand) == (solve(hand) is not None), hand
    for target in (0, 1, -2, 10):
        for hand in itertools.combinations_with_replacement(range(0, 6), 3):
            assert reaches(hand, target) == (solve(hand, target) is not None), (hand, target)


def test_game24_every_solver_answer_is_accepted():
    env = Game24Env(size=2000, max_attempts=1)
    assert env.num_tasks == 1362
    seen = set()
    for i in range(env.num_tasks):
        _, info = env.reset(options={"index": i})
        seen.add(info["task_id"])
        _, r, term, info = answer(env, info["expert_action"])
        assert (r, term, info["won"]) == (1.0, True, True), info
    assert len(seen) == 1362  # distinct puzzles


def test_game24_checker_never_evals(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("eval/exec/compile-to-code must not be used")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    assert check_expression("8 / (3 - 8 / 3)", [3, 3, 8, 8]) == 24
    assert check_expression("(1 + 2 + 3) * 4", [1, 2, 3, 4]) == 24


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os').system('echo hacked')", "function call"),
        ("(3).real + 3 + 8 + 8", "attribute access"),
        ("().__class__", "attribute access"),
        ("3 ** 3 ** 8 ** 8", "'**' (powers)"),
        ("9" * 40 + " + 3 + 8 + 8", "far too large"),
        ("3 // 3 + 8 + 8", "'//'"),
        ("3 % 3 + 8 * 8", "'%'"),
        ("x + 3 + 8 + 8", "a name"),
        ("lambda: 24", "lambda"),
        ("[3, 3, 8, 8]", "'List'"),
        ("'24'", "str literal"),
        ("3.0 * 8 + 3 - 8", "decimal number"),
        ("-3 + 3 + 8 + 8", "unary signs"),
        ("3 * 8", "exactly once"),
        ("3 * 8 + 3 - 3", "exactly once"),
        ("8 / (3 - 3) + 8", "divides by zero"),
        ("(3 + 3", "not a valid arithmetic expression"),
        ("3 + 3 + 8 + 8 = 22 = 24", "equation chain"),
        ("1 < 2", "comparison"),
        ("(" * 400, "too long"),
        ("", "empty"),
    ],
)
def test_game24_rejects_malformed_or_unsafe(text, reason):
    with pytest.raises(ExpressionError, match=__import__("re").escape(reason)):
        check_expression(text, [3, 3, 8, 8])


def test_game24_env_feedback_and_attempts():
    env = gym.make("EchoRL/Game24-v0", max_attempts=2)
    hand_index = next(
        i for i in range(env.unwrapped.num_tasks) if env.unwrapped.item(i).meta["numbers"] == (3, 3, 8, 8)
    )
    obs, info = env.reset(options={"index": hand_index})
    assert "3 3 8 8" in obs and info["task_id"] == "game24/3-3-8-8"
    obs, r, term, info = answer(env, "__import__('os').system('echo hacked')")
    assert info["invalid_action"] and r == 0.0 and not term and "function call" in obs
    assert info["attempts_left"] == 2
    obs, r, term, info = answer(env, "3 + 3 + 8 + 8")
    assert (r, term, info["attempts_left"]) == (0.0, False, 1) and "= 22 is not right" in obs
    obs, r, term, info = answer(env, "\\boxed{8 \u00f7 (3 \u2212 8 \u00f7 3)} = 24.")
    assert (r, term, info["won"]) == (1.0, True, True)


def test_game24_config_errors():
    with pytest.raises(ValueError, match="num_numbers must be an int in \\[2, 5\\], got num_numbers=9"):
        Game24Env(num_numbers=9)
    with pytest.raises(ValueError, match="reaches target"):
        Game24Env(num_numbers=2, max_number=2, target=1000)
    assert Game24Env(size=10, seed=1).num_tasks == 10
    a, b = Game24Env(size=50, seed=1), Game24Env(size=50, seed=2)
    assert [a.item(i).task_id for i in range(50)] != [b.item(i).task_id for i in range(50)]
