"""EchoPolicy / EchoPPO: plan Gaussians, the consistency KL, masks, DRRN scoring, config errors, save/load."""

from __future__ import annotations

import doctest
import importlib
import math

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import echorl_envs
from echorl_agent import EchoPolicy, EchoPPO, PlanningConfig
from echorl_agent.policies import gaussian_kl
from echorl_envs.wrappers import make_sb3_env, wrap_text_env
from tests.sb3_text_envs import CorridorTextEnv

torch.set_num_threads(1)

MINIGRID = "EchoRL/MiniGrid-Empty-5x5-v0"
needs_minigrid = pytest.mark.skipif(MINIGRID not in echorl_envs.env_ids(), reason="MiniGrid text envs not registered")


def corridor_vec(n: int = 1, history: int | None = 2, shuffle: bool = False, **kw):
    return make_vec_env(
        lambda: wrap_text_env(CorridorTextEnv(shuffle=shuffle), max_actions=6, history=history,
                              encoder_kwargs={"dim": 32}, **kw),
        n_envs=n, seed=0,
    )


def small(vec, **policy_kwargs) -> EchoPPO:
    kw = {"encoder_arch": [32], "latent_dim": 4, "net_arch": [32]}
    kw.update(policy_kwargs)
    return EchoPPO("EchoPolicy", vec, n_steps=64, batch_size=64, n_epochs=2, seed=0, policy_kwargs=kw)


# ---------------------------------------------------------------------------------------------- Gaussian KL
def test_gaussian_kl_matches_hand_computed_values():
    # KL[N(1, 0.5^2) || N(0, 1)] = log(1/0.5) + (0.25 + 1) / 2 - 1/2
    got = gaussian_kl(torch.tensor([1.0]), torch.tensor([math.log(0.5)]), torch.tensor([0.0]), torch.tensor([0.0]))
    assert got.item() == pytest.approx(math.log(2) + 0.625 - 0.5, rel=1e-6)
    # 2-D: sum of per-dimension terms; N(0, 2^2) || N(3, 1^2) gives -log 2 + (4 + 9)/2 - 1/2
    got = gaussian_kl(torch.tensor([1.0, 0.0]), torch.tensor([math.log(0.5), math.log(2.0)]),
                      torch.tensor([0.0, 3.0]), torch.tensor([0.0, 0.0]))
    assert got.item() == pytest.approx((math.log(2) + 0.125) + (-math.log(2) + 6.0), rel=1e-6)
    # agrees with torch.distributions on random batches
    g = torch.Generator().manual_seed(0)
    a, b, c, d = (torch.randn(5, 3, generator=g) for _ in range(4))
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(a, b.exp()), torch.distributions.Normal(c, d.exp()))
    torch.testing.assert_close(gaussian_kl(a, b, c, d), ref.sum(-1))


@pytest.mark.parametrize("encoder", ["mlp", "gru", "transformer"])
def test_plan_kl_is_exactly_zero_for_identical_windows(encoder):
    model = small(corridor_vec(), encoder=encoder, encoder_arch=[16])
    frame = torch.randn(3, 1, 32)
    obs = frame.expand(3, 4, 32).contiguous()  # every frame equal: window == shifted window
    kl = model.policy.plan_kl(obs)
    assert kl.shape == (3,)
    assert torch.equal(kl, torch.zeros(3))
    # the env's reset padding gives exactly that situation at t = 0
    first = torch.as_tensor(model.env.reset())
    assert torch.equal(model.policy.plan_kl(first), torch.zeros(1))
    # and a window that really changes gives a positive KL
    assert (model.policy.plan_kl(torch.randn(3, 4, 32)) > 0).all()


