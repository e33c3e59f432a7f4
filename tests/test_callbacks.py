"""LearningCurveCallback: per-episode records that agree with the env, and the steps-to-target rule."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.env_util import make_vec_env

from echorl_agent.callbacks import LearningCurveCallback
from echorl_envs.wrappers import wrap_text_env
from tests.sb3_text_envs import CorridorTextEnv

torch.set_num_threads(1)


def vec(n=2):
    return make_vec_env(lambda: wrap_text_env(CorridorTextEnv(), max_actions=3, encoder_kwargs={"dim": 16}),
                        n_envs=n, seed=0)


def test_records_match_monitor_and_env_rewards(tmp_path):
    cb = LearningCurveCallback(window=5)
    model = MaskablePPO("MlpPolicy", vec(), n_steps=64, batch_size=64, seed=0)
    model.learn(256, callback=cb)
    assert cb.episodes
    for e in cb.episodes:
        assert e.ret == (1.0 if e.won else 0.0)  # the corridor pays 1 only at the exit
        assert e.length >= 3 if e.won else e.length == 12  # 3 steps minimum; failures hit max_steps
    monitor = [(ep["r"], ep["l"]) for ep in model.ep_info_buffer]
    assert monitor == [(e.ret, e.length) for e in cb.episodes][-len(monitor):]
    assert list(np.diff([e.timesteps for e in cb.episodes]) >= 0) == [True] * (len(cb.episodes) - 1)
    rows = list(csv.DictReader(cb.to_csv(tmp_path / "c.csv", algo="MaskablePPO").open()))
    assert len(rows) == len(cb.episodes) and rows[0]["algo"] == "MaskablePPO"


def test_steps_to_target_is_the_first_step_where_the_rolling_rate_reaches_it():
    cb = LearningCurveCallback(target_success=0.6, window=4, stop_at_target=True)
    model = MaskablePPO("MlpPolicy", vec(4), n_steps=32, batch_size=64, learning_rate=3e-3, seed=0)
    model.learn(4096, callback=cb)
    assert cb.steps_to_target is not None and model.num_timesteps < 4096  # stopped early
    won = [e.won for e in cb.episodes]
    first = next(i for i in range(3, len(won)) if np.mean(won[i - 3 : i + 1]) >= 0.6)
    assert cb.steps_to_target == cb.episodes[first].timesteps


def test_bad_config():
    with pytest.raises(ValueError, match="target_success"):
        LearningCurveCallback(target_success=1.5)
    with pytest.raises(ValueError, match="window"):
        LearningCurveCallback(window=0)
