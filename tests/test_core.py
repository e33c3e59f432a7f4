"""The text-env protocol itself (echorl_envs.core), on a tiny env defined here for the purpose."""

from __future__ import annotations

import gymnasium as gym
import pytest

import echorl_envs
from echorl_envs.core import (
    DatasetTextEnv,
    InvalidAction,
    Transition,
    build_once,
    cache_root,
    match_action,
    normalize_action,
    to_printable,
)


class Counter(DatasetTextEnv):
    """Reach the item's target by 'add one' / 'add two'; 'Stop' ends the episode."""

    TARGETS = [3, 5, 8]

    def __init__(self, render_mode=None):
        super().__init__(render_mode=render_mode)
        self.value = 0
        self.target = 0
        self.index = 0

    @property
    def num_tasks(self):
        return len(self.TARGETS)

    def _reset_episode(self, options):
        self.index = self._select_index(options)
        self.target, self.value = self.TARGETS[self.index], 0
        return Transition(f"value {self.value}", info={"task_id": f"counter/{self.index}"})

    def _admissible(self):
        return ["add one", "add two", "Stop"]

    def _apply(self, action):
        if action == "Stop":
            return Transition("stopped", terminated=True)
        step = 1 if action == "add one" else 2
        if self.value + step > self.target:
            raise InvalidAction(f"adding would pass the target {self.target}")
        self.value += step
        won = self.value == self.target
        return Transition(f"value {self.value}", reward=float(won), terminated=won, won=won)

    def _task(self):
        return f"reach {self.target}"

    def _expert(self):
        return "add two" if self.target - self.value >= 2 else "add one"


def test_normalize_and_match():
    assert normalize_action("  Go   Forward. ") == "go forward"
    assert normalize_action('"pick up"!') == "pick up"
    adm = ["go forward", "turn left"]
    assert match_action("GO FORWARD!", adm).action == "go forward"
    assert not match_action("forward", adm).ok
    amb = match_action("open door", ["Open door", "open Door"])
    assert not amb.ok and "ambiguous" in amb.reason
    assert not match_action(None, adm).ok and "string" in match_action(None, adm).reason
    assert not match_action("", adm).ok


def test_to_printable_escapes():
    assert to_printable("caf\u00e9\x00") == "caf\\xe9\\x00"
    assert to_printable("plain\ntext") == "plain\ntext"


def test_step_semantics():
    env = Counter()
    obs, info = env.reset(options={"index": 1})
    assert obs == "value 0" and info["task"] == "reach 5" and info["task_id"] == "counter/1"
    assert info["expert_action"] == "add two" and info["step"] == 0
    obs, r, term, trunc, info = env.step("ADD TWO.")
    assert (obs, r, term, info["invalid_action"], info["step"]) == ("value 2", 0.0, False, False, 1)
    obs, r, term, trunc, info = env.step("jump")
    assert info["invalid_action"] and r == 0.0 and not term and info["step"] == 2
    assert "'jump' is not an admissible action" in obs and "add one" in obs
    obs, r, term, trunc, info = env.step(123)
    assert info["invalid_action"] and "string" in obs
    env.step("add two")
    obs, r, term, trunc, info = env.step("add two")  # would pass the target: the hook rejects it
    assert info["invalid_action"] and "pass the target" in obs and info["step"] == 5
    obs, r, term, trunc, info = env.step("add one")
    assert r == 1.0 and term and info["won"] and info["admissible_actions"] == [] and "expert_action" not in info
    obs, r, term, trunc, info = env.step("add one")
    assert info["invalid_action"] and "episode is over" in obs


def test_reset_errors_and_determinism():
    env = Counter()
    with pytest.raises(ValueError, match="did you mean 'index'"):
        env.reset(options={"indx": 0})
    with pytest.raises(ValueError, match=r"options\['index'\] must be in \[0, 3\)"):
        env.reset(options={"index": 3})
    ids = [env.reset(seed=s)[1]["task_id"] for s in range(10)]
    assert ids == [Counter().reset(seed=s)[1]["task_id"] for s in range(10)]
    assert len(set(ids)) > 1
    with pytest.raises(gym.error.ResetNeeded):
        Counter().step("add one")


def test_render_mode_validation():
    env = Counter(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    with pytest.raises(ValueError, match="render_mode"):
        Counter(render_mode="human")


def test_unknown_id_suggests_close_match():
    if not echorl_envs.env_ids():
        pytest.skip("no env registered yet")
    good = echorl_envs.env_ids()[0]
    with pytest.raises(ValueError, match="did you mean"):
        echorl_envs.make(good.replace("-v0", "-v1"))
    with pytest.raises(ValueError, match="unknown environment id"):
        echorl_envs.entry("Nope")


def test_cache_root_and_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env" and cache_root(tmp_path / "arg") == tmp_path / "arg"
    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "game.txt").write_text("built")

    folder = tmp_path / "games" / "seed_1"
    assert build_once(folder, build, "game.txt") == folder / "game.txt"
    assert build_once(folder, build, "game.txt") == folder / "game.txt"  # the second call finds it
    assert len(calls) == 1 and (folder / "game.txt").read_text() == "built"

    def fails(tmp):
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        build_once(tmp_path / "games" / "seed_2", fails, "game.txt")
    assert sorted(p.name for p in (tmp_path / "games").iterdir()) == ["seed_1"]  # no half-built or temporary folder

    def loses_the_race(tmp):  # another worker renames its copy into place while this one builds
        build(tmp)
        (folder.parent / "seed_3").mkdir()
        (folder.parent / "seed_3" / "game.txt").write_text("theirs")

    assert build_once(folder.parent / "seed_3", loses_the_race, "game.txt").read_text() == "theirs"
    assert sorted(p.name for p in (tmp_path / "games").iterdir()) == ["seed_1", "seed_3"]
