"""Registry-driven suite: every registered id gets check_env, determinism, pickling, vectorisation and fuzzing.

A new environment added to ``echorl_envs.ENVS`` is covered here automatically.
"""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echorl_envs
from echorl_envs.core import INFO_KEYS, normalize_action
from tests.conftest import MINIWOB_FAST_IDS, REGISTRY_MAKE_KWARGS, registry_skip_reason

IDS = echorl_envs.env_ids()
#: Browser-backed MiniWoB ids beyond MINIWOB_FAST_IDS are marked slow (each test starts real Chromiums).
PARAMS = [
    pytest.param(i, marks=pytest.mark.slow) if i.startswith("EchoRL/MiniWoB-") and i not in MINIWOB_FAST_IDS else i
    for i in IDS
]
#: Gymnasium's ``check_env`` resets a text engine many times (10-25 s per ALFWorld or TextWorld id on 2 busy cores);
#: by default it runs on one id per engine (the task-type variants share their family's engine code, and every other
#: registry test below still runs on each of them); the slow suite runs it on all of them.
CHECK_ENV_DEFAULT = ("EchoRL/ALFWorld-v0", "EchoRL/TextWorld-Simple-v0")
CHECK_ENV_PARAMS = [
    pytest.param(i, marks=pytest.mark.slow)
    if i.startswith(("EchoRL/ALFWorld-", "EchoRL/TextWorld-")) and i not in CHECK_ENV_DEFAULT else p
    for i, p in zip(IDS, PARAMS, strict=True)
]


def make(env_id: str, **extra):
    reason = registry_skip_reason(env_id)
    if reason is not None:
        pytest.skip(reason)
    kwargs = dict(REGISTRY_MAKE_KWARGS.get(env_id) or {})
    kwargs.update(extra)
    return gym.make(env_id, **kwargs)


def choose(info: dict, rng: np.random.Generator) -> str:
    """A deterministic mix of expert, admissible and free-text actions."""
    adm = info["admissible_actions"]
    if "expert_action" in info and rng.random() < 0.5:
        return info["expert_action"]
    if adm:
        return adm[int(rng.integers(len(adm)))]
    return ["42", "hello", "[[1, 2], [3, 4]]", "(1 + 2) * 3"][int(rng.integers(4))]


def comparable(info: dict) -> dict:
    keys = [*INFO_KEYS, "expert_action", "task_id"]
    return {k: info.get(k) for k in keys}


def rollout(env, seed: int, n: int = 8) -> list:
    """``n`` steps of :func:`choose`; every admissible set fits the id's registered action slots on the way."""
    slots = echorl_envs.entry(env.spec.id).max_actions if env.spec.id in IDS else None
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    traj = [(obs, comparable(info))]
    for _ in range(n):
        assert slots is None or len(info["admissible_actions"]) <= slots, (env.spec.id, info["admissible_actions"])
        a = choose(info, rng)
        obs, r, term, trunc, info = env.step(a)
        traj.append((a, obs, r, term, trunc, comparable(info)))
        if term or trunc:
            break
    return traj


@pytest.fixture(params=PARAMS)
def env_id(request):
    return request.param


def test_registry_not_empty():
    assert IDS, "no environment is registered"
    assert len(set(IDS)) == len(IDS)
    for e in echorl_envs.ENVS:
        assert e.id.startswith("EchoRL/") and e.id.endswith("-v0")
        assert e.action_type in ("choice", "free-text")


def test_choice_envs_register_action_slots_that_hold_their_largest_admissible_set():
    for e in echorl_envs.ENVS:
        if e.action_type == "free-text":
            assert e.max_actions is None, e.id
        else:
            assert isinstance(e.max_actions, int) and e.max_actions >= 1, e.id
    # the largest admissible sets measured in expert and random episodes on generated games (EnvEntry.max_actions);
    # rollout() below checks every set it meets against the row
    largest = {"EchoRL/MiniGrid-Empty-5x5-v0": 7, "EchoRL/ALFWorld-v0": 21, "EchoRL/ALFWorld-PickAndPlace-v0": 19,
               "EchoRL/TextWorld-Simple-v0": 35, "EchoRL/TextWorld-Cooking-v0": 73, "EchoRL/WebShop-v0": 17,
               "EchoRL/MiniWoB-email-inbox-v0": 38, "EchoRL/MiniWoB-search-engine-v0": 27}
    for env_id, n in largest.items():
        assert echorl_envs.entry(env_id).max_actions >= n, env_id
    assert echorl_envs.entry("EchoRL/BabyAI-GoToLocal-v0").max_actions == 7  # MiniGrid lists all 7, always


