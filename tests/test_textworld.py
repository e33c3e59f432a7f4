"""TextWorld challenges generated offline: walkthrough/policy expert wins, random agent does worse, isolation."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np
import pytest

import echorl_envs  # noqa: F401  (registers the ids)
from echorl_envs.textworld import CHALLENGE_SETTINGS, TextWorldEnv


def play(env, index, policy, rng, max_steps=100):
    _, info = env.reset(options={"index": index})
    total = 0.0
    for _ in range(max_steps):
        adm = info["admissible_actions"]
        a = info["expert_action"] if policy == "expert" else adm[int(rng.integers(len(adm)))]
        _, r, term, trunc, info = env.step(a)
        total += r
        if term or trunc:
            break
    return info["won"], total, info["max_score"]


@pytest.mark.parametrize("challenge", sorted(CHALLENGE_SETTINGS))
def test_expert_wins_and_rewards_sum_to_max_score(challenge):
    env = TextWorldEnv(challenge=challenge, difficulty="medium", num_games=2)
    try:
        won, total, max_score = play(env, 0, "expert", np.random.default_rng(0))
        assert won and total == max_score > 0
        _, info = env.reset(options={"index": 0})
        assert not info["won"] and info["score"] == 0 and info["task"]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("challenge", sorted(CHALLENGE_SETTINGS))
def test_expert_sweep_vs_random(challenge):
    env = TextWorldEnv(challenge=challenge, difficulty="medium", num_games=10)
    rng = np.random.default_rng(0)
    try:
        expert = [play(env, i, "expert", rng)[0] for i in range(10)]
        random = [play(env, i, "random", rng, max_steps=30)[0] for i in range(10)]
    finally:
        env.close()
    assert sum(expert) == 10 and sum(random) < sum(expert)


def test_invalid_action_and_bad_config():
    env = TextWorldEnv(challenge="tw-coin_collector", difficulty="medium", num_games=1)
    try:
        env.reset(options={"index": 0})
        obs, r, term, _, info = env.step("dance wildly")
        assert info["invalid_action"] and r == 0.0 and not term and "Admissible actions" in obs
    finally:
        env.close()
    with pytest.raises(ValueError, match="did you mean 'tw-cooking'"):
        TextWorldEnv(challenge="tw-cookin")
    with pytest.raises(ValueError, match="difficulty"):
        TextWorldEnv(challenge="tw-simple", difficulty="insane")


def test_async_vector_env_isolates_a_crashed_worker():
    """A worker that dies (engine crash, OOM kill) raises in the caller instead of taking it down."""
    venv = gym.vector.AsyncVectorEnv(
        [lambda: gym.make("EchoRL/TextWorld-CoinCollector-v0", num_games=1)] * 2, shared_memory=False
    )
    try:
        _, infos = venv.reset(seed=[0, 1])
        os.kill(venv.processes[0].pid, signal.SIGKILL)
        venv.processes[0].join(timeout=10)
        with pytest.raises(Exception):  # noqa: B017 - gymnasium surfaces EOF/BrokenPipe/closed-pipe errors
            venv.step(tuple(a[0] for a in infos["admissible_actions"]))
        assert os.getpid() and not venv.processes[0].is_alive()
    finally:
        venv.close(terminate=True)
