"""Look inside EchoPolicy's latent plan: tau_t ~ N(mu_t, sigma_t^2) = F_phi(s_{t-k:t}) (EchoRL Eq. 1-3).

Trains EchoPPO briefly on a text MiniGrid env, then plays one greedy episode and prints, per step, the action,
the plan mean's norm ||mu_t||, the mean plan std, and the KL between consecutive plans
KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})] -- the term EchoPPO penalises with ``kl_coef``.

It then shows that the trained policy acts on its plan: the same greedy episodes are played with the plan mean
``mu_t`` replaced by zeros (what the untrained plan head outputs: it starts near 0 on purpose, so an untrained
policy reads only ``s_t``), and the script prints the success rate and the share of changed actions in both runs,
plus how far the trained and untrained plans move from step to step (mean plan KL).

Usage:
    .venv/bin/python examples/latent_planning_demo.py               # ~30 s on 2 CPU cores
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


def greedy_action(policy, obs: np.ndarray, mask: np.ndarray, zero_plan: bool = False) -> int:
    """EchoPolicy's greedy action on ``obs``; with ``zero_plan`` its plan mean mu_t is replaced by zeros."""
    from echorl_agent.policies import MASKED_LOGIT

    obs_t, _ = policy.obs_to_tensor(obs)
    with torch.no_grad():
        features = policy.extract_features(obs_t, policy.pi_features_extractor)  # [1, D + latent_dim]
        if zero_plan:
            features[:, -policy.planning.latent_dim:] = 0.0
        logits = policy.action_net(policy.mlp_extractor.forward_actor(features))[0]
    logits[~torch.as_tensor(mask, dtype=torch.bool)] = MASKED_LOGIT
    return int(logits.argmax())


def play(policy, env, seed: int, zero_plan: bool = False) -> tuple[bool, list[np.ndarray], list[int], list[str]]:
    """One greedy episode: (won, observations, actions, action texts)."""
    obs, _ = env.reset(seed=seed)
    observations, actions, texts, done, info = [], [], [], False, {}
    while not done:
        action = greedy_action(policy, obs, env.get_wrapper_attr("action_masks")(), zero_plan)
        observations.append(obs)
        actions.append(action)
        texts.append(env.get_wrapper_attr("action_text")(action))
        obs, _, term, trunc, info = env.step(action)
        done = term or trunc
    return bool(info.get("won")), observations, actions, texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env", default="EchoRL/MiniGrid-Empty-5x5-v0", help="a text MiniGrid id")
    p.add_argument("--steps", type=int, default=8192, help="EchoPPO training env steps")
    p.add_argument("--window", type=int, default=3, help="history window k the plan reads")
    p.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes on unseen seeds")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    args = p.parse_args()
    torch.set_num_threads(1)

    import echorl_envs
    from echorl_agent import EchoPPO
    from echorl_envs.wrappers import make_sb3_env, wrap_text_env

    def build():  # the settings of examples/train_echo_rl.py
        vec = make_sb3_env(args.env, n_envs=4, seed=args.seed, history=args.window)
        return EchoPPO("EchoPolicy", vec, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3,
                       ent_coef=0.01, policy_kwargs={"net_arch": [64, 64], "encoder_arch": [128], "latent_dim": 16,
                                                     "kl_coef": 0.01}, seed=args.seed)

    untrained, model = build(), build()
    model.learn(args.steps)
    policy = model.policy
    policy.set_training_mode(False)
    print(f"EchoPolicy: window k={policy.planning.window}, latent_dim={policy.planning.latent_dim}, "
          f"kl_coef={policy.planning.kl_coef}; trained {model.num_timesteps} env steps")

    env = wrap_text_env(echorl_envs.make(args.env), history=args.window)
    seeds = [10_000 + i for i in range(args.eval_episodes)]
    won, observations, _, texts = play(policy, env, seeds[0])
    print(f"\ngreedy episode (seed {seeds[0]}):")
    print(f"{'t':>3} {'action':12} {'||mu_t||':>9} {'mean sigma':>10} {'KL(t||t-1)':>11}")
    for t, (obs, text) in enumerate(zip(observations[:20], texts[:20], strict=True)):
        obs_t, _ = policy.obs_to_tensor(obs)
        with torch.no_grad():
            mu, log_std, _, _ = policy.pi_features_extractor.plans(obs_t)
            kl = float(policy.plan_kl(obs_t)[0])
        print(f"{t:3d} {text:12} {float(mu.norm()):9.3f} {float(log_std.exp().mean()):10.3f} {kl:11.4f}")
    if len(observations) > 20:
        print("... (printing the first 20 steps only)")
    print(f"episode: {'won' if won else 'not won'} in {len(observations)} steps")

    # the same episodes with the plan, then with mu_t zeroed on the states the planned policy visits
    wins, zero_wins, changed, total, visited = 0, 0, 0, 0, []
    for seed in seeds:
        w, obs_list, actions, _ = play(policy, env, seed)
        wins += w
        visited += obs_list
        env.reset(seed=seed)  # replay the planned policy's states and ask the zero-plan policy on each
        for obs, action in zip(obs_list, actions, strict=True):
            changed += greedy_action(policy, obs, env.get_wrapper_attr("action_masks")(), zero_plan=True) != action
            total += 1
            env.step(action)
        zero_wins += play(policy, env, seed, zero_plan=True)[0]
    print(f"\n{args.eval_episodes} greedy episodes on unseen seeds:")
    print(f"  with the plan mu_t      success {wins / len(seeds):.2f}")
    print(f"  with mu_t set to zero   success {zero_wins / len(seeds):.2f}; "
          f"{changed} of {total} actions ({changed / max(total, 1):.0%}) change on the planned run's states")

    batch = np.stack(visited)
    with torch.no_grad():
        kl_trained = float(policy.plan_kl(policy.obs_to_tensor(batch)[0]).mean())
        kl_untrained = float(untrained.policy.plan_kl(untrained.policy.obs_to_tensor(batch)[0]).mean())
    print(f"mean plan KL between consecutive steps on these {len(batch)} observations: trained {kl_trained:.4f}, "
          f"untrained {kl_untrained:.4f} (the untrained plan head starts near 0, so its plans barely move)")


if __name__ == "__main__":
    main()
