"""Asynchronous execution: vectorised text envs in worker processes, and concurrent LLM actors on one engine.

1. ``gymnasium.vector.AsyncVectorEnv`` runs copies of a text env (TextWorld by default) in worker processes;
   random admissible actions; env steps per second with 2 workers vs 1, measured one after the other.
2. ``LLMEngine.start()`` runs the engine's step loop in a background thread; several ReAct actors (SmolLM2-135M)
   submit requests from their own threads and are decoded together in batches. The same actors are then run one
   after another on a fresh engine; the script prints both wall times, their ratio and the prefix-cache reuse rho.

Usage:
    .venv/bin/python examples/async_execution_demo.py               # ~1-2 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import torch


def env_steps_per_second(env_id: str, n_envs: int, steps: int, seed: int = 0) -> float:
    import gymnasium as gym

    import echorl_envs  # noqa: F401 - registers the ids (also in the workers, via the entry point)

    venv = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id)] * n_envs, shared_memory=False)
    try:
        rng = np.random.default_rng(seed)
        _, infos = venv.reset(seed=list(range(seed, seed + n_envs)))
        t0 = time.perf_counter()
        for _ in range(steps):
            acts = [a[int(rng.integers(len(a)))] if len(a) else "look" for a in infos["admissible_actions"]]
            _, _, _, _, infos = venv.step(tuple(acts))
        return steps * n_envs / (time.perf_counter() - t0)
    finally:
        venv.close()


def run_actors(engine, env_id: str, n_actors: int, turns: int, concurrent: bool) -> float:
    """Wall time of ``n_actors`` ReAct episodes (``turns`` turns each), in threads or one after another."""
    import gymnasium as gym

    from echorl_agent.agents import ReActAgent

    def play(i: int) -> None:
        env = gym.make(env_id)
        obs, info = env.reset(seed=i)
        agent = ReActAgent(engine, max_tokens=24)
        agent.reset(env_id, obs, info, i)
        for _ in range(turns):
            action = agent.act(obs, info)
            obs, reward, term, trunc, info = env.step(action)
            agent.observe(action, obs, reward, term or trunc, info)
            if term or trunc:
                break
        env.close()

    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            play(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(e)

    t0 = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n_actors)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    else:
        for i in range(n_actors):
            play(i)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="EchoRL/TextWorld-CoinCollector-v0")
    p.add_argument("--env-steps", type=int, default=100)
    p.add_argument("--llm-env", default="EchoRL/MiniGrid-Empty-5x5-v0",
                   help="a thread-safe env (ALFWorld's PDDL parser is not: run it in processes)")
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--turns", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)

    one = env_steps_per_second(args.env, 1, args.env_steps)
    two = env_steps_per_second(args.env, 2, args.env_steps)
    print(f"[envs] {args.env}, AsyncVectorEnv, {args.env_steps} vector steps: 1 worker {one:.1f} steps/s, "
          f"2 workers {two:.1f} steps/s, ratio {two / one:.2f}")
    if two / one < 1.5:
        print(f"[envs] 2 workers gain little here: the 2 workers and this process share {os.cpu_count()} CPU cores "
              f"(1-minute load average {os.getloadavg()[0]:.1f}), and every vector step waits for both workers")

    from echorl_agent.llm import LLMEngine, load_model

    lm = load_model("smollm2-135m")
    with LLMEngine(lm) as engine:  # entering starts the background step loop
        t_conc = run_actors(engine, args.llm_env, args.actors, args.turns, concurrent=True)
        steps_conc, rho = engine.num_steps, engine.stats.reuse_rate
    seq_engine = LLMEngine(lm)
    t_seq = run_actors(seq_engine, args.llm_env, args.actors, args.turns, concurrent=False)
    print(f"[llm] {args.actors} ReAct actors x {args.turns} turns on {args.llm_env}: concurrent {t_conc:.1f} s "
          f"({steps_conc} engine steps, prefix reuse rho {rho:.2f}), sequential {t_seq:.1f} s "
          f"({seq_engine.num_steps} engine steps); sequential / concurrent = {t_seq / t_conc:.2f}")


if __name__ == "__main__":
    main()
