"""The evaluation runner, summaries, CLI and agent registry."""

from __future__ import annotations

import json

import pytest

import echorl_envs
from echorl_agent.cli import main as cli_main
from echorl_agent.eval.agents import availability, make_agent, spec
from echorl_agent.eval.report import summarize, wilson_interval, write_summary
from echorl_agent.eval.runner import BenchConfig, episode_seed, load_rows, run_bench, run_job

PREFERRED = ["EchoRL/MiniGrid-Empty-5x5-v0", "EchoRL/Game24-v0", "EchoRL/Arithmetic-v0", "EchoRL/BabyAI-GoToLocal-v0"]


def two_tasks() -> list[str]:
    ids = echorl_envs.env_ids()
    tasks = [t for t in PREFERRED if t in ids][:2]
    if len(tasks) < 2:
        pytest.skip("needs two of the MiniGrid/math ids registered")
    return tasks


def test_wilson_interval_matches_hand_computation():
    # p = 7/10, z = 1.96: centre = (0.7 + 0.19208) / 1.38416 = 0.64449; half = 1.96*sqrt(0.021 + 0.0096040)/1.38416
    lo, hi = wilson_interval(7, 10)
    assert lo == pytest.approx(0.396778, abs=1e-5)
    assert hi == pytest.approx(0.892208, abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(0, 5)
    assert lo == 0.0 and hi == pytest.approx(0.434482, abs=1e-5)


def test_summarize_groups_and_tokens():
    rows = [
        {"task": "t", "agent": "a", "success": True, "return": 1.0, "steps": 4, "seconds": 1.0,
         "prompt_tokens": 100.0, "cached_tokens": 80.0, "generated_tokens": 10.0},
        {"task": "t", "agent": "a", "success": False, "return": 0.0, "steps": 6, "seconds": 1.0,
         "prompt_tokens": 100.0, "cached_tokens": 70.0, "generated_tokens": 10.0},
    ]
    (s,) = summarize(rows, price_per_mtok=2.0)
    assert s["success"] == 0.5 and s["mean_steps"] == 5 and s["episodes_per_s"] == 1.0
    assert s["kv_reuse"] == pytest.approx(150 / 200)
    # cost = 2 $/Mtok * (200 - 150 + 20) tokens / 1e6, one success
    assert s["cost_per_success"] == pytest.approx(2.0 * 70 / 1e6)


def test_agent_registry_errors():
    with pytest.raises(ValueError, match="did you mean 'random'"):
        spec("randon")
    assert availability("random") is None and availability("expert") is None
    assert make_agent("random", "x").name == "random"


def test_bench_config_validation(tmp_path):
    tasks = two_tasks()
    with pytest.raises(ValueError, match="seeds must be an int >= 1, got seeds=0"):
        BenchConfig(tasks=tasks, agents=["random"], seeds=0, out=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="backend must be one of"):
        BenchConfig(tasks=tasks, agents=["random"], backend="dask", out=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="did you mean"):
        BenchConfig(tasks=[tasks[0] + "x"], agents=["random"], out=str(tmp_path)).validate()


def test_runner_resume_and_expert_upper_bound(tmp_path):
    tasks = two_tasks()
    cfg = BenchConfig(tasks=tasks, agents=["random", "expert"], seeds=2, episodes=2, workers=1, out=str(tmp_path))
    rows = run_bench(cfg, progress=False)
    assert len(rows) == 2 * 2 * 2 * 2
    cells = {(r["task"], r["agent"], r["seed"], r["episode"]) for r in rows}
    assert len(cells) == 16
    assert all(r["env_seed"] == episode_seed(r["seed"], r["episode"]) for r in rows)
    summary = {(s["task"], s["agent"]): s for s in summarize(rows)}
    for t in tasks:
        assert summary[(t, "expert")]["success"] == 1.0
        assert summary[(t, "expert")]["success"] >= summary[(t, "random")]["success"]
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["versions"]["gymnasium"] != "not installed" and meta["config"]["seeds"] == 2
    assert meta["models"] == {}  # no LLM agent in this run
    # Resume: nothing new runs; growing episodes runs only the new cells.
    n_lines = len((tmp_path / "episodes.jsonl").read_text().splitlines())
    rows2 = run_bench(cfg, progress=False)
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == n_lines and len(rows2) == 16
    cfg.episodes = 3
    rows3 = run_bench(cfg, progress=False)
    assert len(rows3) == 24 and len(load_rows(tmp_path)) == 24
    # Same cells give the same results (deterministic agents and seeds).
    again = run_job(tasks[0], "random", 1, [0, 1], {})
    old = sorted((r for r in rows if r["task"] == tasks[0] and r["agent"] == "random" and r["seed"] == 1),
                 key=lambda r: r["episode"])
    assert [(r["success"], r["return"], r["steps"]) for r in again] == [
        (r["success"], r["return"], r["steps"]) for r in old]
    paths = write_summary(summarize(rows3), tmp_path)
    assert "Success@1" in paths["md"].read_text()


def test_local_pool_matches_inline(tmp_path):
    tasks = two_tasks()
    a = run_bench(BenchConfig(tasks=tasks[:1], agents=["random"], seeds=2, episodes=2, workers=1,
                              out=str(tmp_path / "a")), progress=False)
    b = run_bench(BenchConfig(tasks=tasks[:1], agents=["random"], seeds=2, episodes=2, workers=2,
                              out=str(tmp_path / "b")), progress=False)
    key = lambda r: (r["seed"], r["episode"])  # noqa: E731
    assert [(r["return"], r["steps"]) for r in sorted(a, key=key)] == [(r["return"], r["steps"]) for r in sorted(b, key=key)]


def test_ray_backend_matches_local(tmp_path):
    pytest.importorskip("ray")
    tasks = two_tasks()
    common = dict(tasks=tasks[:1], agents=["random"], seeds=2, episodes=2)
    a = run_bench(BenchConfig(**common, workers=1, out=str(tmp_path / "local")), progress=False)
    b = run_bench(BenchConfig(**common, workers=2, backend="ray", out=str(tmp_path / "ray")), progress=False)
    key = lambda r: (r["seed"], r["episode"])  # noqa: E731
    fields = lambda r: (r["seed"], r["episode"], r["success"], r["return"], r["steps"], r["task_id"])  # noqa: E731
    assert [fields(r) for r in sorted(a, key=key)] == [fields(r) for r in sorted(b, key=key)]


def test_cli_list_and_bench(tmp_path, capsys):
    tasks = two_tasks()
    assert cli_main(["list"]) == 0
    assert tasks[0] in capsys.readouterr().out
    with pytest.raises(SystemExit, match="did you mean 'expert'"):
        cli_main(["bench", "--tasks", tasks[0], "--agents", "expet", "--out", str(tmp_path)])
    assert cli_main(["bench", "--tasks", tasks[0], "--agents", "random", "expert", "--seeds", "1",
                     "--episodes", "2", "--workers", "1", "--out", str(tmp_path), "--quiet"]) == 0
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "success.png").stat().st_size > 1000