def test_plan_kl_equals_hand_computed_gaussian_kl_of_the_two_windows():
    model = small(corridor_vec(), latent_dim=3)
    obs = torch.randn(2, 4, 32)
    enc = model.policy.pi_features_extractor.encoder
    with torch.no_grad():
        mu_t, ls_t = (x.double().numpy() for x in enc(obs[:, 1:]))
        mu_p, ls_p = (x.double().numpy() for x in enc(obs[:, :-1]))
        got = model.policy.plan_kl(obs).numpy()
    var_t, var_p = np.exp(2 * ls_t), np.exp(2 * ls_p)
    hand = (ls_p - ls_t + (var_t + (mu_t - mu_p) ** 2) / (2 * var_p) - 0.5).sum(-1)
    np.testing.assert_allclose(got, hand, rtol=1e-5, atol=1e-7)
    assert (hand > 0).all()


def test_kl_gradient_reaches_the_trajectory_encoder_only():
    model = small(corridor_vec())
    pol = model.policy
    pol.zero_grad()
    pol.plan_kl(torch.randn(4, 4, 32)).mean().backward()
    enc_grads = [p.grad for p in pol.pi_features_extractor.encoder.parameters()]
    assert all(g is not None for g in enc_grads)
    assert sum(g.abs().sum().item() for g in enc_grads) > 0
    assert pol.action_net.weight.grad is None and pol.value_net.weight.grad is None


def test_kl_coef_changes_the_update():
    """Same seed, same data: kl_coef > 0 must move the encoder differently from kl_coef = 0."""
    runs = []
    for coef in (0.0, 1.0):
        model = small(corridor_vec(), kl_coef=coef)
        model.learn(64)
        runs.append(torch.cat([p.detach().flatten() for p in model.policy.pi_features_extractor.parameters()]))
        assert "train/plan_kl" in model.logger.name_to_value and "train/plan_norm" in model.logger.name_to_value
    assert not torch.allclose(runs[0], runs[1])


# ---------------------------------------------------------------------------------------------- learn(256)
class MaskLog(BaseCallback):
    def __init__(self):
        super().__init__()
        self.picked_ok: list[bool] = []
        self.some_masked = False

    def _on_step(self) -> bool:
        masks, actions = self.locals["action_masks"], np.asarray(self.locals["actions"]).reshape(-1)
        assert masks is not None
        self.picked_ok.append(bool(masks[np.arange(len(actions)), actions].all()))
        self.some_masked |= not masks.all()
        return True


def test_echo_ppo_learns_256_with_env_masks_and_never_picks_masked_actions():
    log = MaskLog()
    model = small(corridor_vec(2, shuffle=True))
    before = torch.cat([p.detach().flatten().clone() for p in model.policy.parameters()])
    model.learn(256, callback=log)
    assert model.num_timesteps == 256
    assert all(log.picked_ok) and log.some_masked
    assert not torch.equal(before, torch.cat([p.detach().flatten() for p in model.policy.parameters()]))
    assert model.logger.name_to_value["train/plan_kl"] >= 0


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_echo_ppo_learns_256_with_other_encoders(encoder):
    model = small(corridor_vec(), encoder=encoder, encoder_arch=[16]).learn(256)
    assert model.num_timesteps == 256 and np.isfinite(model.logger.name_to_value["train/plan_kl"])


def test_drrn_dict_variant_scores_the_encoded_actions():
    vec = corridor_vec(1, shuffle=True, include_actions=True)
    model = small(vec)
    obs = vec.reset()
    t = model.policy.obs_to_tensor(obs)[0]
    dist = model.policy.get_distribution(t)
    probs = dist.distribution.probs[0]
    mask = obs["action_mask"][0].astype(bool)
    assert torch.all(probs[~torch.as_tensor(mask)] == 0) and probs.sum().item() == pytest.approx(1.0)
    # permuting the action slots permutes the probabilities (scores depend on the action text, not the slot)
    n = int(mask.sum())
    perm = np.concatenate([np.arange(n)[::-1], np.arange(n, 6)])
    t2 = {k: v.clone() for k, v in t.items()}
    t2["actions"] = t["actions"][:, perm]
    probs2 = model.policy.get_distribution(t2).distribution.probs[0]
    torch.testing.assert_close(probs2, probs[perm])
    model.learn(256)
    assert model.num_timesteps == 256


