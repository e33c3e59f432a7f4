"""Bandwidth-efficient LLM rollouts: the prefix cache's effect on attention bandwidth, measured.

A SmolLM2-135M scoring agent (pi(a|s) from the log-likelihood of each admissible action, all candidates sharing
the prompt's KV) plays a few text MiniGrid episodes twice: with the engine's prefix cache on and off. Every model
call is recorded in a ``BandwidthEfficiencyTracker`` from the engine's own counters (context tokens t and
cached tokens t'), with the rewards; the script prints, for both runs, the wall time, the reuse rate rho, the
fraction of attention bandwidth b(s_{1:t}) = t(t+1)/2 saved, and eta_bw = E[return] / E[b_eff] (seed README).
The same seeds and a greedy policy make both runs take the same actions.

Usage:
    .venv/bin/python examples/bandwidth_efficient_demo.py           # ~1 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time

import torch


def play(engine, env_id: str, episodes: int, max_steps: int):
    import gymnasium as gym

    from echorl_agent.agents import ScoringAgent
    from echorl_agent.llm import BandwidthEfficiencyTracker

    tracker = BandwidthEfficiencyTracker()
    env = gym.make(env_id, max_episode_steps=max_steps)
    actions = []
    t0 = time.perf_counter()
    for ep in range(episodes):
        obs, info = env.reset(seed=ep)
        agent = ScoringAgent(engine, temperature=0.0)
        agent.reset(env_id, obs, info, ep)
        done = False
        while not done:
            action = agent.act(obs, info)
            actions.append(action)
            step = agent.last
            tracker.record_request(step.num_cached_tokens + step.num_computed_tokens, step.num_cached_tokens, ep)
            obs, reward, term, trunc, info = env.step(action)
            tracker.record_reward(reward, ep)
            done = term or trunc
            agent.observe(action, obs, reward, done, info)
        tracker.end_episode(ep)
    env.close()
    return time.perf_counter() - t0, tracker.snapshot(), actions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="EchoRL/MiniGrid-Empty-5x5-v0")
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)

    from echorl_agent.llm import EngineConfig, LLMEngine, PrefixCacheConfig, load_model

    lm = load_model("smollm2-135m")
    runs = {}
    for label, enabled in (("cache on", True), ("cache off", False)):
        engine = LLMEngine(lm, EngineConfig(prefix_cache=PrefixCacheConfig(enable_prefix_caching=enabled)))
        runs[label] = play(engine, args.env, args.episodes, args.max_steps)

    print(f"\n{args.env}: {args.episodes} episodes x <= {args.max_steps} steps, SmolLM2 scoring agent (greedy)")
    print(f"{'':10} {'seconds':>8} {'requests':>8} {'rho':>6} {'b saved':>8} {'E[b_eff]':>12} {'return':>7} {'eta_bw':>10}")
    for label, (secs, s, _) in runs.items():
        print(f"{label:10} {secs:8.1f} {s.num_requests:8d} {s.reuse_rate:6.3f} {s.saved_fraction:8.1%} "
              f"{s.mean_effective_bandwidth:12.4g} {s.mean_return:7.3f} {s.eta_bw:10.3g}")
    same = runs["cache on"][2] == runs["cache off"][2]
    print(f"same actions in both runs: {same}; wall time off / on = "
          f"{runs['cache off'][0] / runs['cache on'][0]:.2f}")
    print("(with the prefix cache off, rho is the sharing inside each scoring request: all candidate actions read "
          "the prompt's KV once; the cache adds the reuse across steps, the gap in 'b saved')")
    if all(s.mean_return == 0 for _, s, _ in runs.values()):
        print(f"(no episode was won within {args.max_steps} steps, so E[return] and eta_bw are 0 in both runs; "
              "a larger --max-steps gives the agent the chance to win)")


if __name__ == "__main__":
    main()
