"""MiniWoB++ in headless Chromium: the text layer (no browser) and real-browser behaviour (skipped without one)."""

from __future__ import annotations

import os
import warnings

import psutil
import pytest

import echorl_envs
from echorl_envs.miniwob import EXPERTS, TASKS, chromium_missing_reason
from echorl_envs.miniwob.page import Command, CommandError, Element, admissible, parse_command, render

NO_BROWSER = chromium_missing_reason()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))

ELEMENTS = [
    Element(4, "div", 0, id="form"),
    Element(5, "input_text", 1, value="", id="tt", focused=True, is_leaf=True),
    Element(6, "button", 1, text="Submit", id="subbtn", is_leaf=True),
    Element(-1, "t", 1, text="a note"),
    Element(7, "select", 1, options=(("Red", True), ("Blue", False))),
]


def test_registry_has_twenty_tasks_of_every_kind():
    ids = echorl_envs.env_ids("miniwob")
    assert len(ids) == len(TASKS) >= 20
    assert {kind for kind, _ in TASKS.values()} == {"click", "select", "type", "form"}
    assert len(EXPERTS) >= 17 and set(EXPERTS) <= set(TASKS)


def test_render_is_compact_and_exact():
    assert render("Do it.", ELEMENTS) == (
        'Task: Do it.\nPage:\n  [4] div #form\n    [5] input_text #tt value="" (focused)\n'
        '    [6] button #subbtn "Submit"\n    "a note"\n    [7] select options=[*"Red", "Blue"]'
    )


def test_admissible_lists_clicks_field_types_options_and_keys():
    adm = admissible(ELEMENTS, [("target", "Bob")])
    assert adm == ["click 5", "click 6", "click 7", 'type 5 "Bob"', 'select 7 "Red"', 'select 7 "Blue"',
                   "press enter", "press tab", "press backspace", "press ctrl+a"]


@pytest.mark.parametrize(
    ("action", "expected"),
    [("click 6", Command("click", 6)), ("CLICK [6]", Command("click", 6)),
     ('type 5 "hello world"', Command("type", 5, "hello world")), ("type 5 'x\"y'", Command("type", 5, 'x"y')),
     ("press Enter", Command("press", None, "enter")), ("press q", Command("press", None, "q")),
     ('select 7 "Blue"', Command("select", 7, "Blue")), ("go north", None)],
)
def test_parse_command(action, expected):
    assert parse_command(action, ELEMENTS) == expected


@pytest.mark.parametrize(
    ("action", "message"),
    [("click 99", r"no element \[99\]"), ('type 6 "x"', "not a text field"), ("type 5", "needs a quoted text"),
     ('select 7 "Green"', "has no option"), ("press f13", "unknown key"), ('type 5 ""', "1 to 64"),
     ("click 6 now", "only a ref")],
)
def test_bad_commands_explain(action, message):
    with pytest.raises(CommandError, match=message):
        parse_command(action, ELEMENTS)


def test_unknown_task_suggests_close_match():
    with pytest.raises(ValueError, match="did you mean 'click-button'"):
        echorl_envs.miniwob.MiniWoBEnv(task="click-buton")


def _children_of_me() -> list[psutil.Process]:
    return psutil.Process(os.getpid()).children(recursive=True)


@needs_browser
def test_browser_is_lazy_and_expert_solves_forms_and_lists():
    """One browser per env, started at reset; the expert types, selects and submits (MiniWoB reward 1)."""
    for task in ("login-user", "choose-list"):
        env = echorl_envs.make(f"EchoRL/MiniWoB-{task}-v0", episode_seconds=120.0)
        try:
            assert not env.unwrapped.browser.started
            obs, info = env.reset(seed=4)
            assert env.unwrapped.browser.started and obs.startswith("Task: ")
            kinds, total = [], 0.0
            for _ in range(6):
                kinds.append(info["expert_action"].split()[0])
                obs, r, term, trunc, info = env.step(info["expert_action"])
                total += r
                if term or trunc:
                    break
            assert term and total == 1.0 and info["won"]
            assert kinds == (["type", "type", "click"] if task == "login-user" else ["select", "click"])
        finally:
            env.close()


@needs_browser
def test_invalid_actions_are_feedback_and_wrong_click_loses():
    env = echorl_envs.make("EchoRL/MiniWoB-click-test-2-v0", episode_seconds=120.0)
    try:
        obs, info = env.reset(seed=1)
        for bad in ("click 999", 'type 1 "x"', "dance", None):
            obs, r, term, trunc, info = env.step(bad)
            assert info["invalid_action"] and r == 0.0 and not term
        assert "no element [999]" in env.step("click 999")[0]
        wrong = next(a for a in info["admissible_actions"] if a.startswith("click") and a != info["expert_action"])
        assert wrong in ("click 4", "click 5")  # buttons ONE and TWO: the non-expert one is wrong
        obs, r, term, trunc, info = env.step(wrong)
        assert term and r == -1.0 and not info["won"] and obs.startswith("Episode over: MiniWoB reward -1.00")
    finally:
        env.close()


@needs_browser
def test_close_leaves_no_browser_process_and_crash_restarts_with_warning():
    before = {p.pid for p in _children_of_me()}
    env = echorl_envs.make("EchoRL/MiniWoB-click-test-v0", episode_seconds=120.0)
    env.reset(seed=0)
    pids = env.unwrapped.browser.pids
    assert len(pids) >= 2  # chromedriver + the chromium tree it started
    assert any("chrom" in psutil.Process(p).name() for p in pids)
    for p in pids:  # crash: kill the whole browser tree
        try:
            psutil.Process(p).kill()
        except psutil.Error:
            pass
    with pytest.warns(RuntimeWarning, match="stopped responding; starting a new one"):
        obs, info = env.reset(seed=0)
    assert info["expert_action"] == "click 4" and env.step("click 4")[1] == 1.0
    new_pids = env.unwrapped.browser.pids
    assert set(new_pids).isdisjoint(pids)
    env.close()
    env.close()  # idempotent
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in new_pids if psutil.pid_exists(p)], timeout=10)
    assert not alive, f"browser processes left after close(): {alive}"
    left = [p for p in _children_of_me() if p.pid not in before]
    assert not left, f"child processes left (zombies?): {[(p.pid, p.name(), p.status()) for p in left]}"
    for p in pids + new_pids:
        assert not psutil.pid_exists(p) or psutil.Process(p).status() != psutil.STATUS_ZOMBIE


@needs_browser
def test_browser_error_mid_episode_truncates_instead_of_raising():
    env = echorl_envs.make("EchoRL/MiniWoB-click-button-v0", episode_seconds=120.0)
    try:
        _, info = env.reset(seed=2)
        env.unwrapped.browser.env.instance.driver.quit()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, r, term, trunc, info = env.step(info["expert_action"])
        assert trunc and not term and r == 0.0 and "browser_error" in info and "call reset()" in obs
    finally:
        env.close()
