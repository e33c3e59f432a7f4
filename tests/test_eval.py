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


def test_benchmark_table_cells_and_seed_study_records(tmp_path):
    from echorl_agent.eval.stats import bootstrap_text, read_jsonl, success_text

    assert success_text(7, 10) == "0.70 [0.40, 0.89]" and success_text(7, 10, digits=3) == "0.700 [0.397, 0.892]"
    with pytest.raises(ValueError, match="n must be > 0"):
        success_text(0, 0)
    assert bootstrap_text([0.5, 0.5]) == "0.500 [0.500, 0.500]"  # no spread: the interval is the mean
    path = tmp_path / "seeds.jsonl"
    assert read_jsonl(path) == []  # a study not started yet
    path.write_text('{"seed": 1}\n\n{"seed": 2}\n')
    assert read_jsonl(path) == [{"seed": 1}, {"seed": 2}]


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


def test_ray_backend_runs_its_workers_at_the_local_backends_priority(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import os

    from echorl_agent.eval import runner

    # Ray's default worker niceness is 15; a benchmark's workers must not yield the CPU to everything else
    monkeypatch.setattr(runner, "run_job", lambda *job: [{"job": job, "nice": os.nice(0)}])
    cfg = BenchConfig(tasks=two_tasks()[:1], agents=["random"], workers=1, backend="ray", out=str(tmp_path))
    got = list(runner._execute_ray(cfg, [("a",), ("b",)], {}))
    assert sorted((job, rows[0]["job"], rows[0]["nice"]) for job, rows in got) == [
        (("a",), ("a", {}), os.nice(0)), (("b",), ("b", {}), os.nice(0))]


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
    # eval_mode="both" (default): each trained policy plays every instance greedily and by sampling
    assert sorted((r["agent"], r["mode"], r["episode"]) for r in rows) == [
        (a, m, e) for a in ("echoppo", "ppo") for m in ("deterministic", "stochastic") for e in (0, 1)]
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
    from echorl_agent.agents import RandomAgent

    a = RandomAgent()
    a.reset("x", "", {}, seed=3)
    assert a.act("", {"admissible_actions": [], "has_search_bar": True, "task": "red shoes"}) == "search[red shoes]"
    answers = {a.act("", {"admissible_actions": [], "task": "t"}) for _ in range(50)}
    assert all(0 <= int(x) <= 100 for x in answers) and len(answers) > 10
    assert a.act("", {"admissible_actions": ["a", "b"]}) in ("a", "b")


# --- paired statistics, eval modes, budgets, reproducibility, README drift (issue 13) ---------------------------


def test_mcnemar_exact_and_paired_bootstrap_hand_values():
    from echorl_agent.eval.stats import mcnemar_exact, paired_bootstrap

    # 5 discordant pairs all one way: p = 2 * 0.5**5 = 0.0625; 6 pairs: 2 * 0.5**6 = 0.03125
    assert mcnemar_exact([1] * 5 + [0, 1], [0] * 5 + [0, 1]) == pytest.approx(0.0625)
    assert mcnemar_exact([1] * 6, [0] * 6) == pytest.approx(0.03125)
    # n10 = 3, n01 = 1: p = 2 * (C(4,0) + C(4,1)) / 16 = 0.625; no discordant pair: 1
    assert mcnemar_exact([1, 1, 1, 0], [0, 0, 0, 1]) == pytest.approx(0.625)
    assert mcnemar_exact([1, 0], [1, 0]) == 1.0
    with pytest.raises(ValueError, match="len"):
        mcnemar_exact([1], [1, 0])
    assert paired_bootstrap([0.5] * 7) == (0.5, 0.5, 0.5)
    d = [1, 0, 0, 1, 1, 0, 1, 1, 0, 1]
    mean, lo, hi = paired_bootstrap(d)
    assert mean == 0.6 and lo < 0.6 < hi and paired_bootstrap(d) == (mean, lo, hi)  # fixed seed: same CI


def _row(agent, seed, ep, success, mode="-", cap=100):
    return {"task": "t", "agent": agent, "mode": mode, "seed": seed, "episode": ep, "success": success,
            "return": float(success), "steps": 3, "seconds": 1.0, "max_steps": cap}


def test_summarize_pairs_each_agent_with_the_reference_on_the_same_instances():
    ref = [_row("random", 0, e, e == 0) for e in range(8)]
    good = [_row("ppo", 0, e, True, "stochastic") for e in range(8)]
    bad = [_row("ppo", 0, e, e == 0, "deterministic") for e in range(8)]
    extra = [_row("expert", 0, e, True, cap=10) for e in range(4)] + [_row("expert", 1, 0, True, cap=10)]
    summary = {(s["agent"], s["mode"]): s for s in summarize(ref + good + bad + extra, reference="random")}
    r = summary[("random", "-")]
    assert r["reference"] == "random" and r["diff"] is None and r["paired_n"] is None
    g = summary[("ppo", "stochastic")]
    # 7 discordant pairs all won by ppo: diff 7/8, McNemar p = 2 / 2**7
    assert g["paired_n"] == 8 and g["diff"] == pytest.approx(7 / 8) and g["mcnemar_p"] == pytest.approx(2 / 128)
    assert g["significant"] and 0 < g["diff_low"] <= g["diff"] <= g["diff_high"] <= 1
    b = summary[("ppo", "deterministic")]
    assert b["diff"] == 0 and b["mcnemar_p"] == 1.0 and not b["significant"]
    e = summary[("expert", "-")]
    assert e["episodes"] == 5 and e["paired_n"] == 4  # (seed 1, ep 0) has no reference partner
    from echorl_agent.eval.report import budget_notes, markdown_table

    (note,) = budget_notes(list(summary.values()))
    assert note.startswith("Unequal budgets on t: max steps per episode random 100, ppo 100, expert 10")
    md = markdown_table(list(summary.values()))
    assert "Δ vs random [95% CI]" in md and "+0.88 [" in md and "] *" in md and "(reference)" in md
    assert budget_notes(summarize(ref + good, reference="random")) == []
    # the paired CI depends on the instances, not on the order the rows were written in
    again = {(s["agent"], s["mode"]): s for s in summarize((ref + bad + good)[::-1], reference="random")}
    assert again[("ppo", "stochastic")] == g


def test_learned_agent_modes_and_equal_budgets(tmp_path, monkeypatch):
    """A learned agent (spec.learned) is evaluated in each mode with its ``deterministic`` attribute set."""
    from echorl_agent.agents import Agent
    from echorl_agent.eval import agents as reg

    class CoinAgent(Agent):
        name = "coin"

        def __init__(self, deterministic: bool = True) -> None:
            self.deterministic = deterministic

        def act(self, obs, info):
            import numpy as np

            adm = info["admissible_actions"]
            return adm[0] if self.deterministic else adm[int(np.random.randint(len(adm)))]

    spec_ = reg.AgentSpec("coin", "first action or a random one", lambda env_id, **kw: CoinAgent(**kw),
                          learned=True)
    monkeypatch.setitem(reg.AGENTS, "coin", spec_)
    task = "EchoRL/MiniGrid-Empty-5x5-v0"
    if task not in echorl_envs.env_ids():
        pytest.skip("text MiniGrid not registered")
    cfg = BenchConfig(tasks=[task], agents=["random", "coin"], seeds=1, episodes=2, workers=1, out=str(tmp_path))
    rows = run_bench(cfg, progress=False)
    assert [(r["agent"], r["mode"], r["episode"]) for r in rows] == [
        ("random", "-", 0), ("random", "-", 1), ("coin", "deterministic", 0), ("coin", "deterministic", 1),
        ("coin", "stochastic", 0), ("coin", "stochastic", 1)]
    assert {r["max_steps"] for r in rows} == {echorl_envs.entry(task).max_episode_steps}  # equal budgets
    det = [r for r in rows if r["mode"] == "deterministic"]
    assert all(r["steps"] == r["max_steps"] and not r["success"] for r in det)  # "turn left" forever
    assert reg.eval_modes("coin", "stochastic") == ["stochastic"] and reg.eval_modes("random", "both") == ["-"]
    with pytest.raises(ValueError, match="eval_mode must be one of"):
        BenchConfig(tasks=[task], agents=["coin"], eval_mode="greedy", out=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="reference must be one of the agents"):
        BenchConfig(tasks=[task], agents=["coin"], reference="random", out=str(tmp_path)).validate()
    # a deliberate per-agent cap, episode and seed limit: recorded per row, in run.json, and in the notes
    capped = BenchConfig(tasks=[task], agents=["random", "expert"], seeds=2, episodes=3, workers=1,
                         agent_options={"expert": {"max_steps": 7, "episodes": 2, "seeds": 1, "record_actions": True}},
                         out=str(tmp_path / "c"))
    rows = run_bench(capped, progress=False)
    assert [(r["agent"], r["seed"], r["max_steps"]) for r in rows] == [("random", 0, 100)] * 3 + [
        ("random", 1, 100)] * 3 + [("expert", 0, 7)] * 2
    expert_rows = [r for r in rows if r["agent"] == "expert"]
    assert all(r["success"] and len(r["actions"]) == r["steps"] for r in expert_rows)  # its trajectory, step by step
    assert set(expert_rows[0]["actions"]) <= {"turn left", "turn right", "go forward"}
    assert not any("actions" in r for r in rows if r["agent"] == "random")  # only where asked for
    meta = json.loads((tmp_path / "c" / "run.json").read_text())
    assert meta["budgets"][task]["expert"] == {"max_steps": 7, "seeds": 1, "episodes_per_seed": 2,
                                               "train_steps": None, "eval_modes": ["-"]}
    with pytest.raises(ValueError, match=r"agent_options\['expert'\]\['seeds'\] must be an int >= 1, got 0"):
        BenchConfig(tasks=[task], agents=["expert"], agent_options={"expert": {"seeds": 0}}, out=str(tmp_path)).validate()
    from echorl_agent.eval.report import notes

    assert "Unequal budgets on " + task in notes(summarize(rows, reference="random"))


def _comparable(rows):
    return [{k: v for k, v in r.items() if k not in ("seconds", "setup_seconds")} for r in rows]


def test_same_command_twice_gives_identical_results(tmp_path):
    """random, expert and a short PPO training (both eval modes), run twice from scratch: same rows, same
    summary (timings aside), and run.json records what is needed to rerun."""
    pytest.importorskip("echorl_envs.wrappers")
    task = "EchoRL/MiniGrid-Empty-5x5-v0"
    if task not in echorl_envs.env_ids():
        pytest.skip("text MiniGrid not registered")
    from echorl_agent.eval.report import TIMING_COLUMNS

    runs = []
    for name in ("a", "b"):
        cfg = BenchConfig(tasks=[task], agents=["random", "expert", "ppo"], seeds=1, episodes=3, workers=1,
                          train_steps=128, out=str(tmp_path / name))
        rows = run_bench(cfg, progress=False)
        summary = [{k: v for k, v in s.items() if k not in TIMING_COLUMNS}
                   for s in summarize(rows, reference=cfg.reference_agent())]
        runs.append((_comparable(rows), summary))
    assert runs[0] == runs[1]
    rows = runs[0][0]
    assert len(rows) == 3 + 3 + 6
    sto = [r for r in rows if r["mode"] == "stochastic"]
    det = [r for r in rows if r["mode"] == "deterministic"]
    assert [r["env_seed"] for r in sto] == [r["env_seed"] for r in det]  # same instances in both modes
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    assert meta["seeds"]["run_seeds"] == [0] and meta["seeds"]["bootstrap"] == {"seed": 0, "resamples": 10_000}
    assert meta["budgets"][task]["ppo"]["train_steps"] == 128 and meta["threads"]["torch_per_worker"] == 1
    assert meta["versions"]["torch"] != "not installed" and "commit" in meta["git"]
    assert meta["reference"] == "random" and meta["config"]["eval_mode"] == "both"


def _check_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "check_readme_demo.py"
    mod_spec = importlib.util.spec_from_file_location("check_readme_demo", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_readme_check_catches_drift():
    chk = _check_module()
    summary = chk.parse_table("| task | agent | mode | n | Success@1 [95% CI] | ep/s |\n|--|--|--|--|--|--|\n"
                              "| t | random | - | 40 | 0.10 [0.04, 0.23] | 12.5 |\n"
                              "| t | ppo | stochastic | 40 | 0.80 [0.65, 0.90] | 3.1 |")
    ok = chk.readme_table(chk.readme_markdown(summary))
    assert chk.compare(ok, summary) == []
    ok[1]["ep/s"] = "9.9"  # timings may differ
    assert chk.compare(ok, summary) == []
    ok[1]["Success@1 [95% CI]"] = "1.00 [0.91, 1.00]"
    assert chk.compare(ok, summary) == [
        "('t', 'ppo', 'stochastic') Success@1 [95% CI]: README '1.00 [0.91, 1.00]', summary '0.80 [0.65, 0.90]'"]
    assert chk.compare(ok[:1], summary)[-1] == "summary row ('t', 'ppo', 'stochastic') is missing from README"
    with pytest.raises(ValueError, match="no demo table"):
        chk.readme_table("no table here")


def test_readme_demo_table_is_the_committed_demo_run():
    """README's demo table equals the committed demo summary, and that summary comes from the current preset."""
    from pathlib import Path

    from echorl_agent.cli import DEMO_AGENT_OPTIONS, DEMO_EPISODES, DEMO_SEEDS, DEMO_TASKS, DEMO_TRAIN_STEPS

    chk = _check_module()
    root = Path(__file__).resolve().parents[1]
    base = root / "benchmarks" / "baselines" / "demo"
    problems = chk.compare(chk.readme_table((root / "README.md").read_text()),
                           chk.parse_table((base / "summary.md").read_text()))
    assert problems == []
    cfg = json.loads((base / "run.json").read_text())["config"]
    assert (cfg["seeds"], cfg["episodes"], cfg["train_steps"], cfg["eval_mode"]) == (
        DEMO_SEEDS, DEMO_EPISODES, DEMO_TRAIN_STEPS, "both")
    assert DEMO_TASKS["minigrid"] in cfg["tasks"]
    # every agent's budget (step cap, seeds, episodes, training options) is the preset's, JSON for JSON
    assert cfg["agent_options"] == json.loads(json.dumps({a: o for a, o in DEMO_AGENT_OPTIONS.items()
                                                          if a in cfg["agents"]}))


def test_agents_package_exports_resolve_and_share_the_one_protocol():
    import echorl_agent.agents as agents
    from echorl_agent.agents.base import Agent

    for name in agents.__all__:
        assert getattr(agents, name) is not None, name
    for name in ("RandomAgent", "ExpertAgent", "ReActAgent", "ScoringAgent", "ChatReActAgent", "CachedScoringAgent",
                 "PriorCacheAgent", "ExperienceGuidedAgent", "EchoRLLLMAgent", "ToTAgent", "SB3Agent"):
        assert issubclass(getattr(agents, name), Agent), name
    # the agents live only here: the engine, priors, experience and eval packages export none
    import echorl_agent.eval
    import echorl_agent.experience
    import echorl_agent.llm
    import echorl_agent.priors

    for pkg in (echorl_agent.llm, echorl_agent.priors, echorl_agent.experience, echorl_agent.eval):
        assert not [n for n in pkg.__all__ if n.endswith("Agent")], pkg.__name__


def test_cpu_name_is_the_model_name_line_and_versions_record_it(monkeypatch, tmp_path):
    from echorl_agent.eval import runner

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU @ 1.00GHz\nflags\t: avx2\n")
    real = runner.Path
    monkeypatch.setattr(runner, "Path", lambda p: real(info) if p == "/proc/cpuinfo" else real(p))
    assert runner.cpu_name() == "Test CPU @ 1.00GHz"
    assert runner.versions()["cpu"] == "Test CPU @ 1.00GHz"
    monkeypatch.setattr(runner, "Path", lambda p: real(tmp_path / "missing") if p == "/proc/cpuinfo" else real(p))
    monkeypatch.setattr(runner.platform, "processor", lambda: "")
    assert runner.cpu_name() == runner.platform.machine()
