"""``echorl serve-env``: the same episodes through OpenEnv's client as in-process, for every family; the
``EchoRL/Remote-v0`` Gymnasium env; ``echorl bench --env-url`` over one and two servers."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import echorl_envs
from tests.openenv_server import running_server

to_wire = pytest.importorskip("echorl_envs.service.server", reason="the openenv extra is not installed").to_wire

#: One id per family; ALFWorld and TextWorld load engines/games for tens of seconds (slow suite).
FAST = ["EchoRL/MiniGrid-DoorKey-5x5-v0", "EchoRL/Game24-v0", "EchoRL/WebShop-v0", "EchoRL/CRUXEval-O-v0",
        "EchoRL/ARC-v0"]
SLOW = ["EchoRL/ALFWorld-PickAndPlace-v0", "EchoRL/TextWorld-CoinCollector-v0"]
OBS_KEYS = ("task", "admissible_actions", "won", "invalid_action")


def choose(info: dict, rng: np.random.Generator) -> str:
    """Expert, admissible, unknown and free-text actions, so invalid steps are compared too."""
    u = rng.random()
    if "expert_action" in info and u < 0.5:
        return info["expert_action"]
    if info["admissible_actions"] and u < 0.85:
        return info["admissible_actions"][int(rng.integers(len(info["admissible_actions"])))]
    return ["fly to the moon", "42", "[[1, 2], [3, 4]]", "(1 + 2) * 3", ""][int(rng.integers(5))]


def local_vs_served(url: str, env_id: str, seed: int, n: int = 12) -> None:
    """Play the same actions locally and through ``GenericEnvClient(...).sync()``; every field must agree."""
    from openenv.core.generic_client import GenericEnvClient

    local = gym.make(env_id)
    rng = np.random.default_rng(seed)
    with GenericEnvClient(base_url=url).sync() as client:
        obs, info = local.reset(seed=seed)
        res = client.reset(seed=seed, task=env_id)
        steps = 0
        while True:
            ob = res.observation
            assert ob["text"] == obs
            assert {k: ob[k] for k in OBS_KEYS} == {k: info[k] for k in OBS_KEYS}
            rest = {k: v for k, v in info.items() if k not in OBS_KEYS}
            assert {k: v for k, v in res.metadata.items() if k not in ("terminated", "truncated")} == to_wire(rest)
            if steps == n or res.done:
                break
            action = choose(info, rng)
            obs, r, term, trunc, info = local.step(action)
            res = client.step({"action": action})
            steps += 1
            assert (res.reward, res.done) == (r, term or trunc), action
            assert (res.metadata["terminated"], res.metadata["truncated"]) == (term, trunc)
    local.close()


def test_served_episodes_equal_local_fast_families():
    with running_server(FAST) as url:  # one server hosting five ids: reset(task=ID) picks one
        for env_id in FAST:
            for seed in (0, 7):
                local_vs_served(url, env_id, seed)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", SLOW)
def test_served_episodes_equal_local_engine_families(env_id):
    with running_server([env_id]) as url:
        local_vs_served(url, env_id, seed=3, n=20)


def test_reset_options_and_time_limit_reach_the_env():
    from openenv.core.generic_client import GenericEnvClient

    env_id = "EchoRL/CRUXEval-O-v0"
    local = gym.make(env_id, max_episode_steps=2)
    _, info = local.reset(seed=1, options={"index": 5})
    with running_server([env_id]) as url, GenericEnvClient(base_url=url).sync() as client:
        res = client.reset(seed=1, options={"index": 5}, max_episode_steps=2)
        assert res.metadata["task_id"] == info["task_id"]
        for a in ("1", "2"):
            _, r, term, trunc, _ = local.step(a)
            res = client.step({"action": a})
        assert (term, trunc) == (False, True) and res.done and res.metadata["truncated"]
        with pytest.raises(RuntimeError, match="unknown reset option .indx.*did you mean .index."):
            client.reset(options={"indx": 1})
        with pytest.raises(RuntimeError, match="not served here; did you mean 'EchoRL/CRUXEval-O-v0'"):
            client.reset(task="EchoRL/CRUXEval-0-v0")
        assert client.reset(seed=1, options={"index": 5}).metadata["task_id"] == info["task_id"]


def test_remote_gym_env_keeps_the_text_protocol_and_feeds_sb3_wrappers():
    from echorl_envs.wrappers.sb3 import wrap_text_env

    env_id = "EchoRL/MiniGrid-DoorKey-5x5-v0"
    with running_server([env_id, "EchoRL/ARC-v0"]) as url:
        remote = gym.make("EchoRL/Remote-v0", base_url=url, task=env_id)
        local = gym.make(env_id)
        assert remote.observation_space == local.observation_space
        assert remote.action_space == local.action_space
        wr, wl = wrap_text_env(remote, max_actions=8), wrap_text_env(local, max_actions=8)
        for seed in (0, 1):
            o_r, i_r = wr.reset(seed=seed)
            o_l, i_l = wl.reset(seed=seed)
            assert np.array_equal(o_r, o_l) and set(i_r) == set(i_l)
            for t in range(30):
                a = int(np.random.default_rng(seed * 100 + t).integers(8))
                o_r, r_r, te_r, tr_r, i_r = wr.step(a)
                o_l, r_l, te_l, tr_l, i_l = wl.step(a)
                assert np.array_equal(o_r, o_l) and (r_r, te_r, tr_r) == (r_l, te_l, tr_l)
                assert set(i_r) == set(i_l) and to_wire(i_l) == to_wire(i_r)
                if te_l or tr_l:
                    break
        wr.close()
        local.close()


def test_remote_env_over_a_blocking_client_plays_the_same_episode():
    from openenv.core.generic_client import GenericEnvClient

    from echorl_envs.service.remote import RemoteTextEnv

    env_id = "EchoRL/MiniGrid-Empty-5x5-v0"
    with running_server([env_id]) as url:
        own = RemoteTextEnv(url, env_id)
        blocking = RemoteTextEnv(url, env_id, sync_client=GenericEnvClient(base_url=url).sync())
        trajectories = []
        for env in (own, blocking):
            obs, info = env.reset(seed=3)
            steps = [(obs, info["admissible_actions"])]
            for t in range(4):
                obs, r, term, trunc, info = env.step(info["admissible_actions"][t % len(info["admissible_actions"])])
                steps.append((obs, r, term, trunc, to_wire(info)))
            trajectories.append(steps)
            env.close()
        assert trajectories[0] == trajectories[1]
        with pytest.raises(RuntimeError, match="closed"):
            blocking.reset(seed=0)


def test_remote_id_is_registered_but_outside_the_family_table():
    assert echorl_envs.REMOTE_ID in gym.registry
    assert echorl_envs.REMOTE_ID not in echorl_envs.env_ids()
    with pytest.raises(ValueError, match="base_url must start with http://"):
        gym.make("EchoRL/Remote-v0", base_url="localhost:1", task="EchoRL/ARC-v0")
    with pytest.raises(ValueError, match=r"base_url is required.*got base_url=None"):
        gym.make("EchoRL/Remote-v0")


def test_remote_env_reports_the_served_step_limit_and_checks_the_task():
    with running_server(["EchoRL/MiniGrid-DoorKey-5x5-v0", "EchoRL/ARC-v0"]) as url:
        for task, limit in ((None, 250), ("EchoRL/MiniGrid-DoorKey-5x5-v0", 250), ("EchoRL/ARC-v0", 8)):
            env = gym.make("EchoRL/Remote-v0", base_url=url, task=task)
            assert env.spec.max_episode_steps == limit == gym.spec(task or "EchoRL/MiniGrid-DoorKey-5x5-v0") \
                .max_episode_steps
            env.close()
        env = gym.make("EchoRL/Remote-v0", base_url=url, task="EchoRL/MiniGrid-DoorKey-5x5-v0", time_limit=3)
        assert env.spec.max_episode_steps == 3
        env.reset(seed=0)
        steps = [env.step("turn left") for _ in range(3)]  # the server truncates at the reported limit
        assert [s[3] for s in steps] == [False, False, True], [(s[0][:60], *s[1:4], s[4].get("step")) for s in steps]
        env.close()
        with pytest.raises(ValueError, match="'EchoRL/ARC-Eval-v0' is not served.*did you mean 'EchoRL/ARC-v0'"):
            gym.make("EchoRL/Remote-v0", base_url=url, task="EchoRL/ARC-Eval-v0")


def test_bench_over_two_servers_equals_one_server_and_local(tmp_path):
    from echorl_agent.eval.report import summarize
    from echorl_agent.eval.runner import BenchConfig, run_bench

    tasks = ["EchoRL/MiniGrid-Empty-5x5-v0", "EchoRL/WebShop-v0"]

    def table(name: str, urls: list[str]) -> tuple[list, list]:
        cfg = BenchConfig(tasks=tasks, agents=["random", "expert"], out=str(tmp_path / name), seeds=2, episodes=3,
                          workers=1, env_urls=urls)
        rows = run_bench(cfg, progress=False)
        keys = ("task", "agent", "seed", "episode", "env_seed", "task_id", "success", "return", "steps",
                "invalid_actions")
        per_episode = sorted(tuple(r[k] for k in keys) for r in rows)
        summary = [{k: s[k] for k in ("task", "agent", "episodes", "success", "mean_return", "mean_steps")}
                   for s in summarize(rows)]
        return per_episode, summary

    with running_server(tasks) as a, running_server(tasks) as b:
        one = table("one", [a])
        two = table("two", [a, b])
    local = table("local", [])
    assert one == two == local
    assert len(one[0]) == 2 * 2 * 2 * 3 and any(r[6] for r in one[0])  # expert wins some episodes
    with pytest.raises(ValueError, match="env_urls entries must start with http"):
        BenchConfig(tasks=tasks, agents=["random"], env_urls=["localhost:8000"]).validate()


def test_http_routes_schema_and_cli_bench_env_url(tmp_path):
    import httpx

    from echorl_agent import cli

    env_id = "EchoRL/MiniGrid-Empty-5x5-v0"
    local = gym.make(env_id)
    obs, _ = local.reset(seed=4)
    local.close()
    with running_server([env_id]) as url:
        assert httpx.get(url + "/health").json()["status"] == "healthy"
        schema = httpx.get(url + "/schema").json()
        assert schema["action"]["required"] == ["action"]
        assert {"text", "admissible_actions", "task", "won", "invalid_action", "reward", "done",
                "metadata"} <= set(schema["observation"]["properties"])
        reply = httpx.post(url + "/reset", json={"seed": 4, "task": env_id}).json()  # OpenEnv's stateless route
        assert reply["observation"]["text"] == obs and reply["done"] is False
        out = tmp_path / "bench"
        assert cli.main(["bench", "--tasks", env_id, "--agents", "expert", "--seeds", "1", "--episodes", "2",
                         "--workers", "1", "--env-url", url, "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(r["env_seed"], r["success"]) for r in rows] == [(0, True), (1, True)]
    assert json.loads((out / "run.json").read_text())["config"]["env_urls"] == [url]


def test_sb3_ppo_trains_on_remote_envs():
    from stable_baselines3 import PPO

    from echorl_envs.wrappers.sb3 import make_sb3_env

    env_id = "EchoRL/MiniGrid-Empty-5x5-v0"
    with running_server([env_id], max_sessions=3) as url:
        vec = make_sb3_env("EchoRL/Remote-v0", n_envs=2, seed=0, env_kwargs={"base_url": url, "task": env_id},
                           max_actions=7)
        model = PPO("MlpPolicy", vec, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
        model.learn(128)
        assert model.num_timesteps == 128
        vec.close()


def test_a_malformed_step_message_names_the_bad_field():
    import httpx
    from openenv.core.generic_client import GenericEnvClient

    with running_server(["EchoRL/Game24-v0"]) as url, GenericEnvClient(base_url=url).sync() as client:
        client.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"unknown field 'actoin' \(did you mean 'action'\?\)"):
            client.step({"actoin": "1"})
        with pytest.raises(RuntimeError, match=r"action input should be a valid string, got action=3"):
            client.step({"action": 3})
        assert client.step({"action": "1"}).observation["invalid_action"]  # the session goes on
        r = httpx.post(url + "/step", json={"action": {"action": "1", "extra": 2}})
        assert r.status_code == 422 and "unknown field 'extra'" in r.json()["detail"]
