"""Look inside EchoPolicy's latent plan: tau_t ~ N(mu_t, sigma_t^2) = F_phi(s_{t-k:t}) (EchoRL Eq. 1-3).

Trains EchoPPO briefly on a text MiniGrid env, then plays one greedy episode and prints, per step, the action,
the plan mean's norm ||mu_t||, the mean plan std, and the KL between consecutive plans
KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})] -- the term EchoPPO penalises with ``kl_coef``.
It then compares the mean plan KL of the trained policy with an untrained one on the same observations.

Usage:
    .venv/bin/python examples/latent_planning_demo.py               # ~30 s on 2 CPU cores
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="EchoRL/MiniGrid-Empty-5x5-v0")
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)

    import echorl_envs
    from echorl_agent import EchoPPO
    from echorl_envs.wrappers import make_sb3_env, wrap_text_env

    def build():
        vec = make_sb3_env(args.env, n_envs=4, seed=args.seed, history=args.window)
        return EchoPPO("EchoPolicy", vec, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3,
                       policy_kwargs={"latent_dim": 8, "kl_coef": 0.05}, seed=args.seed)

    untrained, model = build(), build()
    model.learn(args.steps)
    policy = model.policy
    print(f"EchoPolicy: window k={policy.planning.window}, latent_dim={policy.planning.latent_dim}, "
          f"kl_coef={policy.planning.kl_coef}; trained {model.num_timesteps} env steps")

    env = wrap_text_env(echorl_envs.make(args.env), history=args.window)
    obs, _ = env.reset(seed=123)
    print(f"\n{'t':>3} {'action':12} {'||mu_t||':>9} {'mean sigma':>10} {'KL(t||t-1)':>11}")
    observations, done, t, info = [], False, 0, {}
    while not done:
        observations.append(obs)
        obs_t, _ = policy.obs_to_tensor(obs)
        with torch.no_grad():
            mu, log_std, _, _ = policy.pi_features_extractor.plans(obs_t)
            kl = float(policy.plan_kl(obs_t)[0])
        action, _ = model.predict(obs, deterministic=True, action_masks=env.get_wrapper_attr("action_masks")())
        text = env.get_wrapper_attr("action_text")(int(action))
        obs, reward, term, trunc, info = env.step(int(action))
        done = term or trunc
        if t < 20:
            print(f"{t:3d} {text:12} {float(mu.norm()):9.3f} {float(log_std.exp().mean()):10.3f} {kl:11.4f}")
        elif t == 20:
            print("... (printing the first 20 steps only)")
        t += 1
    print(f"episode: {'won' if info.get('won') else 'not won'} in {t} steps, last reward {reward:.3f}")

    batch = np.stack(observations)
    with torch.no_grad():
        kl_trained = float(policy.plan_kl(policy.obs_to_tensor(batch)[0]).mean())
        kl_untrained = float(untrained.policy.plan_kl(untrained.policy.obs_to_tensor(batch)[0]).mean())
    print(f"mean plan KL on these {len(batch)} observations: trained {kl_trained:.4f}, untrained {kl_untrained:.4f}")


if __name__ == "__main__":
    main()
