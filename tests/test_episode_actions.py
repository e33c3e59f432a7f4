"""benchmarks/episode_actions.py: action shares and ALFWorld put-back loops of recorded held-out episodes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "episode_actions", Path(__file__).resolve().parents[1] / "benchmarks" / "episode_actions.py")
ea = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ea)


def test_put_backs_count_the_same_object_back_onto_the_same_receptacle_only():
    assert ea.put_backs(["take book 1 from shelf 2", "move book 1 to shelf 2", "take book 1 from shelf 2",
                         "move book 1 to shelf 2"]) == 2
    assert ea.put_backs(["take book 1 from shelf 2", "move book 1 to sidetable 1"]) == 0  # a real put
    assert ea.put_backs(["take book 1 from shelf 2", "move bowl 2 to shelf 2"]) == 0  # another object
    assert ea.put_backs(["take book 1 from shelf 2", "go to shelf 2", "move book 1 to shelf 2"]) == 0  # not adjacent
    assert ea.put_backs([]) == 0


def _row(method, mode, seed, actions, won, **extra):
    return {"method": method, "mode": mode, "seed": seed, "episode_seed": seed * 10, "won": won,
            "steps": len(actions), "actions": actions, **extra}


def test_table_counts_shares_lengths_and_loops_per_method_and_mode():
    loop = ["take book 1 from shelf 2", "move book 1 to shelf 2"] * 3
    rows = [_row("bc", "deterministic", 1, ["go to shelf 1", "open drawer 1", "close drawer 1", "go to desk 1"], True),
            _row("bc", "deterministic", 2, ["look", *loop], False),
            _row("bc+ppo", "stochastic", 1, ["go to shelf 2", "take book 1 from shelf 2", "go to desk 1",
                                             "move book 1 to desk 1"], True)]
    lines = ea.table(rows, max_kinds=3)  # 11 distinct texts > 3: first words
    assert lines[0][:6] == ["bc", "deterministic", 2, 1, "4.0", "7.0"]
    assert lines[0][6].startswith("take 27%, move 27%, go 18%")  # 3 / 11, 3 / 11, 2 / 11
    assert lines[0][7:] == ["1.50", "1/2"]
    assert lines[1][:4] == ["bc+ppo", "stochastic", 1, 1] and lines[1][5] == "–" and lines[1][7:] == ["0.00", "0/1"]
    whole = ea.table([_row("x", "stochastic", 1, ["turn left", "turn left", "turn right", "go forward"], False)])
    assert whole[0][6] == "turn left 50%, turn right 25%, go forward 25%"  # few texts: whole texts


def test_main_keeps_held_out_options_apart_and_names_bad_input(tmp_path, capsys):
    with open(tmp_path / "episodes.jsonl", "w") as f:
        f.write(json.dumps(_row("bc", "stochastic", 1, ["look"], False)) + "\n")
        f.write(json.dumps(_row("bc", "stochastic", 1, ["go to desk 1"], True, eval_env_kwargs='{"split": "x"}')) + "\n")
        f.write(json.dumps({"method": "bc", "mode": "none", "seed": 3}) + "\n")  # no evaluation: skipped
    ea.main(["--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "1 held-out episodes on the training options, seeds 1" in out
    assert '1 held-out episodes on {"split": "x"}' in out
    with pytest.raises(ValueError, match="--out: no episodes.jsonl"):
        ea.main(["--out", str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="no held-out episodes with actions"):
        ea.main(["--out", str(tmp_path), "--seeds", "7"])
