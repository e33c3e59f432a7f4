"""rl-baselines3-zoo trains on an echorl id with the documented yaml (examples/zoo/hp.yml)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not importorskip: importing rl_zoo3 swaps gymnasium's TimeLimit for its PatchedTimeLimit (rl_zoo3/gym_patches.py),
# which adds info["TimeLimit.truncated"] to every truncated step of every env the test session makes afterwards. The
# zoo runs in a subprocess below, so this process only needs to know it is installed.
if importlib.util.find_spec("rl_zoo3") is None:
    pytest.skip("rl_zoo3 is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
ENV = "EchoRL/MiniGrid-Empty-5x5-v0"


@pytest.mark.slow
def test_rl_zoo3_train_ppo_on_echorl_env(tmp_path):
    cmd = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo", "--env", ENV, "--gym-packages", "echorl_envs",
           "-conf", str(ROOT / "examples" / "zoo" / "hp.yml"), "-f", str(tmp_path), "--seed", "0",
           "--eval-freq", "-1", "-n", "1024", "--num-threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "ppo" / "EchoRL-MiniGrid-Empty-5x5-v0_1"
    config = (run / "EchoRL-MiniGrid-Empty-5x5-v0" / "config.yml").read_text()
    assert "echorl_envs.wrappers.wrap_text_env" in config
    # the monitors saw real episodes of the text env (rewards in [0, 1], lengths <= 100 = max_episode_steps)
    episodes = []
    for f in run.glob("*.monitor.csv"):
        with f.open() as fh:
            next(fh)
            episodes += list(csv.DictReader(fh))
    assert episodes and all(0.0 <= float(e["r"]) <= 1.0 and 1 <= int(e["l"]) <= 100 for e in episodes)
    # the saved model acts on the wrapped env
    from stable_baselines3 import PPO

    import echorl_envs
    from echorl_envs.wrappers import wrap_text_env

    model = PPO.load(run / "EchoRL-MiniGrid-Empty-5x5-v0.zip", device="cpu")
    wrapped = wrap_text_env(echorl_envs.make(ENV))
    assert model.observation_space == wrapped.observation_space and model.action_space == wrapped.action_space
    obs, _ = wrapped.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert 0 <= int(action) < wrapped.action_space.n
