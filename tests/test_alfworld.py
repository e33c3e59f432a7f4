"""ALFWorld on alfworld's real engine: generator, expert, random baseline, loader, aliases, cleanup."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest

import echorl_envs  # noqa: F401  (registers the ids)
from echorl_envs.alfworld import (
    TASK_TYPES,
    ALFWorldEnv,
    GeneratorConfig,
    find_games,
    generate_dataset,
    make_game_spec,
)
from echorl_envs.alfworld.engine import legacy_put
from echorl_envs.alfworld.env import resolve_data_path

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def play(env: ALFWorldEnv, index: int, policy: str, rng: np.random.Generator, max_steps: int = 50):
    """Return (won_at_reset, won, steps) for the expert or a uniformly random admissible agent."""
    _, info = env.reset(options={"index": index})
    won0 = info["won"]
    for t in range(1, max_steps + 1):
        adm = info["admissible_actions"]
        a = info["expert_action"] if policy == "expert" else adm[int(rng.integers(len(adm)))]
        _, r, term, _, info = env.step(a)
        if term:
            assert r == 1.0 and info["won"]
            return won0, True, t
    return won0, False, max_steps


def test_generator_is_deterministic_and_avoids_won_at_start():
    a = make_game_spec("pick_and_place_simple", 3)
    b = make_game_spec("pick_and_place_simple", 3)
    c = make_game_spec("pick_and_place_simple", 4)
    assert a == b and a != c
    for tt in TASK_TYPES.values():
        for seed in range(20):
            s = make_game_spec(tt, seed)
            targets = [o for o, cls in s.objects.items() if cls == s.object_target]
            assert len(targets) >= (2 if tt == "pick_two_obj_and_place" else 1)
            for o in targets:  # never starts inside the goal receptacle type
                assert s.receptacles[s.placement[o]] != s.parent_target
            # sinks carry alfworld's Sink|...|SinkBasin id (the Demangler names them "sinkbasin N")
            for rid, cls in s.receptacles.items():
                if cls == "SinkBasin":
                    assert rid.startswith("Sink|") and rid.endswith("|SinkBasin")


def test_generator_config_errors_name_the_field():
    with pytest.raises(ValueError, match="min_receptacles"):
        GeneratorConfig(min_receptacles=2)
    with pytest.raises(ValueError, match="open_prob"):
        GeneratorConfig(open_prob=1.5)
    with pytest.raises(ValueError, match="did you mean 'PickAndPlace'"):
        ALFWorldEnv(task_types="PickAndPlaec")


@pytest.mark.parametrize("name", list(TASK_TYPES))
def test_expert_wins_one_game_per_type(name, tmp_path):
    env = ALFWorldEnv(task_types=name, num_games=1, cache_dir=tmp_path)
    try:
        won0, won, steps = play(env, 0, "expert", np.random.default_rng(0))
        assert not won0 and won and steps >= 2
        obs, info = env.reset(options={"index": 0})
        assert info["task_type"] == TASK_TYPES[name]
        assert info["task"] and f"Your task is to: {info['task']}" in obs
    finally:
        env.close()
    assert not list(tmp_path.rglob(".tmp-*")), "temporary game directories leaked"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TASK_TYPES))
def test_expert_sweep_vs_random(name, tmp_path):
    env = ALFWorldEnv(task_types=name, num_games=10, cache_dir=tmp_path)
    rng = np.random.default_rng(0)
    try:
        expert = [play(env, i, "expert", rng) for i in range(10)]
        random = [play(env, i, "random", rng) for i in range(10)]
    finally:
        env.close()
    assert not any(w0 for w0, _, _ in expert + random)
    assert sum(w for _, w, _ in expert) == 10
    assert sum(w for _, w, _ in random) <= 3


def test_action_aliases_and_invalid_feedback(tmp_path):
    env = ALFWorldEnv(task_types="PickAndPlace", num_games=1, cache_dir=tmp_path)
    try:
        _, info = env.reset(options={"index": 0})
        goto = next(a for a in info["admissible_actions"] if a.startswith("go to "))
        obs, r, _, _, info = env.step("  Go To " + goto[6:].upper() + ". ")
        assert not info["invalid_action"] and obs.startswith("You arrive at")
        obs, r, _, _, info = env.step("fly to the moon")
        assert info["invalid_action"] and r == 0.0 and "Admissible actions" in obs
        # replay the expert until it holds the object, then place it with the legacy spelling
        while True:
            a = info["expert_action"]
            if a.startswith("move "):
                obj, rec = a[5:].split(" to ")
                obs, r, term, _, info = env.step(f"put {obj} in/on {rec}")
                assert not info["invalid_action"] and obs.startswith("You move the")
                break
            _, _, term, _, info = env.step(a)
            assert not term
    finally:
        env.close()
    assert legacy_put("move apple 1 to fridge 1") == "put apple 1 in/on fridge 1"


@pytest.mark.parametrize("offer_help", [True, False])
def test_help_is_offered_as_alfworld_does_or_dropped_as_verl_agent_does(offer_help, tmp_path):
    env = ALFWorldEnv(task_types="PickAndPlace", num_games=1, cache_dir=tmp_path, offer_help=offer_help)
    try:
        _, info = env.reset(options={"index": 0})
        before = info["admissible_actions"]
        assert ("help" in before) == offer_help and "look" in before
        obs, r, term, _, info = env.step("help")
        assert info["invalid_action"] == (not offer_help) and r == 0.0 and not term
        if offer_help:  # alfworld's command list; the room is unchanged
            assert "go to" in obs and info["admissible_actions"] == before
        else:
            assert "Admissible actions" in obs and "help" not in info["admissible_actions"]
    finally:
        env.close()


def test_pickle_midepisode_continues_identically(tmp_path):
    env = ALFWorldEnv(task_types="PickCoolAndPlace", num_games=1, cache_dir=tmp_path)
    try:
        _, info = env.reset(options={"index": 0})
        for _ in range(3):
            _, _, _, _, info = env.step(info["expert_action"])
        clone = pickle.loads(pickle.dumps(env))
        a = info["expert_action"]
        o1, o2 = env.step(a), clone.step(a)
        assert o1[:4] == o2[:4] and o1[4]["expert_action"] == o2[4]["expert_action"]
        clone.close()
    finally:
        env.close()


def test_loader_on_generated_json_2_1_1_tree(tmp_path):
    root = tmp_path / "alfworld_data"
    types = ["pick_and_place_simple", "pick_heat_then_place_in_recep"]
    made = generate_dataset(root, games_per_type=1, splits=("train", "valid_seen"), task_types=types)
    assert len(made) == 4
    assert all(p.name == "game.tw-pddl" and p.parent.parent.parent.parent.name == "json_2.1.1" for p in made)
    # alfworld's discovery rules: other task types, unsolvable and movable trajectories are skipped
    bad = made[0].parent.parent.parent / "pick_and_place_with_movable_recep-X-None-Y-1" / "trial_x"
    bad.mkdir(parents=True)
    (bad / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    (bad / "game.tw-pddl").write_text(json.dumps({"solvable": True}))
    unsolv = made[1].parent.parent / "trial_unsolvable"
    unsolv.mkdir()
    (unsolv / "traj_data.json").write_text((made[1].parent / "traj_data.json").read_text())
    (unsolv / "game.tw-pddl").write_text(json.dumps({**json.loads(made[1].read_text()), "solvable": False}))
    train = find_games(root, "train", types)
    assert sorted(train) == sorted(p for p in made if "/train/" in str(p))
    assert find_games(root, "eval", types[:1]) == [p for p in made if "/valid_seen/" in str(p) and types[0] in str(p)]
    env = ALFWorldEnv(task_types="all", split="train", data_path=root)
    try:
        assert env.num_tasks == 2
        won0, won, _ = play(env, 1, "expert", np.random.default_rng(0))
        assert not won0 and won
    finally:
        env.close()
    with pytest.raises(ValueError, match="no solvable ALFWorld games"):
        ALFWorldEnv(task_types="LookAtInLight", data_path=root)


def test_alfworld_data_variable_is_used_and_a_missing_folder_is_an_error(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "such" / "folder"
    monkeypatch.setenv("ALFWORLD_DATA", str(missing))
    with pytest.raises(ValueError, match=r"ALFWORLD_DATA='.*/no/such/folder' is not a folder .*unset ALFWORLD_DATA"):
        ALFWorldEnv(task_types="PickAndPlace")
    with pytest.raises(ValueError, match=r"ALFWORLD_DATA='.*/no/such/folder' is not a folder"):
        gym.make("EchoRL/ALFWorld-PickAndPlace-v0")
    with pytest.raises(ValueError, match=r"data_path='relative/no/such' is not a folder .*omit data_path"):
        ALFWorldEnv(task_types="PickAndPlace", data_path="relative/no/such")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("ALFWORLD_DATA", str(empty))
    with pytest.raises(ValueError, match=r"no solvable ALFWorld games .* under ALFWORLD_DATA="):
        ALFWorldEnv(task_types="PickAndPlace")
    root = tmp_path / "alfworld_data"  # a real json_2.1.1 tree: the variable points the env at its games
    made = generate_dataset(root, games_per_type=1, splits=("train",), task_types=["pick_and_place_simple"])
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    env = ALFWorldEnv(task_types="PickAndPlace")
    try:
        assert env.num_tasks == 1 and env.game_path(0) == made[0]
    finally:
        env.close()
    monkeypatch.setenv("ALFWORLD_DATA", "")  # set but empty: the generator, as when unset
    assert resolve_data_path(None) == (None, "data_path")
    monkeypatch.setattr("echorl_envs.alfworld.env.ALFWORLD_DEFAULT_DATA", empty)
    monkeypatch.setenv("ALFWORLD_DATA", str(empty))  # what importing alfworld sets: counts once it holds data
    assert resolve_data_path(None) == (None, "data_path")
    (empty / "json_2.1.1").mkdir()
    assert resolve_data_path(None) == (empty, "ALFWORLD_DATA")


def composition(spec_or_traj) -> frozenset[str]:
    """The receptacle classes of a generated room (a GameSpec, or the ``echorl.spec`` of a written traj_data)."""
    receptacles = spec_or_traj["receptacles"] if isinstance(spec_or_traj, dict) else spec_or_traj.receptacles
    return frozenset(receptacles.values())


def test_valid_unseen_shares_the_training_templates_and_the_template_split_holds_them_out():
    """Generated ``valid_unseen`` differs from ``train`` by seed only: every game's room template is a training one.
    ``valid_unseen_templates`` rooms are disjoint from training rooms by construction (each held-out template's
    always-present receptacle classes fit in no training template) and on generated specs of every task type."""
    from echorl_envs.alfworld.games import SPLIT_SEED_BASE
    from echorl_envs.alfworld.scenes import HELD_OUT_ROOMS_FOR_TASK, ROOMS_FOR_TASK

    train_templates = {r for rooms in ROOMS_FOR_TASK.values() for r in rooms}
    held_templates = {r for rooms in HELD_OUT_ROOMS_FOR_TASK.values() for r in rooms}
    assert set(HELD_OUT_ROOMS_FOR_TASK) == set(TASK_TYPES.values())
    assert not {r.name for r in held_templates} & {r.name for r in train_templates}
    for h in held_templates:  # no training room of any seed can hold a held-out room's mandatory classes
        mandatory = {c for c, lo, _ in h.receptacles if lo >= 1}
        for t in train_templates:
            assert not mandatory <= {c for c, _, _ in t.receptacles}, (h.name, t.name)
        plans = range(h.scene_base + 1, h.scene_base + 31)
        assert all(t.scene_base + 30 < plans.start or plans.stop <= t.scene_base + 1 for t in train_templates)
    for tt in TASK_TYPES.values():
        train = [make_game_spec(tt, SPLIT_SEED_BASE["train"] + k) for k in range(150)]
        unseen = [make_game_spec(tt, SPLIT_SEED_BASE["valid_unseen"] + k) for k in range(30)]
        held = [make_game_spec(tt, SPLIT_SEED_BASE["valid_unseen_templates"] + k, held_out_templates=True)
                for k in range(30)]
        assert {s.scene for s in unseen} <= {s.scene for s in train}, tt  # the same templates: seeds differ only
        assert not {s.scene for s in held} & {s.scene for s in train}, tt
        assert not {s.scene_num for s in held} & {s.scene_num for s in train}, tt
        assert not {composition(s) for s in held} & {composition(s) for s in train}, tt
        assert len({s.scene for s in held}) == len(HELD_OUT_ROOMS_FOR_TASK[tt]), tt  # every held-out room is drawn


def test_template_split_games_play_through_the_engine_and_share_no_room_with_training(tmp_path):
    held = ALFWorldEnv(task_types="PickAndPlace", split="valid_unseen_templates", num_games=2, cache_dir=tmp_path)
    train = ALFWorldEnv(task_types="PickAndPlace", split="train", num_games=1, cache_dir=tmp_path)
    try:
        for i in range(2):
            won0, won, steps = play(held, i, "expert", np.random.default_rng(0))
            assert not won0 and won and steps >= 2
        rooms = {}
        for env in (held, train):
            trajs = [json.loads((env.game_path(i).parent / "traj_data.json").read_text())["echorl"]
                     for i in range(env.num_tasks)]
            rooms[env.split] = {(t["room"], composition(t["spec"])) for t in trajs}
        assert {r for r, _ in rooms["valid_unseen_templates"]} <= {"studio", "ensuite", "den"}
        assert {r for r, _ in rooms["train"]} <= {"kitchen", "livingroom", "bedroom", "bathroom"}
        assert not {c for _, c in rooms["valid_unseen_templates"]} & {c for _, c in rooms["train"]}
    finally:
        held.close()
        train.close()
    with pytest.raises(ValueError, match="split='valid_unseen_templates' exists only for generated games"):
        find_games(tmp_path, "valid_unseen_templates", ["pick_and_place_simple"])
    with pytest.raises(ValueError, match="did you mean 'valid_unseen_templates'"):
        ALFWorldEnv(task_types="PickAndPlace", split="valid_unseen_template")
