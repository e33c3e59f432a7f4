"""Memory and activation hit rate of :class:`~echorl_agent.replay.LLMReplayBuffer` on real SmolLM2 rollouts.

    .venv/bin/python benchmarks/llm_replay_memory.py                 # 96 MiniGrid decisions, 4 budgets, 40 samples
    .venv/bin/python benchmarks/llm_replay_memory.py --steps 32      # quicker

A random policy walks ``EchoRL/MiniGrid-Empty-5x5-v0`` through ``LLMObservationWrapper`` (history 2); every state is
scored by :class:`~echorl_agent.llm_rl.policy.LLMPolicy` (SmolLM2-135M, LoRA on the top 2 layers), which captures
the activations entering the first trained layer. The records become :class:`LLMTransition` items. Reported:

* MB per 1,000 items, token ids only vs with the captured activations;
* for budgets holding all / half / a tenth / none of the activations: the replay hit rate over ``--batches``
  batches of 8 (prioritized by |advantage|, random advantages), the sampling time per item without recomputes, and
  the time of one ``recompute`` (the frozen layers, :func:`echorl_agent.llm_rl.forward.run_layers`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import echorl_envs  # noqa: E402,F401
from echorl_agent.replay import LLMReplayBuffer, LLMTransition  # noqa: E402
from echorl_envs.wrappers.llm import LLMObservationWrapper  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=96, help="decisions recorded")
    ap.add_argument("--batches", type=int, default=5, help="replayed batches of 8 per budget")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.config import LLMPolicyConfig
    from echorl_agent.llm_rl.forward import pack, run_layers
    from echorl_agent.llm_rl.lm import TrainableLM
    from echorl_agent.llm_rl.policy import LLMPolicy

    lm = TrainableLM(LLMPolicyConfig(lora_rank=4, train_layers=2, max_kv_tokens=8192))
    env = LLMObservationWrapper(gym.make("EchoRL/MiniGrid-Empty-5x5-v0", max_episode_steps=12), history=2,
                                max_actions=8)
    policy = LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lm=lm)
    rng = np.random.default_rng(args.seed)
    items: list[LLMTransition] = []
    obs, _ = env.reset(seed=args.seed)
    t0 = time.perf_counter()
    while len(items) < args.steps:
        rec = policy.record(obs)
        a = int(rng.integers(len(rec.cands)))
        items.append(LLMTransition.from_record(rec, action=a, advantage=float(rng.normal()), ret=0.0,
                                               version=lm.engine.weight_version))
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    rollout_s = (time.perf_counter() - t0) / len(items)
    parts, b = lm.parts, lm.boundary

    def recompute(item: LLMTransition) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch = pack(len(item.context), item.cands)
        ids = torch.tensor(batch.row_ids(item.context))
        with torch.no_grad():
            x = run_layers(parts, parts.embed(ids), batch, 0, b)
        return x[: len(item.context)], [x[rows] for rows in batch.cand_rows]

    tokens = sum(it.token_nbytes for it in items)
    acts = sum(it.activation_nbytes for it in items)
    n_tok = np.mean([len(it.context) + sum(len(c) for c in it.cands) for it in items])
    print(f"{len(items)} decisions, {n_tok:.0f} tokens each on average (context + candidates), hidden "
          f"{items[0].context_states.shape[1]}, {items[0].context_states.dtype}; rollout {rollout_s * 1e3:.0f} ms/decision")
    print(f"MB per 1,000 items: token ids only {tokens / len(items):.0f} B/item = {tokens / len(items) / 1e3:.2f}; "
          f"with activations {(tokens + acts) / len(items) / 1e3:.1f}")
    spent = [0.0]

    def timed_recompute(item: LLMTransition) -> tuple[torch.Tensor, list[torch.Tensor]]:
        t = time.perf_counter()
        out = recompute(item)
        spent[0] += time.perf_counter() - t
        return out

    rows = []
    for share in (1.0, 0.5, 0.1, 0.0):
        budget = (tokens + share * acts) / 1e6 * 1.0001
        buf = LLMReplayBuffer(len(items), replay_memory_mb=budget, recompute=timed_recompute, seed=args.seed)
        buf.add(items)
        spent[0] = 0.0
        sample_rng = np.random.default_rng(args.seed)
        t0 = time.perf_counter()
        for _ in range(args.batches):
            buf.sample(8, sample_rng)
        total = time.perf_counter() - t0
        st = buf.stats()
        rows.append([f"{share:.0%}", f"{budget:.1f}", f"{st['mb_per_1000']:.1f}",
                     f"{st['items_with_activations']}/{len(items)}", f"{st['hit_rate']:.2f}",
                     f"{(total - spent[0]) / (8 * args.batches) * 1e3:.2f}",
                     f"{spent[0] / st['recomputed'] * 1e3:.0f}" if st["recomputed"] else "-"])
        buf.close()
    print(tabulate(rows, headers=["activations budgeted", "replay_memory_mb", "MB / 1,000 items", "items with acts",
                                  "hit rate", "ms/sample excl. recompute", "ms per recompute"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