def test_drrn_echo_ppo_learns_a_shuffled_action_set():
    """Positional slots are meaningless here (re-shuffled every step); scoring the action text is not."""
    vec = corridor_vec(4, shuffle=True, include_actions=True)
    model = EchoPPO("EchoPolicy", vec, n_steps=32, batch_size=64, learning_rate=3e-3, seed=0,
                    policy_kwargs={"encoder_arch": [32], "latent_dim": 4, "net_arch": [32]}).learn(2048)
    env = wrap_text_env(CorridorTextEnv(shuffle=True), max_actions=6, history=2, include_actions=True,
                        encoder_kwargs={"dim": 32})
    wins = 0
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        for _ in range(4):
            a, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, info = env.step(int(a))
            if term:
                break
        wins += int(info["won"] and info["step"] == 3)
    assert wins == 5


def test_plain_sb3_ppo_accepts_echo_policy_class():
    model = PPO(EchoPolicy, corridor_vec(), n_steps=64, batch_size=64, n_epochs=1, seed=0,
                policy_kwargs={"latent_dim": 4}).learn(256)
    assert model.num_timesteps == 256


@needs_minigrid
def test_echo_ppo_learns_256_on_text_minigrid():
    vec = make_sb3_env(MINIGRID, n_envs=2, seed=0, history=2, encoder_kwargs={"dim": 64})
    model = EchoPPO("EchoPolicy", vec, n_steps=64, batch_size=64, n_epochs=2, seed=0,
                    policy_kwargs={"encoder_arch": [64], "latent_dim": 8})
    model.learn(256)
    assert model.num_timesteps == 256
    assert model.policy.planning.window == 2


# ---------------------------------------------------------------------------------------------- save / load
def test_save_load_round_trip_reproduces_actions(tmp_path):
    vec = corridor_vec(1, shuffle=True)
    model = small(vec, kl_coef=0.1).learn(128)
    model.save(tmp_path / "echo")
    loaded = EchoPPO.load(tmp_path / "echo", env=vec)
    assert isinstance(loaded.policy, EchoPolicy) and loaded.policy.planning == model.policy.planning
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4, 32)).astype(np.float32)
    masks = np.random.default_rng(1).random((16, 6)) < 0.5
    masks[:, 5] = True
    a1, _ = model.predict(obs, deterministic=True, action_masks=masks)
    a2, _ = loaded.predict(obs, deterministic=True, action_masks=masks)
    np.testing.assert_array_equal(a1, a2)
    assert masks[np.arange(16), a1].all()
    torch.testing.assert_close(model.policy.plan_kl(torch.as_tensor(obs)), loaded.policy.plan_kl(torch.as_tensor(obs)))
    # loading without an env works too (inference only)
    alone = EchoPPO.load(tmp_path / "echo")
    np.testing.assert_array_equal(alone.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


# ---------------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "policy_kwargs, field",
    [
        ({"latent_dim": 0}, "latent_dim"),
        ({"latnt_dim": 8}, "latent_dim"),  # typo: the hint names the field
        ({"encoder": "lstm"}, "encoder"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"dropout": 1.5}, "dropout"),
        ({"encoder_arch": []}, "encoder_arch"),
        ({"window": 5}, "window"),  # the env gives a window of 2
        ({"encoder": "transformer", "encoder_arch": [15], "num_heads": 2}, "num_heads"),
        ({"share_features_extractor": False}, "share_features_extractor"),
        ({"planning": "fast"}, "planning"),
    ],
)
def test_bad_policy_kwargs_raise_value_error_naming_the_field(policy_kwargs, field):
    with pytest.raises(ValueError, match=field):
        EchoPPO("EchoPolicy", corridor_vec(), n_steps=64, batch_size=64, policy_kwargs=policy_kwargs)


def test_policy_needs_a_history_window_and_echo_ppo_needs_echo_policy():
    with pytest.raises(ValueError, match="history"):
        EchoPPO("EchoPolicy", corridor_vec(history=None), n_steps=64, batch_size=64)
    with pytest.raises(ValueError, match="EchoPolicy"):
        EchoPPO("MlpPolicy", corridor_vec(), n_steps=64, batch_size=64)


