"""``train-llm --env-url`` (issue 90 item 1): training episodes on ``echorl serve-env`` servers give the in-process
run's trajectories and curve; a server killed or hung mid-run has its episodes replayed on another; bad servers fail
before training."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.conftest import episode_actions, small_llm_policy, train_from
from tests.openenv_server import free_port, server_process

ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"
SEED = 21


@pytest.fixture(scope="module")
def lm_and_state():
    policy = small_llm_policy(ENV, history=1, max_episode_steps=4)
    state = policy.lm.trainable_state()
    yield policy.lm, state
    policy.lm.load_trainable_state(state)


@pytest.fixture(scope="module")
def server_a():
    with server_process([ENV]) as (proc, url):
        yield proc, url


def _cfg(out, **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    base = dict(env_id=ENV, method="gigpo", train_steps=24, n_envs=4, group_size=2, history=1, max_episode_steps=4,
                learning_rate=1e-2, seed=SEED, policy_kwargs={"lora_rank": 4}, out=str(out))
    base.update(kw)
    return LLMTrainConfig(**base)


@pytest.fixture(scope="module")
def in_process(lm_and_state, tmp_path_factory):
    lm, state = lm_and_state
    trainer, rows = train_from(lm, state, _cfg(tmp_path_factory.mktemp("local")))
    return episode_actions(trainer), rows, {k: v.clone() for k, v in lm.trainable_state().items()}


def _same_run(trainer, rows, lm, in_process):
    actions, local_rows, weights = in_process
    assert len(local_rows) >= 8 and rows == local_rows  # every finished episode, row by row
    assert episode_actions(trainer) == actions
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())


@pytest.mark.slow
def test_two_servers_give_the_in_process_trajectories_and_curve(lm_and_state, server_a, in_process, tmp_path):
    lm, state = lm_and_state
    with server_process([ENV]) as (_, url_b):
        urls = [server_a[1], url_b]
        trainer, rows = train_from(lm, state, _cfg(tmp_path, env_urls=urls))
    _same_run(trainer, rows, lm, in_process)
    servers = json.loads((tmp_path / "servers.json").read_text())
    assert servers["task"] == ENV and [s["url"] for s in servers["servers"]] == urls
    # 4 envs: 0 and 2 on the first server, 1 and 3 on the second; every training step counted on one of them
    assert sum(s["env_steps"] for s in servers["servers"]) == trainer.num_timesteps
    assert all(s["env_steps"] > 0 and s["env_steps_per_s"] > 0 and not s["dead"] for s in servers["servers"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()  # the last iteration's per-server rate is the run's (nothing stepped after it)
    last = [acc.Scalars(f"servers/{n}_env_steps_per_s")[-1].value for n in (0, 1)]
    assert last == pytest.approx([s["env_steps_per_s"] for s in servers["servers"]], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_server_that_dies_or_hangs_mid_run_has_its_episodes_replayed(lm_and_state, server_a, in_process, tmp_path,
                                                                       monkeypatch, fault):
    from echorl_agent.llm_rl import env_servers

    lm, state = lm_and_state
    step, calls = env_servers.FailoverEnv.step, []
    with server_process([ENV]) as (proc_b, url_b):

        def step_then_fail(self, action):
            out = step(self, action)
            calls.append(self.url)
            if len(calls) == 5:  # mid-episode of the first iteration: B's envs have taken steps
                os.kill(proc_b.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            return out

        monkeypatch.setattr(env_servers.FailoverEnv, "step", step_then_fail)
        try:
            trainer, rows = train_from(lm, state, _cfg(tmp_path, env_urls=[server_a[1], url_b], env_step_timeout_s=10.0))
        finally:
            if fault == "hang":
                os.kill(proc_b.pid, signal.SIGCONT)
    _same_run(trainer, rows, lm, in_process)
    a, b = json.loads((tmp_path / "servers.json").read_text())["servers"]
    assert b["dead"] and b["failovers"] == 2 and a["replayed_steps"] > 0 and not a["dead"]
    assert a["env_steps"] + b["env_steps"] == trainer.num_timesteps  # nothing counted twice, nothing dropped
    assert ("TimeoutError" if fault == "hang" else "ConnectionClosed") in b["error"]


def test_unreachable_server_fails_before_training_naming_flag_url_and_fix(tmp_path):
    from echorl_agent.llm_rl.train import train_llm

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"--env-url {url} is unreachable .*echorl serve-env --task {ENV}"):
        train_llm(_cfg(tmp_path, env_urls=[url]))


def test_server_of_another_task_fails_before_training_naming_both(server_a, tmp_path):
    from echorl_agent.llm_rl.train import train_llm

    other = "EchoRL/MiniGrid-Empty-5x5-v0"
    with pytest.raises(ValueError, match=rf"--env-url {server_a[1]} does not serve --task {other}: .*{ENV}"):
        train_llm(_cfg(tmp_path, env_id=other, env_urls=[server_a[1]]))


def test_bad_env_urls_are_config_errors():
    with pytest.raises(ValueError, match="--env-url must start with http://"):
        _cfg(None, env_urls=["127.0.0.1:8001"])
    with pytest.raises(ValueError, match="given more than once"):
        _cfg(None, env_urls=["http://h:1", "http://h:1"])
    with pytest.raises(ValueError, match="env_kwargs cannot travel to an env server"):
        _cfg(None, env_urls=["http://h:1"], env_kwargs={"goal_line": True})


def test_train_llm_flag_repeats_into_env_urls():
    from echorl_agent.cli import build_parser, train_overrides

    args = build_parser().parse_args(["train-llm", "--task", ENV, "--env-url", "http://a:1", "--env-url", "http://b:2"])
    assert train_overrides(args)["env_urls"] == ["http://a:1", "http://b:2"]
    assert "env_urls" not in train_overrides(build_parser().parse_args(["train-llm", "--task", ENV]))


def test_a_replay_that_differs_or_no_live_server_is_an_error_naming_the_servers(server_a):
    from echorl_agent.llm_rl.env_servers import EnvServerError, EnvServerPool

    with server_process([ENV]) as (proc_b, url_b):
        pool = EnvServerPool([url_b, server_a[1]], ENV, step_timeout_s=5.0)
        env = pool.choice_env(0, history=0, max_episode_steps=4)
        inner = env.unwrapped
        env.reset(seed=3)
        env.step(0)
        kind, arg, digest = inner._log[-1]
        inner._log[-1] = (kind, arg, bytes(8))  # what the dead server answered, as far as the replay knows
        proc_b.kill()
        proc_b.wait()
        with pytest.raises(EnvServerError, match=f"replaying .* on {server_a[1]} after {url_b} failed gave a different"):
            env.step(1)
        assert pool.stats[url_b].dead
        pool.mark_dead(server_a[1], ConnectionError("gone"))
        with pytest.raises(EnvServerError, match=f"no live env server left .*{url_b} .*{server_a[1]}"):
            env.unwrapped._open()


@pytest.mark.slow
def test_ppo_envs_on_servers_survive_a_kill_after_unseeded_resets(lm_and_state, server_a, tmp_path, monkeypatch):
    """PPO resets its envs with a seed once, then without: the failover replays those resets too (the server env's
    RNG goes on from the seed), so the curve is the in-process one."""
    from echorl_agent.llm_rl import env_servers

    lm, state = lm_and_state
    ppo = dict(method="ppo", train_steps=16, n_envs=2, n_steps=8, batch_size=4, n_epochs=1, max_episode_steps=2)
    _, local_rows = train_from(lm, state, _cfg(tmp_path / "local", **ppo))
    local_weights = {k: v.clone() for k, v in lm.trainable_state().items()}
    step, calls = env_servers.FailoverEnv.step, []
    with server_process([ENV]) as (proc_b, url_b):

        def step_then_kill(self, action):
            out = step(self, action)
            calls.append(self.url)
            if len(calls) == 11:  # env 1 (server B) is in its third episode, two of them reset without a seed
                proc_b.kill()
            return out

        monkeypatch.setattr(env_servers.FailoverEnv, "step", step_then_kill)
        _, rows = train_from(lm, state, _cfg(tmp_path / "remote", env_urls=[server_a[1], url_b], **ppo))
    assert len(local_rows) >= 6 and rows == local_rows
    assert all(torch.equal(local_weights[k], v) for k, v in lm.trainable_state().items())
    a, b = json.loads((tmp_path / "remote" / "servers.json").read_text())["servers"]
    assert b["dead"] and b["failovers"] == 1 and a["replayed_steps"] >= 4
    assert a["env_steps"] + b["env_steps"] == 16


def test_a_run_resumes_on_other_servers_but_not_with_another_task():
    import dataclasses

    from echorl_agent.llm_rl.checkpoint import check_config

    saved = json.loads(json.dumps(dataclasses.asdict(_cfg("runs/x", env_urls=["http://a:1", "http://b:2"])),
                                  default=str))
    check_config(saved, _cfg("runs/x", env_urls=["http://c:3"], env_step_timeout_s=5.0), "runs/x/checkpoint")
    check_config(saved, _cfg("runs/x"), "runs/x/checkpoint")  # back in-process: the same episodes
    with pytest.raises(ValueError, match="env_id differs"):
        check_config(saved, _cfg("runs/x", env_id="EchoRL/MiniGrid-Empty-5x5-v0"), "runs/x/checkpoint")
