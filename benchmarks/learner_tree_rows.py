"""The learner's candidate rows as a prefix tree vs one row per candidate token, alternating, on real records.

ALFWorld's admissible actions begin alike ("go to shelf 1", "go to shelf 2", "take book 1 from shelf 1"), and the
learner's packed sequence (:func:`~echorl_agent.llm_rl.forward.pack_sets`) now holds one row per distinct input
prefix of a state's candidates (where the rollout's captured activations agree) instead of one row per candidate
token: fewer rows through the trained layers and, above all, through the LM head (576 x 49,152) and its softmax,
forward and backward. The baseline is the per-token packing it replaced (``share_prefixes=False``, patched in). This
times one forward + backward of :meth:`LLMPolicy.learner_scores_many` over a minibatch of records (uniformly random
episodes of 8 envs scored together, activations captured by the rollout engine, as in a PPO update) both ways,
checks that the log-probabilities agree, and prints the ratio.

Run: ``python benchmarks/learner_tree_rows.py`` (``--env`` repeatable, ``--batch 32``, ``--repeats 5``,
``--threads 1``, ``--envs 8``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3.common.utils import ConstantSchedule  # noqa: E402
from tabulate import tabulate  # noqa: E402

import echorl_envs  # noqa: E402,F401
from echorl_agent.eval.runner import cpu_name  # noqa: E402
from echorl_agent.llm_rl import policy as policy_mod  # noqa: E402
from echorl_agent.llm_rl.config import LLMPolicyConfig  # noqa: E402
from echorl_agent.llm_rl.forward import pack_sets  # noqa: E402
from echorl_agent.llm_rl.lm import TrainableLM  # noqa: E402
from echorl_agent.llm_rl.policy import LLMPolicy, StepRecord  # noqa: E402
from echorl_agent.llm_rl.rollout import make_choice_env  # noqa: E402

ENV_KWARGS = {"EchoRL/ALFWorld-PickAndPlace-v0": {"offer_help": False, "expert": False}}


def records(lm: TrainableLM, env_id: str, n: int, seed: int, n_envs: int) -> tuple[LLMPolicy, list[StepRecord]]:
    """``n`` states of uniformly random 30-step episodes (history 0) of ``n_envs`` envs stepping together, each step's
    states scored in one engine call as a PPO rollout does (activations captured)."""
    envs = [make_choice_env(env_id, history=0, max_episode_steps=30, env_kwargs=ENV_KWARGS.get(env_id))
            for _ in range(n_envs)]
    pol = LLMPolicy(envs[0].observation_space, envs[0].action_space, ConstantSchedule(1e-4), lm=lm,
                    show_admissible=False)
    rng = np.random.default_rng(seed)
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    out, ep = [], n_envs
    while len(out) < n:
        recs = pol.record_many(obs)
        out.extend(recs)
        for i, (env, rec) in enumerate(zip(envs, recs, strict=True)):
            obs[i], _, term, trunc, _ = env.step(int(rng.integers(len(rec.cands))))
            if term or trunc:
                ep += 1
                obs[i] = env.reset(seed=seed + ep)[0]
    for env in envs:
        env.close()
    return pol, out[:n]


def step(lm: TrainableLM, pol: LLMPolicy, recs: list[StepRecord], share: bool) -> tuple[float, torch.Tensor]:
    """One forward + backward of the learner over the minibatch; seconds and the log-probabilities."""
    packer = pack_sets if share else functools.partial(pack_sets, share_prefixes=False)
    lm.model.zero_grad()
    with patch.object(policy_mod, "pack_sets", packer):
        t = time.perf_counter()
        logps, values, _ = pol.learner_scores_many(recs)
        loss = sum(lp[0] for lp in logps) + values.square().sum()
        loss.backward()
        s = time.perf_counter() - t
    return s, torch.cat([lp.detach() for lp in logps])


def rows(rec: StepRecord, share: bool) -> int:
    """Candidate rows of one state (shared only where the captured activations are equal, as the learner packs)."""
    return len(pack_sets(len(rec.context), [(len(rec.context), rec.cands)], share_prefixes=share,
                         states=rec.cand_states).sources)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", action="append", default=None,
                    help="repeatable; default: ALFWorld-PickAndPlace and BabyAI-GoToLocal")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--envs", type=int, default=8, help="envs whose states the engine scores together (PPO's n_envs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    envs = args.env or ["EchoRL/ALFWorld-PickAndPlace-v0", "EchoRL/BabyAI-GoToLocal-v0"]
    torch.set_num_threads(args.threads)
    lm = TrainableLM(LLMPolicyConfig(lora_rank=8, train_layers=2, max_kv_tokens=16384, engine_prefill_dtype="int8"))
    table = []
    for env_id in envs:
        pol, recs = records(lm, env_id, args.batch, args.seed, args.envs)
        times: dict[bool, list[float]] = {False: [], True: []}
        lps = {}
        for i in range(args.repeats):
            for share in ((False, True) if i % 2 == 0 else (True, False)):  # alternate the order
                s, lps[share] = step(lm, pol, recs, share)
                times[share].append(s)
        med = {k: float(np.median(v)) for k, v in times.items()}
        table.append([env_id.split("/")[-1], f"{np.mean([len(r.context) for r in recs]):.0f}",
                      f"{np.mean([len(r.cands) for r in recs]):.1f}",
                      f"{np.mean([rows(r, False) for r in recs]):.1f} / {np.mean([rows(r, True) for r in recs]):.1f}",
                      f"{med[False]:.3f}", f"{med[True]:.3f}", f"**{med[False] / med[True]:.2f}x**",
                      f"{float((lps[True] - lps[False]).abs().max()):.1e}"])
    print(f"{args.batch} records per minibatch (rolled out {args.envs} envs per engine call), LoRA r=8 on the top 2 "
          f"layers, learner forward + backward, {args.threads} thread(s), median of {args.repeats} alternating; "
          f"{cpu_name()}")
    print(tabulate(table, headers=["env", "prompt tokens", "candidates", "candidate rows per state: per token / tree",
                                   "per token s", "tree s", "speed-up", "max |dlogp|"], tablefmt="github"))


if __name__ == "__main__":
    main()