def test_planning_config_object_and_field_overrides_merge():
    cfg = PlanningConfig(latent_dim=6, encoder="gru")
    model = small(corridor_vec(), planning=cfg, encoder_arch=[8], latent_dim=5)
    p = model.policy.planning
    assert (p.latent_dim, p.encoder, p.encoder_arch, p.window) == (5, "gru", [8], 2)
    assert model.policy.pi_features_extractor.features_dim == 32 + 5


@needs_minigrid
@pytest.mark.parametrize("module", ["echorl_agent.policies", "echorl_agent.algorithms.echo_ppo"])
def test_doctests(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------------------------- per-step action sets
@pytest.mark.parametrize(
    "env_id",
    [pytest.param(i, marks=pytest.mark.slow) for i in ("EchoRL/ALFWorld-v0", "EchoRL/TextWorld-Simple-v0")],
)  # ~30-50 s each (engine steps); the shuffled corridor covers changing action sets in the fast suite
def test_echo_ppo_drrn_on_envs_whose_action_set_changes(env_id):
    if env_id not in echorl_envs.env_ids():
        pytest.skip(f"{env_id} not registered")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = make_sb3_env(env_id, n_envs=2, seed=0, max_actions=64, include_actions=True, history=2,
                           encoder_kwargs={"dim": 64})
        log = []

        class Log(BaseCallback):
            def _on_step(self) -> bool:
                obs = self.locals["obs_tensor"]
                a = np.asarray(self.locals["actions"]).reshape(-1)
                acts = obs["actions"].numpy()
                log.append((obs["action_mask"].numpy()[np.arange(len(a)), a], [hash(x.tobytes()) for x in acts]))
                return True

        model = EchoPPO("EchoPolicy", vec, n_steps=64, batch_size=64, n_epochs=1, seed=0,
                        policy_kwargs={"encoder_arch": [64], "latent_dim": 8})
        model.learn(256, callback=Log())
    assert model.num_timesteps == 256
    assert all(picked.all() for picked, _ in log)  # only admissible slots are ever chosen
    assert len({h for _, hashes in log for h in hashes}) > 1  # the encoded action set really changed


@pytest.mark.parametrize("encoder", ["mlp", "gru", "transformer"])
def test_window_features_extractor_is_the_plan_encoder_body_without_the_plan(encoder):
    from echorl_agent.policies import WindowFeaturesExtractor

    vec = corridor_vec(n=2, history=2)
    cfg = PlanningConfig(encoder=encoder, encoder_arch=[16], num_heads=2)
    model = PPO("MlpPolicy", vec, n_steps=64, batch_size=64, n_epochs=1, seed=0, policy_kwargs={
        "net_arch": [16], "features_extractor_class": WindowFeaturesExtractor,
        "features_extractor_kwargs": {"planning": cfg}}).learn(128)
    ext = model.policy.features_extractor
    assert isinstance(ext, WindowFeaturesExtractor) and not hasattr(ext.encoder, "head")  # no Gaussian plan
    obs = torch.as_tensor(vec.reset(), dtype=torch.float32)  # [2, k + 2 = 4, 32]
    feats = ext(obs)
    assert feats.shape == (2, 32 + 16) == (2, ext.features_dim)
    assert torch.equal(feats[:, :32], obs[:, -1])  # s_t
    # the window part is the same F_phi body EchoPolicy's plan head reads: copy the weights over and compare
    echo = small(corridor_vec(n=2, history=2), encoder=encoder, encoder_arch=[16])
    plan_enc = echo.policy.features_extractor.encoder
    plan_enc.load_state_dict(ext.encoder.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(feats[:, 32:], plan_enc.hidden(obs[:, 1:]))


def test_window_features_extractor_needs_a_history_window():
    from gymnasium import spaces

    from echorl_agent.policies import WindowFeaturesExtractor

    with pytest.raises(ValueError, match="history window"):
        WindowFeaturesExtractor(spaces.Box(0, 1, (32,)))
