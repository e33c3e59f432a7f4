"""benchmarks/candidate_tree.py runs as documented and reports what it claims (tiny sizes; slow: loads the LM and
generates ALFWorld games)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_tree_scores_alfworld_states_with_fewer_tokens_and_the_same_policy(tmp_path):
    out = tmp_path / "rows.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "candidate_tree.py"), "--env",
                    "EchoRL/ALFWorld-PickAndPlace-v0", "--envs", "6", "--steps", "6", "--repeats", "1",
                    "--prefill-dtype", "float32", "--rollout", "1", "2", "3", "--json", str(out)],
                   capture_output=True, text=True, check=True, cwd=ROOT)
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["tokens_per_state_new"] < row["tokens_per_state_old"]  # "go to ..." computed once per state
    assert row["kl_tree"] < 1e-6 and row["max_dlogp"] < 1e-3  # float32: the same policy
    assert row["rollout"]["same_actions"]  # so the sampled rollouts take the same actions
