"""benchmarks/gotolocal_memory_ceiling.py: planners with k observations of memory on the real GoToLocal env."""

import importlib.util
from pathlib import Path

import gymnasium as gym

import echorl_envs  # noqa: F401
from echorl_envs.minigrid.planner import view_plan, visible_cells

_spec = importlib.util.spec_from_file_location(
    "gotolocal_memory_ceiling", Path(__file__).resolve().parents[1] / "benchmarks" / "gotolocal_memory_ceiling.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)


def test_the_view_holds_what_the_observation_text_lists():
    env = gym.make(mc.ENV_ID, goal_line=True, expert=False)
    try:
        obs, _ = env.reset(seed=1410030)
        cells = visible_cells(env.unwrapped.raw)
        seen = sorted(f"{c} {t}" for t, c in (v for v in cells.values() if v is not None) if t != "wall")
        # "You see a red ball ...; a grey key ...; ..." names each object of the view once
        listed = obs.split("You see ")[1].split("\n")[0].count(";") + 1
        assert len(seen) == listed
        assert "blue key" in seen  # the target: "Target: the blue key, 4 steps ahead and 3 to the left."
    finally:
        env.close()


def test_the_first_planned_step_is_a_shortest_path_step():
    env = gym.make(mc.ENV_ID, goal_line=True, expert=False)
    try:
        obs, _ = env.reset(seed=1410030)  # facing east, target 4 ahead and 3 to the left, a ball 3 ahead
        raw = env.unwrapped.raw
        assert view_plan(raw, [visible_cells(raw)]) == 2  # go forward
        assert view_plan(raw, [{}]) is None  # no target among the known cells: the caller searches
    finally:
        env.close()


def test_one_remembered_observation_wins_an_episode_the_memoryless_planner_loses_in_a_cycle():
    # seed 1410030 (a held-out episode of study seed 1310): the path leaves the target behind the agent's view, and
    # the memoryless planner turns back to look at it for ever; the bot, with its memory, wins in 11 steps
    assert mc.play("bot", 1410030) == (True, 11)
    assert mc.play("plan", 1410030, memory=0) == (False, mc.MAX_STEPS)
    won, steps = mc.play("plan", 1410030, memory=1)
    assert won and steps < mc.MAX_STEPS
    assert mc.play("bot-fresh", 1410030) == (False, mc.MAX_STEPS)


def test_picking_up_the_object_in_the_way_wins_it_without_memory():
    # what RL from BC-1024 learned: lift the object between the agent and the target, and keep it
    won, steps = mc.play("plan", 1410030, memory=0, pickup=True)
    assert won and steps < mc.MAX_STEPS
    env = gym.make(mc.ENV_ID, goal_line=True, expert=False)
    try:
        env.reset(seed=1410030)
        raw = env.unwrapped.raw
        for a in ("go forward", "go forward"):  # target 2 ahead and 3 to the left, a blue ball right in front
            env.step(a)
        view = [visible_cells(raw)]
        assert view_plan(raw, view, pickup=True) == 3  # pick up
        assert view_plan(raw, view, pickup=False) != 3
    finally:
        env.close()