@pytest.mark.parametrize("module, env_class, names", [
    ("echorl_envs.arc", "ARCEnv", ["ARCEnv", "ARCItem", "SPLITS", "format_grid", "load_arc_folder", "parse_grid"]),
    ("echorl_envs.textworld", "TextWorldEnv", ["CHALLENGE_SETTINGS", "TextWorldEnv", "generate_textworld_game"]),
])
def test_family_modules_that_became_packages_export_what_they_had(module, env_class, names):
    import importlib

    pkg = importlib.import_module(module)
    assert sorted(pkg.__all__) == names and all(hasattr(pkg, n) for n in names)
    # the registered ids keep their entry point, and it loads the class the package exports
    points = {e.entry_point for e in echorl_envs.ENVS if e.entry_point.startswith(module + ":")}
    assert points == {f"{module}:{env_class}"}
    assert gym.envs.registration.load_env_creator(points.pop()) is getattr(pkg, env_class)


@pytest.mark.parametrize("env_id", CHECK_ENV_PARAMS)
def test_check_env(env_id):
    env = make(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env.unwrapped, skip_render_check=True)
        assert env.unwrapped.render_mode is None
    finally:
        env.close()


def test_protocol_info_and_render(env_id):
    env = make(env_id, render_mode="ansi")
    try:
        obs, info = env.reset(seed=3)
        assert isinstance(obs, str) and obs and env.observation_space.contains(obs)
        for k in INFO_KEYS:
            assert k in info, f"info lacks {k!r}"
        assert isinstance(info["task"], str) and info["task"]
        assert isinstance(info["admissible_actions"], list)
        assert info["step"] == 0 and info["invalid_action"] is False and info["won"] is False
        assert env.render() == obs
        if isinstance(env.unwrapped, echorl_envs.core.DatasetTextEnv):
            assert env.unwrapped.num_tasks > 0
            _, info0 = env.reset(options={"index": 0})
            assert "task_id" in info0
            _, info0b = env.reset(options={"index": 0})
            assert info0b["task_id"] == info0["task_id"] and info0b["task"] == info0["task"]
        opts = sorted(env.unwrapped.reset_options)
        bad = opts[0] + "x" if opts else "zzz_not_an_option"
        with pytest.raises(ValueError, match="unknown reset option"):
            env.reset(options={bad: 1})
        check_same_info_keys(env)
    finally:
        env.close()


#: Actions no env accepts (one of them is invalid everywhere) and answers most free-text envs judge as wrong.
NOT_ACTIONS = ("zzz not an action zzz", "", "[[[")
WRONG_ANSWERS = ("0", "[[0]]", "'zzz'")


def check_same_info_keys(env, max_steps: int = 400) -> None:
    """``info`` has the same keys after reset, an invalid step, a valid step and the final step; only
    ``expert_action`` goes once the episode is over (there is nothing left to do)."""
    _, info = env.reset(seed=3)  # the game test_protocol_info_and_render loaded (TextWorld compiles new ones)
    keys = set(info)
    seen = {}
    for a in NOT_ACTIONS:
        *_, step_info = env.step(a)
        if step_info["invalid_action"]:
            seen["invalid"] = step_info
            break
    assert "invalid" in seen, "no invalid action found"
    if info["admissible_actions"]:
        choices = [a for a in info["admissible_actions"] if a != info.get("expert_action")][:1]
    else:
        choices = list(WRONG_ANSWERS)
    done = False
    for a in choices:  # a valid step that (usually) does not end the episode
        _, _, term, trunc, step_info = env.step(a)
        if not step_info["invalid_action"]:
            seen["valid"], done = step_info, term or trunc
            info = step_info
            break
    for _ in range(max_steps):
        if done:
            break
        action = info.get("expert_action") or (info["admissible_actions"] or ["0"])[0]
        _, _, term, trunc, info = env.step(action)
        done = term or trunc
        seen.setdefault("valid", info)
    assert done, f"the expert did not finish in {max_steps} steps"
    seen["final"] = info
    for kind, step_info in seen.items():
        if step_info is info:  # the last step: the episode is over
            assert "expert_action" not in step_info
            assert set(step_info) | ({"expert_action"} & keys) == keys, (kind, set(step_info) ^ keys)
        else:
            assert set(step_info) == keys, (kind, set(step_info) ^ keys)


def test_same_seed_same_trajectory(env_id):
    a, b = make(env_id), make(env_id)
    try:
        assert rollout(a, 7) == rollout(b, 7)
    finally:
        a.close()
        b.close()


def test_pickle_roundtrip(env_id):
    """A pickled env continues exactly like the original, mid-episode."""
    env = make(env_id)
    try:
        rng = np.random.default_rng(0)
        _, info = env.reset(seed=11)
        _, _, term, trunc, info = env.step(choose(info, rng))
        clone = pickle.loads(pickle.dumps(env))
        try:
            for _ in range(3):
                if term or trunc:
                    break
                act = choose(info, rng)
                out, out2 = env.step(act), clone.step(act)
                assert out[:4] == out2[:4]
                assert comparable(out[4]) == comparable(out2[4])
                term, trunc, info = out[2], out[3], out[4]
        finally:
            clone.close()
    finally:
        env.close()


