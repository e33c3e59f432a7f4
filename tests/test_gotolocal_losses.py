"""benchmarks/gotolocal_losses.py: held-out BabyAI episodes replayed in the real env beside BabyAI's bot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "gotolocal_losses", Path(__file__).resolve().parents[1] / "benchmarks" / "gotolocal_losses.py")
gl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gl)

ENV, KW = "EchoRL/BabyAI-GoToLocal-v0", {"goal_line": True}


def test_relation_reads_the_goal_line_and_the_cell_ahead():
    obs = ("Target: the red key, 2 steps ahead and 1 to the left.\nYou see a red key.\n"
           "Ahead: a grey ball right next to you.\nLeft: a wall.")
    assert gl.relation(obs) == "ahead-left, blocked"
    assert gl.relation("Target: the red key, 2 steps to the right.\nAhead: 3 steps free, then a wall.") == "right"
    assert gl.relation("Target: the blue box is not in view.\nAhead: 1 step free.") == "not in view"


def _bot_actions(seed: int) -> list[str]:
    import gymnasium as gym

    env = gym.make(ENV, max_episode_steps=24, **KW)
    _, info = env.reset(seed=seed)
    actions = []
    for _ in range(24):
        actions.append(info["expert_action"])
        _, _, terminated, truncated, info = env.step(actions[-1])
        if terminated or truncated:
            return actions
    raise AssertionError("the bot did not finish")


def test_the_bots_own_episode_replays_as_a_win_in_full_agreement():
    actions = _bot_actions(1410000)
    got = gl.replay(ENV, KW, 24, 1410000, actions)
    assert got["won"] and len(got["steps"]) == len(actions)
    assert all(s["policy"] == s["bot"] for s in got["steps"])


def test_spinning_in_place_is_a_lost_cycle_the_bot_disagrees_with():
    got = gl.replay(ENV, KW, 24, 1410000, ["turn left"] * 24)
    assert not got["won"] and len(got["steps"]) == 24
    poses = [s["pose"] for s in got["steps"]]
    assert len(set(poses)) == 4 and poses[0] == poses[4]  # four headings on one cell
    assert any(s["bot"] != "turn left" for s in got["steps"])


def test_report_counts_a_spin_as_a_lost_cycle_and_the_bots_episode_as_agreement():
    bot = _bot_actions(1410000)
    vocab = sorted(set(bot) | {"turn left"})
    row = {"seed": 1310, "vocab": vocab,
           "command": "-m echorl_agent.cli train-llm --recipe gotolocal-sft-rl --seed 1310",
           "phases": {"after_bc": {"greedy": {"episode_seed0": 1410000, "won": "10",
                                              "actions": [[vocab.index(a) for a in bot],
                                                          [vocab.index("turn left")] * 24]}}}}
    lines, confusions = gl.report([row], "after_bc")
    (line,) = lines
    assert line[:2] == ["after_bc", "greedy"]
    n = len(bot) + 24
    agree = len(bot) + sum(1 for s in gl.replay(ENV, KW, 24, 1410001, ["turn left"] * 24)["steps"]
                           if s["bot"] == "turn left")
    assert line[2] == f"{agree / n:.2f}"
    assert line[4] == 1 and line[6] == 1  # one loss, and it cycles
    assert all(k[0] == "greedy" and k[2] == "turn left" and k[3] != "turn left" for k in confusions)


def test_the_replay_env_is_the_runs_own_env_kwargs_and_step_cap_over_the_recipes():
    import shlex

    base = ["-m", "echorl_agent.cli", "train-llm", "--recipe", "gotolocal-sft-rl", "--seed", "1310"]
    assert gl._recipe_env({"command": shlex.join(base)}) == (ENV, KW, 24)
    row = {"command": shlex.join(base + ["--env-kwargs", '{"goal_line": true, "expert_kind": "view"}',
                                         "--max-steps", "32"])}  # as recipe_study writes command.txt
    assert gl._recipe_env(row) == (ENV, {"goal_line": True, "expert_kind": "view"}, 32)
