"""MiniGrid/BabyAI text envs: descriptions on hand-placed grids, experts, reward parity with raw minigrid."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from minigrid.core.world_object import Ball, Box, Door, Key, Wall

import echorl_envs
from echorl_envs.minigrid import (
    ACTION_WORDS,
    MiniGridTextEnv,
    bfs_plan,
    describe_view,
    nav_distances,
    position_phrase,
)

IDS = echorl_envs.env_ids("minigrid")
RAW = {i: i.removeprefix("EchoRL/") for i in IDS}


def placed(agent_pos, agent_dir, objects=(), carrying=None, target=None):
    """An open 8x8 room (MiniGrid-Empty-8x8, walls made opaque) with the agent and objects placed by hand."""
    env = MiniGridTextEnv("MiniGrid-Empty-8x8-v0", expert=False)
    env.reset(seed=0)
    raw = env.raw
    raw.see_through_walls = False
    raw.grid.set(6, 6, None)  # remove the goal square: only what the test places is on the grid
    raw.agent_pos = np.array(agent_pos)
    raw.agent_dir = agent_dir
    for pos, obj in objects:
        raw.grid.set(*pos, obj)
    raw.carrying = carrying
    return describe_view(
        raw.gen_obs()["image"],
        raw.agent_dir,
        None if carrying is None else f"a {carrying.color} {carrying.type}",
        "test the description",
        target,
    )


# ----------------------------------------------------------------------------- descriptions
def test_position_phrases():
    assert position_phrase(2, -1) == "2 steps ahead and 1 to the left"
    assert position_phrase(1, 0) == "1 step ahead"
    assert position_phrase(0, 3) == "3 steps to the right"
    assert position_phrase(4, 2) == "4 steps ahead and 2 to the right"


def test_key_two_ahead_one_left_facing_north():
    # facing north (dir 3): ahead is -y, left is -x
    text = placed((4, 5), 3, [((3, 3), Key("red"))])
    assert "You see a red key 2 steps ahead and 1 to the left." in text
    assert "You are facing north. You are not carrying anything." in text


def test_key_two_ahead_one_left_facing_east():
    # facing east (dir 0): ahead is +x, left is -y
    text = placed((2, 4), 0, [((4, 3), Key("red"))])
    assert "a red key 2 steps ahead and 1 to the left" in text
    assert "You are facing east." in text


def test_target_line_names_the_nearest_matching_object():
    objects = [((3, 3), Key("red")), ((4, 4), Key("blue")), ((5, 2), Ball("red"))]
    # facing north from (4, 5): the blue key is right ahead, the red key 2 ahead and 1 left, the red ball 3 ahead and 1 right
    text = placed((4, 5), 3, objects, target=("key", "red"))
    lines = text.splitlines()
    assert lines[2] == "Target: the red key, 2 steps ahead and 1 to the left."
    assert lines[3].startswith("You see a blue key 1 step ahead; a red key 2 steps ahead and 1 to the left")
    assert placed((4, 5), 3, objects, target=("key", None)).splitlines()[2] == "Target: the key, 1 step ahead."
    assert placed((4, 5), 3, objects, target=("ball", "red")).splitlines()[2] == (
        "Target: the red ball, 3 steps ahead and 1 to the right.")
    assert placed((4, 5), 3, objects, target=("box", "green")).splitlines()[2] == "Target: the green box is not in view."
    # without a target the observation has no such line
    assert not any(line.startswith("Target:") for line in placed((4, 5), 3, objects).splitlines())


def test_goal_line_only_adds_the_target_line():
    plain = gym.make("EchoRL/BabyAI-GoToLocal-v0")
    goal = gym.make("EchoRL/BabyAI-GoToLocal-v0", goal_line=True)
    for seed in (100000, 100001, 100002):
        (o1, i1), (o2, i2) = plain.reset(seed=seed), goal.reset(seed=seed)
        for step in range(12):
            target = [line for line in o2.splitlines() if line.startswith("Target: ")]
            assert len(target) == 1 and [line for line in o2.splitlines() if line != target[0]] == o1.splitlines()
            name = i2["mission"].removeprefix("go to ").removeprefix("the ").removeprefix("a ")
            if "is not in view" not in target[0]:  # the named position is one of the "You see" entries
                where = target[0].removeprefix(f"Target: the {name}, ").removesuffix(".")
                assert f"{name} {where}" in o2
            else:
                assert f" {name} " not in o2.split("You see", 1)[1].split("\n", 1)[0] + " "
            a = i1["expert_action"] if step % 3 else "turn left"
            (o1, r1, t1, tr1, i1), (o2, r2, t2, tr2, i2) = plain.step(a), goal.step(a)
            assert (r1, t1, tr1) == (r2, t2, tr2)
            if t1 or tr1:
                break


def test_goal_line_needs_a_mission_naming_one_object():
    with pytest.raises(ValueError, match="goal_line"):
        MiniGridTextEnv("MiniGrid-Empty-5x5-v0", goal_line=True)
    env = MiniGridTextEnv("BabyAI-BossLevel-v0", goal_line=True, expert=False)
    with pytest.raises(ValueError, match="goal_line=True needs a mission naming one object"):
        env.reset(seed=1)  # "pick up a purple ball and open a red door"


def test_door_states_walls_and_carrying():
    text = placed(
        (4, 3),
        1,  # facing south: ahead +y, left +x, right -x
        [
            ((4, 4), Door("yellow", is_locked=True)),
            ((5, 3), Door("blue", is_open=True)),
            ((3, 3), Ball("green")),
        ],
        carrying=Key("purple"),
    )
    assert "You are carrying a purple key." in text
    assert "a locked yellow door 1 step ahead" in text
    assert "an open blue door 1 step to the left" in text
    assert "a green ball 1 step to the right" in text
    assert "Ahead: a locked yellow door right next to you." in text
    assert "Right: a green ball right next to you." in text
    # an open door does not block the ray: the doorway (x=5) and x=6 are free, then the outer wall (x=7)
    assert "Left: 2 steps free, then a wall." in text
    # the agent sees 3 cells to each side (7x7 view)
    assert "Left: 3 steps free up to the edge of your view." in placed((3, 3), 1)
    closed = placed((3, 3), 1, [((3, 4), Door("red"))])
    assert "Ahead: a closed red door right next to you." in closed


def test_wall_directly_ahead_and_occlusion():
    # facing west from x=1: the outer wall is right in front
    text = placed((1, 4), 2)
    assert "Ahead: a wall right next to you." in text
    assert "You see no objects." in text
    # a box behind a wall across the room is occluded (minigrid's process_vis): it must not be described
    hidden = placed((3, 5), 3, [*(((x, 4), Wall()) for x in range(1, 7)), ((3, 2), Box("red"))])
    assert "box" not in hidden
    assert "Ahead: a wall right next to you." in hidden


def test_exact_observation_empty_5x5():
    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    obs, info = env.reset(seed=0)
    assert obs == (
        "Mission: get to the green goal square.\n"
        "You are facing east. You are not carrying anything.\n"
        "You see a green goal square 2 steps ahead and 2 to the right.\n"
        "Ahead: 2 steps free, then a wall.\n"
        "Left: a wall right next to you.\n"
        "Right: 2 steps free, then a wall."
    )
    assert info["mission"] == info["task"] == "get to the green goal square"
    assert info["direction"] == 0 and info["agent_pos"] == (1, 1) and info["carrying"] is None
    assert info["admissible_actions"] == list(ACTION_WORDS)
    obs, *_ = env.step("Turn right.")
    assert obs.startswith("You turned right.\n")
    assert "You are facing south." in obs


def test_feedback_messages_doorkey():
    env = gym.make("EchoRL/MiniGrid-DoorKey-5x5-v0")
    obs, info = env.reset(seed=0)
    seen = []
    while not info["won"]:
        a = info["expert_action"]
        obs, r, term, trunc, info = env.step(a)
        seen.append((a, obs.splitlines()[0]))
    lines = dict(seen)
    assert lines["pick up"] == "You picked up a yellow key."
    assert lines["toggle"] == "You unlocked and opened the yellow door."
    assert obs.splitlines()[1].startswith("Mission complete! Reward ")
    assert r == pytest.approx(1 - 0.9 * len(seen) / 250)


def test_locked_door_without_key_and_bump():
    env = MiniGridTextEnv("MiniGrid-Empty-8x8-v0", expert=False)
    env.reset(seed=0)
    env.raw.grid.set(2, 1, Door("red", is_locked=True))  # agent starts at (1, 1) facing east
    obs, r, *_ = env.step("toggle")
    assert obs.startswith("The red door is locked: you need a red key to open it.")
    obs, *_ = env.step("forward")
    assert obs.startswith("You cannot move forward: a locked red door is in the way.")
    obs, *_ = env.step("drop")
    assert obs.startswith("You are not carrying anything to drop.")


def test_invalid_action_does_not_step_engine():
    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    env.reset(seed=1)
    raw = env.unwrapped.raw
    obs, r, term, trunc, info = env.step("fly away")
    assert info["invalid_action"] and r == 0.0 and not term and not trunc
    assert raw.step_count == 0 and info["step"] == 1
    assert info["direction"] == raw.agent_dir and info["mission"] == raw.mission and info["carrying"] is None
    assert "turn left" in obs
    _, _, _, _, info = env.step("  PICKUP! ")
    assert not info["invalid_action"] and raw.step_count == 1


def test_unknown_env_id_suggests():
    with pytest.raises(ValueError, match="MiniGrid-DoorKey-5x5-v0"):
        MiniGridTextEnv("MiniGrid-DoorKey-5x5")


# ----------------------------------------------------------------------------- experts
def play(env_id: str, seed: int, policy: str, rng: np.random.Generator | None = None) -> tuple[bool, float]:
    env = gym.make(env_id, expert=policy == "expert")
    obs, info = env.reset(seed=seed)
    term = trunc = False
    ret = 0.0
    while not (term or trunc):
        a = (
            info["expert_action"]
            if policy == "expert"
            else ACTION_WORDS[int(rng.integers(len(ACTION_WORDS)))]
        )
        obs, r, term, trunc, info = env.step(a)
        ret += r
    return bool(info["won"]), ret


@pytest.mark.parametrize("env_id", IDS)
def test_expert_wins(env_id):
    seeds = range(20) if "BossLevel" in env_id or "OpenDoor" in env_id else range(40)
    wins = sum(play(env_id, s, "expert")[0] for s in seeds)
    assert wins >= 0.95 * len(seeds), f"{env_id}: expert won {wins}/{len(seeds)}"


@pytest.mark.parametrize(
    "env_id",
    [
        "EchoRL/MiniGrid-DoorKey-5x5-v0",
        "EchoRL/MiniGrid-FourRooms-v0",
        "EchoRL/MiniGrid-MultiRoom-N2-S4-v0",
        "EchoRL/BabyAI-GoToLocal-v0",
    ],
)
def test_random_agent_wins_less(env_id):
    rng = np.random.default_rng(0)
    rand = [play(env_id, s, "random", rng) for s in range(20)]
    expert = [play(env_id, s, "expert") for s in range(20)]
    assert sum(w for w, _ in rand) <= 10 and sum(w for w, _ in expert) >= 19
    assert np.mean([r for _, r in expert]) > np.mean([r for _, r in rand]) + 0.3


def test_bfs_plan_is_shortest_on_empty():
    env = MiniGridTextEnv("MiniGrid-Empty-5x5-v0", expert=False)
    env.reset(seed=0)  # agent (1,1) facing east, goal (3,3): 4 moves + 1 turn
    plan = bfs_plan(env.raw)
    assert len(plan) == 5 and plan.count(2) == 4


def test_nav_table_matches_bfs_plan_lengths():
    """The O(1) navigation table and the BFS planner agree on the shortest distance from every state."""
    env = MiniGridTextEnv("MiniGrid-FourRooms-v0", expert=False)
    env.reset(seed=3)
    raw = env.raw
    nav = nav_distances(raw)
    assert nav is not None
    checked = 0
    for x in range(1, raw.width - 1, 3):
        for y in range(1, raw.height - 1, 2):
            if raw.grid.get(x, y) is not None:
                continue
            for d in range(4):
                raw.agent_pos, raw.agent_dir = np.array((x, y)), d
                assert len(bfs_plan(raw)) == nav[(x, y, d)]
                checked += 1
    assert checked > 50
    # a closed door disables the table (toggling may shorten paths): the BFS planner takes over
    doorkey = MiniGridTextEnv("MiniGrid-DoorKey-5x5-v0", expert=False)
    doorkey.reset(seed=0)
    assert nav_distances(doorkey.raw) is None


def test_expert_recovers_after_deviations():
    for env_id in ("EchoRL/MiniGrid-DoorKey-5x5-v0", "EchoRL/MiniGrid-FourRooms-v0"):
        env = gym.make(env_id)
        rng = np.random.default_rng(0)
        wins = 0
        for seed in range(10):
            _, info = env.reset(seed=seed)
            for _ in range(12):  # a random prefix (pickups, drops, toggles included), then the expert
                _, _, term, trunc, info = env.step(ACTION_WORDS[int(rng.integers(7))])
                if term or trunc:
                    break
            while not (term or trunc):
                _, _, term, trunc, info = env.step(info["expert_action"])
            wins += info["won"]
        assert wins >= 9, f"{env_id}: {wins}/10"


def test_babyai_bot_state_survives_pickle():
    env = gym.make("EchoRL/BabyAI-PickupLoc-v0")
    obs, info = env.reset(seed=3)  # a 10-step expert episode
    for _ in range(3):
        obs, *_, info = env.step(info["expert_action"])
    copy = pickle.loads(pickle.dumps(env))
    a, b = info, info
    for _ in range(200):
        _, ra, ta, tra, a = env.step(a["expert_action"])
        _, rb, tb, trb, b = copy.step(b["expert_action"])
        assert (ra, ta, tra, a.get("expert_action")) == (rb, tb, trb, b.get("expert_action"))
        if ta or tra:
            break
    assert a["won"] and b["won"]


# ----------------------------------------------------------------------------- parity with raw minigrid
@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("driver", ["random", "expert"])
def test_rewards_match_raw_env(env_id, driver):
    """Same seed and action indices: identical rewards, termination, truncation and agent state."""
    n = 400
    ours = gym.make(env_id, expert=driver == "expert")
    raw = gym.make(RAW[env_id])
    rng = np.random.default_rng(1)
    seed = 7
    obs, info = ours.reset(seed=seed)
    raw_obs, _ = raw.reset(seed=seed)
    total = 0.0
    for _ in range(n):
        if driver == "expert":
            a = ACTION_WORDS.index(info["expert_action"])
        else:
            a = int(rng.integers(len(ACTION_WORDS)))
        obs, r, term, trunc, info = ours.step(ACTION_WORDS[a])
        raw_obs, rr, rterm, rtrunc, _ = raw.step(a)
        assert (r, term, trunc) == (pytest.approx(float(rr)), rterm, rtrunc)
        assert info["direction"] == raw_obs["direction"] and info["task"] == raw_obs["mission"]
        assert info["agent_pos"] == tuple(int(v) for v in raw.unwrapped.agent_pos)
        total += r
        if term or trunc:
            seed += 1
            obs, info = ours.reset(seed=seed)
            raw.reset(seed=seed)
    if driver == "expert":
        assert total > 0  # the expert-driven run reached at least one rewarded success