def test_sb3_agent_trains_and_acts_through_the_same_wrappers(tmp_path):
    pytest.importorskip("echorl_envs.wrappers")
    if "EchoRL/MiniGrid-Empty-5x5-v0" not in echorl_envs.env_ids():
        pytest.skip("text MiniGrid not registered")
    from echorl_agent.eval.runner import skipped_pairs

    cfg = BenchConfig(tasks=["EchoRL/MiniGrid-Empty-5x5-v0"], agents=["ppo", "echoppo"], seeds=1, episodes=2,
                      workers=1, train_steps=256, out=str(tmp_path))
    rows = run_bench(cfg, progress=False)
    assert sorted((r["agent"], r["episode"]) for r in rows) == [("echoppo", 0), ("echoppo", 1), ("ppo", 0), ("ppo", 1)]
    for r in rows:
        assert r["steps"] >= 1 and r["invalid_actions"] == 0  # masked or positional slots map to real actions
    curve = tmp_path / "training" / "ppo" / "EchoRL_MiniGrid-Empty-5x5-v0" / "seed0" / "curve.csv"
    assert curve.exists() and curve.read_text().startswith("timesteps,success_rate")
    assert (curve.parent / "model.zip").exists()
    if "EchoRL/Game24-v0" in echorl_envs.env_ids():
        skip = skipped_pairs(BenchConfig(tasks=["EchoRL/Game24-v0"], agents=["ppo", "random"], out=str(tmp_path)))
        assert list(skip) == [("EchoRL/Game24-v0", "ppo")]
    skip = skipped_pairs(BenchConfig(tasks=["EchoRL/MiniGrid-Empty-5x5-v0"], agents=["ppo", "random"],
                                     exclude=["EchoRL/MiniGrid-*:pp*"], out=str(tmp_path)))
    assert skip == {("EchoRL/MiniGrid-Empty-5x5-v0", "ppo"): "excluded by 'EchoRL/MiniGrid-*:pp*'"}
    with pytest.raises(ValueError, match="exclude patterns"):
        BenchConfig(tasks=["EchoRL/MiniGrid-Empty-5x5-v0"], agents=["ppo"], exclude=["ppo"], out=str(tmp_path)).validate()


def test_a_failing_job_is_recorded_and_the_rest_still_runs(tmp_path):
    tasks = two_tasks()
    # an unknown agent option makes every job of that agent raise inside run_job
    cfg = BenchConfig(tasks=tasks[:1], agents=["random", "ppo"], seeds=1, episodes=1, workers=1, out=str(tmp_path),
                      agent_options={"ppo": {"no_such_option": 1}})
    if ("ppo" in cfg.agents) and echorl_envs.entry(tasks[0]).action_type != "choice":
        pytest.skip("needs a choice task")
    with pytest.warns(UserWarning, match="failed and was not counted"):
        rows = run_bench(cfg, progress=False)
    assert [r["agent"] for r in rows] == ["random"]
    (err,) = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert err["agent"] == "ppo" and "no_such_option" in err["error"]


def test_random_agent_searches_on_a_search_page_and_answers_free_text():
    from echorl_agent.eval.agents import RandomAgent

    a = RandomAgent()
    a.reset("x", "", {}, seed=3)
    assert a.act("", {"admissible_actions": [], "has_search_bar": True, "task": "red shoes"}) == "search[red shoes]"
    answers = {a.act("", {"admissible_actions": [], "task": "t"}) for _ in range(50)}
    assert all(0 <= int(x) <= 100 for x in answers) and len(answers) > 10
    assert a.act("", {"admissible_actions": ["a", "b"]}) in ("a", "b")