def test_async_vector_env(env_id):
    reason = registry_skip_reason(env_id)
    if reason is not None:
        pytest.skip(reason)
    kwargs = REGISTRY_MAKE_KWARGS.get(env_id, {})
    venv = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id, **kwargs)] * 2, shared_memory=False)
    try:
        obs, infos = venv.reset(seed=[0, 1])
        assert len(obs) == 2 and all(isinstance(o, str) for o in obs)
        actions = []
        for i in range(2):
            adm = infos["admissible_actions"][i]
            actions.append(adm[0] if len(adm) else "42")
        obs, rew, term, trunc, infos = venv.step(tuple(actions))
        assert len(obs) == 2 and all(isinstance(o, str) for o in obs)
        assert rew.shape == (2,) and infos["step"].tolist() == [1, 1]
    finally:
        venv.close()


_weird = st.one_of(
    st.just(""),
    st.just("   \t\n "),
    st.just("x" * 200_000),
    st.text(max_size=200),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=31), max_size=20),
    st.text(alphabet=st.characters(min_codepoint=0x2600, max_codepoint=0x27BF), min_size=1, max_size=20),
)


def test_fuzzed_actions_never_raise(env_id):
    env = make(env_id)
    state = {"info": env.reset(seed=5)[1]}

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(action=_weird)
    def run(action):
        info_before = state["info"]
        obs, r, term, trunc, info = env.step(action)
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert isinstance(r, float)
        for k in INFO_KEYS:
            assert k in info
        key = normalize_action(action)
        adm = info_before["admissible_actions"]
        if adm and key not in {normalize_action(x) for x in adm}:
            assert info["invalid_action"], f"{action!r} was accepted"
            assert r == 0.0
        if not key or len(action) > 150_000:
            assert info["invalid_action"], f"{action[:30]!r} was accepted"
            assert r == 0.0
        state["info"] = info
        if term or trunc:
            state["info"] = env.reset(seed=5)[1]

    try:
        run()
    finally:
        env.close()


# Issue 15's crashing inputs (surrogates, deep nesting, huge inputs, non-ASCII digits) and a few more.
HOSTILE = [
    "\ud800", "a\udfffb", "-" * 3000 + "1", "go forward " * 10000, "not " * 3000 + "1", "[[" * 600 + "]]" * 600,
    "²", "(" * 5000, "+" * 3000 + "1", "[" + "9" * 5000 + "]", "\x00", "\u202e1", "𝟙",
]
NON_STR = [None, 3, b"go forward", ["a"], 1.5]


def _step_ok(env, action) -> tuple:
    obs, r, term, trunc, info = env.step(action)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert isinstance(r, float) and all(k in info for k in INFO_KEYS)
    return obs, r, term, trunc, info


def test_hostile_actions_never_raise(env_id):
    """Every hostile string and non-str action is feedback with ``invalid_action`` (or a judged answer),
    never an exception; non-str actions are always invalid and score 0."""
    env = make(env_id)
    try:
        env.reset(seed=5)
        for action in HOSTILE:
            *_, term, trunc, info = _step_ok(env, action)
            if term or trunc:
                env.reset(seed=5)
        for action in NON_STR:
            _, r, term, trunc, info = _step_ok(env, action)
            assert info["invalid_action"] and r == 0.0, (action, info)
    finally:
        env.close()


def test_bad_reset_options_are_a_clear_value_error(env_id):
    env = make(env_id)
    try:
        for options in ({1: 2}, "x", [], 3, ("index", 0)):
            with pytest.raises(ValueError, match="option"):
                env.reset(options=options)
        obs, _ = env.reset(seed=0, options={})  # still usable, and {} / None mean "no options"
        assert isinstance(obs, str)
    finally:
        env.close()


_hostile_text = st.one_of(
    st.text(min_size=1, max_size=400),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=4),
    st.builds(lambda s, n: s * n, st.sampled_from(["[", "(", "-", "not ", "[[", "{", "lambda: ", "go "]),
              st.integers(100, 4000)),
    st.builds(lambda a, b: a + b, st.text(max_size=50), st.sampled_from(["²", "٣", "\ud800", "\x00", "𝟙"])),
)


@pytest.mark.slow
def test_hypothesis_hostile_fuzz(env_id):
    """A bigger fuzz (slow suite): 200 hostile strings per id, no exception."""
    env = make(env_id)
    state = {"n": 0}
    env.reset(seed=1)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(action=_hostile_text)
    def run(action):
        *_, term, trunc, _ = _step_ok(env, action)
        state["n"] += 1
        if term or trunc:
            env.reset(seed=1)

    try:
        run()
    finally:
        env.close()
