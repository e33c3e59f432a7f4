"""echorl record: JSONL (HF datasets, chat messages) and Minari outputs, reloaded and compared with a replay."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from echorl_agent.cli import main
from echorl_agent.eval.record import load_jsonl, load_minari, record_episodes

ENV = "EchoRL/MiniGrid-Empty-5x5-v0"


def _replay(env_id: str, seed: int, actions: list[str]) -> list[tuple]:
    env = gym.make(env_id)
    obs, info = env.reset(seed=seed)
    out = [(obs, info["admissible_actions"])]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append((obs, info["admissible_actions"], r, term, trunc))
    return out


def test_jsonl_round_trip_matches_a_replay_of_the_env(tmp_path):
    path = record_episodes(ENV, episodes=3, out=tmp_path, seed=1)
    rows = load_jsonl(path)
    assert [r["episode"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert row["success"] is True and row["agent"] == "expert"
        actions = [s["action"] for s in row["steps"]]
        ref = _replay(ENV, row["env_seed"], actions)
        assert [s["observation"] for s in row["steps"]] == [r[0] for r in ref[:-1]]
        assert [s["admissible_actions"] for s in row["steps"]] == [r[1] for r in ref[:-1]]
        assert [s["reward"] for s in row["steps"]] == [r[2] for r in ref[1:]]
        assert row["return"] == pytest.approx(sum(r[2] for r in ref[1:])) and row["return"] > 0.9
        assert all(s["action"] == s["expert_action"] for s in row["steps"])
        # chat for SFT: system task, then alternating user observation / assistant action
        msgs = row["messages"]
        assert msgs[0] == {"role": "system", "content": f"Task: {row['task']}"}
        assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * len(actions)
        assert [m["content"] for m in msgs[2::2]] == actions
        assert msgs[1]["content"].endswith("Admissible actions: " + ", ".join(ref[0][1]))


def test_jsonl_loads_with_hf_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = record_episodes("EchoRL/Arithmetic-v0", episodes=2, out=tmp_path)
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    rows = load_jsonl(path)
    assert ds.num_rows == 2 and ds["success"] == [True, True]
    assert ds[1]["messages"] == rows[1]["messages"]
    assert ds[0]["steps"][0]["admissible_actions"] == []  # free-text env


def test_random_agent_records_invalid_and_failed_episodes(tmp_path):
    rows = load_jsonl(record_episodes("EchoRL/Arithmetic-v0", agent="random", episodes=2, out=tmp_path))
    assert all(not r["success"] and r["return"] == 0.0 for r in rows)
    assert all(s["expert_action"] for r in rows for s in r["steps"])


def test_minari_round_trip(tmp_path):
    pytest.importorskip("minari")
    path = record_episodes(ENV, episodes=2, out=tmp_path, format="minari", seed=2)
    assert path == tmp_path / "echorl/MiniGrid-Empty-5x5/expert-v0"
    ds = load_minari(tmp_path, "echorl/MiniGrid-Empty-5x5/expert-v0")
    jsonl = load_jsonl(record_episodes(ENV, episodes=2, out=tmp_path / "j", seed=2))
    assert ds.total_episodes == 2 and ds.total_steps == sum(r["num_steps"] for r in jsonl)
    assert isinstance(ds.observation_space, gym.spaces.Text) and isinstance(ds.action_space, gym.spaces.Text)
    for ep, row in zip(ds.iterate_episodes(), jsonl, strict=True):
        assert list(ep.actions) == [s["action"] for s in row["steps"]]
        assert list(ep.observations[:-1]) == [s["observation"] for s in row["steps"]]
        assert list(ep.rewards) == pytest.approx([s["reward"] for s in row["steps"]])
        assert [json.loads(a) for a in ep.infos["admissible_actions"][:-1]] == [s["admissible_actions"] for s in row["steps"]]
        assert bool(ep.terminations[-1]) and bool(ep.infos["won"][-1])
    env = ds.recover_environment()
    assert env.spec.id == ENV


def test_cli_record_and_bad_input(tmp_path, capsys):
    assert main(["record", "--task", "EchoRL/Game24-v0", "--episodes", "2", "--out", str(tmp_path)]) == 0
    assert "wrote 2 episodes" in capsys.readouterr().out
    assert len(load_jsonl(tmp_path / "episodes.jsonl")) == 2
    with pytest.raises(SystemExit, match="did you mean"):
        main(["record", "--task", "EchoRL/Game42-v0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="episodes must be"):
        main(["record", "--task", "EchoRL/Game24-v0", "--episodes", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="format must be"):
        record_episodes("EchoRL/Game24-v0", format="parquet", out=tmp_path)
