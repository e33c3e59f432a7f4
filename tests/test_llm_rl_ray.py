"""``train-llm --backend ray --rollout-workers N`` (issue 90 item 2): GiGPO groups on Ray rollout workers.

One worker on Ray gives the local run's curve, trajectories and weights bit for bit; two workers play every group
once, stamped with the version that acted; a worker killed mid-run is replaced and its groups replayed, so the run
gives the curve of the same run without the kill. Bad options fail with the flag and the fix, before any model loads.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import episode_actions, small_llm_policy, train_from

ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"
SEED = 21


def _cfg(out=None, **kw):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    base = dict(env_id=ENV, method="gigpo", train_steps=24, n_envs=4, group_size=2, history=1, max_episode_steps=4,
                learning_rate=1e-2, seed=SEED, policy_kwargs={"lora_rank": 4}, out=None if out is None else str(out))
    base.update(kw)
    return LLMTrainConfig(**base)


# ---------------------------------------------------------------------------------------------- bad options (fast)
@pytest.mark.parametrize(("kw", "needle"), [
    ({"backend": "ray", "rollout_workers": 0}, "--rollout-workers 1 or more"),
    ({"backend": "ray", "rollout_workers": True}, "rollout_workers must be an int >= 1"),
    ({"backend": "rey"}, "did you mean --backend ray"),
    ({"rollout_workers": 2}, "needs --backend ray"),
    ({"backend": "ray", "rollout_workers": 3}, "raise --n-envs to at least 3 x --group-size, or use --rollout-workers 2"),
    ({"backend": "ray", "method": "bc+ppo", "n_envs": 1}, "use --backend local"),
    ({"backend": "ray", "policy_kwargs": {"rollout_url": "http://127.0.0.1:1/v1"}}, "drop one of them"),
    ({"backend": "ray", "max_policy_lag": -1}, "(--max-policy-lag K"),
    ({"max_policy_lag": 1}, "add --backend ray, or drop --max-policy-lag"),
])
def test_bad_backend_options_name_the_flag_and_the_fix(kw, needle):
    with pytest.raises(ValueError, match="--backend|--rollout-workers|--max-policy-lag") as e:
        _cfg(**kw)
    assert needle in str(e.value)


def test_backend_ray_without_ray_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, find_spec finds nothing
    with pytest.raises(ValueError, match=r"--backend ray needs Ray, which is not installed: pip install 'echorl\[ray\]'"):
        _cfg(backend="ray")
    from echorl_agent.llm_rl.backend import import_ray

    with pytest.raises(ValueError, match="drop --backend ray"):
        import_ray()
    _cfg()  # the local backend never needs Ray


def test_cli_rollout_workers_zero_fails_before_training(tmp_path, capsys):
    from echorl_agent.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train-llm", "--task", ENV, "--method", "gigpo", "--n-envs", "4", "--group-size", "2", "--backend", "ray",
              "--rollout-workers", "0", "--out", str(tmp_path), "--quiet"])
    assert "--rollout-workers 1 or more" in str(e.value.code)
    assert not (tmp_path / "config.json").exists()
    with pytest.raises(SystemExit):
        main(["train-llm", "--task", ENV, "--backend", "spark", "--out", str(tmp_path)])
    assert "invalid choice: 'spark'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_worker_replays_the_learner_groups_exactly():
    """The worker's engine replica, given the learner's weights and generator state, samples the learner's episodes
    (what makes N=1 on Ray equal to local, and a replayed chunk equal to the lost one) -- no Ray needed."""
    from echorl_agent.llm_rl.ray_workers import RolloutWorker, worker_spec
    from echorl_agent.llm_rl.rollout import collect_groups, make_choice_env

    policy = small_llm_policy(ENV, history=1, max_episode_steps=4)
    with torch.no_grad():  # weights the worker can only have from set_weights
        for p in policy.lm.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        policy.value_head[0].weight.mul_(2.0)
    version = policy.sync_engine()
    worker = RolloutWorker(worker_spec(_cfg(), policy))
    worker.set_weights(policy.state_dict(), version)
    assert torch.equal(worker.policy.value_head[0].weight, policy.value_head[0].weight)
    seeds = [5, 9]
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    envs = [make_choice_env(ENV, 1, 4, encode=False) for _ in range(4)]
    local = collect_groups(policy, envs, seeds, 2, gen)
    res = worker.play(seeds, state, version)
    remote = res["episodes"]
    assert [[(s.action, s.reward, s.anchor) for s in e.steps] for e in remote] == \
        [[(s.action, s.reward, s.anchor) for s in e.steps] for e in local]
    assert all(torch.equal(a.record.rollout_logp, b.record.rollout_logp)
               for e, f in zip(remote, local, strict=True) for a, b in zip(e.steps, f.steps, strict=True))
    assert torch.equal(res["generator"], gen.get_state())
    assert {e.policy_version for e in remote} == {version}
    with pytest.raises(RuntimeError, match="set_weights first"):
        worker.play(seeds, state, version + 1)


# ---------------------------------------------------------------------------------------------- a local Ray cluster
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}, _system_config={"worker_niceness": 0})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def lm_and_state():
    policy = small_llm_policy(ENV, history=1, max_episode_steps=4)
    state = policy.lm.trainable_state()
    yield policy.lm, state
    policy.lm.load_trainable_state(state)


@pytest.mark.slow
@pytest.mark.ci
def test_one_ray_worker_gives_the_local_curve(ray_cluster, lm_and_state, tmp_path):
    lm, state = lm_and_state
    local, local_rows = train_from(lm, state, _cfg(tmp_path / "local"))
    weights = {k: v.clone() for k, v in lm.trainable_state().items()}
    trainer, rows = train_from(lm, state, _cfg(tmp_path / "ray", backend="ray", rollout_workers=1))
    assert len(rows) >= 8 and rows == local_rows  # every finished episode, row by row
    assert episode_actions(trainer) == episode_actions(local)
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())
    h = trainer.history
    assert [r["rollout_workers"] for r in h] == [1.0] * len(h) and h[-1]["worker_restarts"] == 0.0
    assert h[-1]["policy_lag_max"] == 0.0  # synchronous push: every episode played by the learner's weights
    assert trainer.rollout_workers.workers == []  # closed with the run


def _kill_worker_1_in_iteration_2(monkeypatch) -> list[int]:
    """Make the pool kill worker 1 right after the second iteration's plays were sent (mid-play); the list it
    returns gets one entry when that happened."""
    from echorl_agent.llm_rl.ray_workers import RayRolloutPool

    gather, collect, killed = RayRolloutPool._gather, RayRolloutPool.collect, []

    def gather_and_kill(self, job):
        if job.worker == 0 and not killed and self._iterations == 1:
            self._ray.kill(self.workers[1])  # worker 1 dies in the middle of its play (and of any queued one)
            killed.append(1)
        return gather(self, job)

    def count_iterations(self, trainer):
        self._iterations = trainer.num_iterations
        return collect(self, trainer)

    monkeypatch.setattr(RayRolloutPool, "_gather", gather_and_kill)
    monkeypatch.setattr(RayRolloutPool, "collect", count_iterations)
    return killed


@pytest.mark.slow
def test_two_workers_and_a_killed_worker_give_the_same_run(ray_cluster, lm_and_state, tmp_path, monkeypatch):
    lm, state = lm_and_state
    cfg = dict(backend="ray", rollout_workers=2, train_steps=30)
    trainer, rows = train_from(lm, state, _cfg(tmp_path / "two", **cfg))
    weights = {k: v.clone() for k, v in lm.trainable_state().items()}
    h = trainer.history
    assert len(h) >= 2 and h[-1]["worker_restarts"] == 0.0
    eps = trainer.last_episodes
    assert [e.group for e in eps] == [0, 0, 1, 1]  # both workers' groups, renumbered in seed order
    assert len({e.seed for e in eps}) == 2 and all(e.policy_version == eps[0].policy_version for e in eps)
    assert len(rows) == 4 * len(h)  # every episode of every iteration, once
    assert int(rows[-1]["timesteps"]) == trainer.num_timesteps == sum(len(e.steps) for e in eps) + int(
        h[-2]["timesteps"])

    killed = _kill_worker_1_in_iteration_2(monkeypatch)
    trainer2, rows2 = train_from(lm, state, _cfg(tmp_path / "killed", **cfg))
    assert len(killed) == 1 and trainer2.history[-1]["worker_restarts"] == 1.0
    assert rows2 == rows  # the replayed groups are the lost ones: nothing dropped, nothing counted twice
    assert episode_actions(trainer2) == episode_actions(trainer)
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())


@pytest.mark.slow
def test_workers_ahead_of_the_learner_play_older_weights_within_the_bound(ray_cluster, lm_and_state, tmp_path,
                                                                          monkeypatch):
    lm, state = lm_and_state
    # an entropy bonus makes every step a sample, so every iteration updates (and bumps the weights version)
    cfg = dict(backend="ray", rollout_workers=2, max_policy_lag=1, train_steps=40, gigpo_kwargs={"ent_coef": 0.01})
    trainer, rows = train_from(lm, state, _cfg(tmp_path / "ahead", **cfg))
    h = trainer.history
    assert len(h) >= 3 and all(r["num_samples"] > 0 for r in h)
    # iteration 1 was played by the start weights, each later one by the weights before the previous update
    assert [r["policy_lag_max"] for r in h] == [0.0] + [1.0] * (len(h) - 1)
    assert {e.policy_version for e in trainer.last_episodes} == {trainer.policy.lm.engine.weight_version - 2}
    assert len(rows) == 4 * len(h) and int(rows[-1]["timesteps"]) == trainer.num_timesteps
    # the stale rollouts are reweighted by min(pi_old / pi_rollout, C): far more than the rollout/learner numerics
    assert abs(h[0]["is_weight_mean"] - 1.0) < 1e-4 and all(abs(r["is_weight_mean"] - 1.0) > 1e-3 for r in h[1:])
    weights = {k: v.clone() for k, v in lm.trainable_state().items()}

    # worker 1 dies with two plays on it (this iteration's and the next, sent ahead with older weights): both are
    # replayed with the weights they were sent with
    killed = _kill_worker_1_in_iteration_2(monkeypatch)
    trainer2, rows2 = train_from(lm, state, _cfg(tmp_path / "killed", **cfg))
    assert killed and trainer2.history[-1]["worker_restarts"] == 1.0
    assert rows2 == rows and [r["policy_lag_max"] for r in trainer2.history] == [r["policy_lag_max"] for r in h]
    assert all(torch.equal(weights[k], v) for k, v in lm.trainable_state().items())


@pytest.mark.slow
def test_workers_on_an_env_server_give_the_local_curve_and_count_its_steps(ray_cluster, lm_and_state, tmp_path):
    import json

    from tests.openenv_server import running_server

    lm, state = lm_and_state
    local, local_rows = train_from(lm, state, _cfg(tmp_path / "local"))
    with running_server([ENV]) as url:  # the workers open their env sessions there (the learner's check too)
        trainer, rows = train_from(lm, state, _cfg(tmp_path / "ray", backend="ray", rollout_workers=1, env_urls=[url]))
    assert rows == local_rows and episode_actions(trainer) == episode_actions(local)
    server = json.loads((tmp_path / "ray" / "servers.json").read_text())["servers"][0]
    assert server["env_steps"] == trainer.num_timesteps and server["wait_s"] > 0 and not server["dead"]


def test_the_first_line_says_where_the_groups_play():
    from echorl_agent.llm_rl.progress import describe

    assert "; groups played on 2 Ray rollout worker(s), up to 1 iteration(s) ahead" in describe(
        _cfg(backend="ray", rollout_workers=2, max_policy_lag=1))
    assert "Ray" not in describe(_cfg())
