"""Every example in examples/ runs end to end (small budgets) and prints real measured numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (script, extra args, regexes its output must match)
EXAMPLES = [
    ("train_echo_rl.py", ["--steps", "1024", "--eval-episodes", "3"],
     [r"PPO\s+1024\s+[\d.]+\s+\d+\s+[\d.na]+\s+[\d.]+", r"EchoPPO\s+1024\s"]),
    ("benchmark_echo_rl.py", ["--train-steps", "512", "--episodes", "2"],
     [r"\| EchoRL/MiniGrid-Empty-5x5-v0 \| expert\s+\|\s+2 \| 1\.00", r"\| EchoRL/Game24-v0\s+\| expert", r"12 episodes"]),
    ("latent_planning_demo.py", ["--steps", "512"],
     [r"latent_dim=8", r"\n\s+0 \S.*\d\.\d{4}", r"mean plan KL on these \d+ observations: trained [\d.]+, untrained [\d.]+"]),
    ("prioritized_replay_demo.py", ["--steps", "1200", "--hot-size", "400", "--cold-size", "2000",
                                    "--eval-episodes", "2"],
     [r"DQN \(uniform\)\s+[\d.]+ s", r"hot/cold buffer: 1200 transitions stored", r"of a prioritized batch of 256"]),
    ("async_execution_demo.py", ["--env-steps", "10", "--actors", "2", "--turns", "1"],
     [r"1 worker [\d.]+ steps/s, 2 workers [\d.]+ steps/s", r"sequential / concurrent = [\d.]+"]),
    ("train_sb3.py", ["--steps", "1024", "--algos", "PPO", "EchoPPO", "--n-envs", "2", "--out", "{tmp}"],
     [r"\| PPO\s+\|\s+\d+ \|", r"\| EchoPPO\s+\|", r"learning_curves.png"]),
    ("bandwidth_efficient_demo.py", ["--max-steps", "2"],
     [r"cache on\s+[\d.]+\s+2\s+0\.\d{3}", r"cache off\s+[\d.]+\s+2\s", r"same actions in both runs: True"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("script,args,patterns", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs_and_reports_numbers(script, args, patterns, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for pat in patterns:
        assert re.search(pat, proc.stdout), f"{script}: {pat!r} not in output:\n{proc.stdout}"


def test_every_example_is_covered():
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    covered = {e[0] for e in EXAMPLES}
    assert scripts <= covered, f"examples without a test: {sorted(scripts - covered)}"
