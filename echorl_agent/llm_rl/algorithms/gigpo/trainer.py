"""GiGPO on a choice env: groups of K episodes from one seed, episode- and anchor-state advantages, no critic.

One iteration (:meth:`GiGPOTrainer.iteration`):

1. rollout -- ``groups`` seeds, K envs each, all stepping together (:func:`~echorl_agent.llm_rl.rollout.collect_groups`:
   one batched engine call per step, identical states scored once, prompts extended from the prefix cache), or on Ray
   rollout workers (``--backend ray``, :mod:`echorl_agent.llm_rl.ray_workers`);
2. advantages -- :func:`~echorl_agent.llm_rl.advantage.gigpo_advantages` (``A = A_E + omega * A_S``);
3. learner -- :func:`~echorl_agent.llm_rl.learner.update_policy` on the steps with a non-zero advantage (a step whose
   advantage is 0 contributes no policy gradient), from the rollout's captured activations;
4. weight sync -- the adapters are merged into the rollout engine (:meth:`LLMPolicy.sync_engine`).

Reported per iteration: success and return of the sampled episodes, the fraction of groups whose returns are all
equal (no episode-level signal), anchor step groups with more than one step, the prefix-cache hit rate of the
rollout (prompt tokens served from the cache, the K episodes of a group share their common prefixes), env steps/s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from echorl_agent.llm_rl.advantage import (
    anchor_groups,
    center_advantages,
    episode_sample_weights,
    gigpo_advantages,
)
from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
from echorl_agent.llm_rl.learner import Sample, trainable_snapshot, update_policy
from echorl_agent.llm_rl.policy import LLMPolicy, StepRecord
from echorl_agent.llm_rl.rollout import Episode, collect_groups, make_choice_env

__all__ = ["GiGPOTrainer"]

log = logging.getLogger(__name__)


class GiGPOTrainer:
    """GiGPO on an LLM policy (see the module docstring).

    Args:
        config: hyperparameters.
        policy: an existing :class:`LLMPolicy` (e.g. after behaviour cloning); default: a fresh one from ``config.lm``.
    """

    def __init__(self, config: GiGPOConfig | None = None, policy: LLMPolicy | None = None) -> None:
        from stable_baselines3.common.utils import ConstantSchedule

        self.cfg = config or GiGPOConfig()
        cfg = self.cfg
        n = cfg.groups * cfg.group_size
        # observations stay dicts: no SB3 buffer stores them, so they never round-trip through JSON bytes
        self.envs = [make_choice_env(cfg.env_id, cfg.history, cfg.max_episode_steps, cfg.env_kwargs, encode=False)
                     for _ in range(n)]
        if policy is None:
            kw = dataclasses.asdict(cfg.lm)
            kw["planning"] = cfg.lm.planning
            policy = LLMPolicy(self.envs[0].observation_space, self.envs[0].action_space,
                               ConstantSchedule(cfg.learning_rate), **kw)
        self.policy = policy
        for g in self.policy.optimizer.param_groups:
            g["lr"] = cfg.learning_rate
        self.rng = np.random.default_rng(cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.num_timesteps = 0
        self.num_iterations = 0
        self.history: list[dict[str, float]] = []
        self.episodes_done: list[tuple[int, bool, float]] = []
        """(env steps so far, won, return) per finished training episode."""
        self.last_episodes: list[Episode] = []
        """The episodes of the latest iteration (for diagnostics that read the rollout the update learned from)."""
        self.ref_params: list[torch.Tensor] | None = None
        """The reference weights of ``ref_kl_coef`` (taken at the first iteration, so after a BC warm start)."""
        self.rollout_workers: Any = None
        """A :class:`~echorl_agent.llm_rl.ray_workers.RayRolloutPool` that plays the groups (``--backend ray``);
        None: they play on :attr:`envs` in this process."""
        self.replay = None
        self._replay_slots = np.zeros(0, np.int64)
        if cfg.replay is not None:
            from echorl_agent.replay.llm import LLMReplayBuffer

            kw = {"capacity": 4096, **cfg.replay}
            self.replay = LLMReplayBuffer(**kw)
            self.replay.set_version(self.policy.lm.engine.weight_version)

    def collect(self) -> list[Episode]:
        """The iteration's episodes (``group_size`` per seed of :meth:`next_seeds`, in seed order): on the Ray rollout
        workers when the run has them (:mod:`echorl_agent.llm_rl.ray_workers`), else in this process with the
        current weights."""
        if self.rollout_workers is not None:
            return self.rollout_workers.collect(self)
        version = self.policy.lm.engine.weight_version
        episodes = collect_groups(self.policy, self.envs, self.next_seeds(), self.cfg.group_size, self.generator)
        for e in episodes:
            e.policy_version = version
        return episodes

    def next_seeds(self) -> list[int]:
        """Training seeds of the next iteration (drawn from the trainer's rng; evaluation uses other seeds)."""
        return [int(s) for s in self.rng.integers(1_000_000, 2**31 - 1, size=self.cfg.groups)]

    def iteration(self) -> dict[str, float]:
        """Collect ``groups`` groups, compute GiGPO advantages, update, sync the engine; returns statistics."""
        cfg = self.cfg
        if cfg.ref_kl_coef > 0 and self.ref_params is None:
            self.ref_params = trainable_snapshot(self.policy)
        stats0 = self.policy.lm.engine.stats
        cached0, computed0 = stats0.num_cached_tokens, stats0.num_computed_tokens
        rollout_version = self.policy.lm.engine.weight_version
        t0 = time.perf_counter()
        episodes = self.collect()
        self.last_episodes = episodes
        t1 = time.perf_counter()
        adv = self.advantages(episodes)
        weights = episode_sample_weights(episodes, cfg.sample_weighting)
        # adv_mean: the steps' loss-weighted mean advantage (negative: the update mostly pushes sampled actions down);
        # raw_mean: the same before centring (what centring subtracts, also from the steps of groups without signal)
        _, raw_mean = center_advantages(adv, weights, False)
        adv, adv_mean = center_advantages(adv, weights, cfg.center_advantages)
        if cfg.positive_advantages:
            adv = [np.maximum(a, 0.0) for a in adv]
        fresh = [(e.group, Sample(s.record, s.action, float(a), weight=w))
                 for e, ea, w in zip(episodes, adv, weights, strict=True)
                 for s, a in zip(e.steps, ea, strict=True) if cfg.ent_coef > 0 or cfg.ref_kl_coef > 0 or abs(a) > 1e-12]
        samples = [smp for _, smp in fresh]
        replayed = self._replayed(len(samples))
        upd = update_policy(self.policy, samples + replayed, clip_range=cfg.clip_range,
                            epochs=cfg.epochs, minibatch_size=cfg.minibatch_size, micro_batch=cfg.micro_batch,
                            ent_coef=cfg.ent_coef, max_grad_norm=cfg.max_grad_norm, kl_coef=cfg.kl_coef,
                            ref_kl_coef=cfg.ref_kl_coef, ref_params=self.ref_params, target_kl=cfg.target_kl,
                            rng=self.rng)
        if samples or replayed:
            self.policy.sync_engine()
        if self.replay is not None:
            self._reprioritize(replayed)
            self._remember(fresh, rollout_version)
        t2 = time.perf_counter()
        steps = sum(len(e.steps) for e in episodes)
        for e in episodes:
            self.num_timesteps += len(e.steps)
            self.episodes_done.append((self.num_timesteps, e.won, e.ret))
        self.num_iterations += 1
        st = self.policy.lm.engine.stats
        cached, computed = st.num_cached_tokens - cached0, st.num_computed_tokens - computed0
        returns = np.array([e.ret for e in episodes]).reshape(cfg.groups, cfg.group_size)
        anchors = anchor_groups(episodes)
        out = {
            "iteration": float(self.num_iterations), "timesteps": float(self.num_timesteps),
            "success_rate": float(np.mean([e.won for e in episodes])), "return_mean": float(returns.mean()),
            "episode_length": steps / len(episodes),
            "frac_zero_std": float(np.mean([np.allclose(r, r[0]) for r in returns])),
            "anchor_groups_multi": float(sum(len(v) > 1 for v in anchors.values())),
            "anchor_steps_grouped": float(sum(len(v) for v in anchors.values() if len(v) > 1)) / max(steps, 1),
            "cache_hit_rate": cached / max(cached + computed, 1),
            "advantage_mean": adv_mean, "advantage_mean_raw": raw_mean,
            "rollout_s": t1 - t0, "learner_s": t2 - t1, "env_steps_per_s": steps / max(t2 - t0, 1e-9),
            **upd,
        }
        if self.rollout_workers is not None:
            out.update(self.rollout_workers.stats())
        if self.replay is not None:
            rs = self.replay.stats()
            out.update(replayed=float(len(replayed)), replay_items=float(rs["items"]),
                       replay_hit_rate=float(rs["hit_rate"]), replay_mb_per_1000=float(rs["mb_per_1000"]))
        self.history.append(out)
        return out

    def advantages(self, episodes: list[Episode]) -> list[np.ndarray]:
        """Per-step advantages of an iteration's episodes before any centring (GiGPO's ``A_E + omega * A_S``).
        A subclass may replace them (e.g. a diagnostic with known-good advantages) and keep the rest of the loop."""
        cfg = self.cfg
        return gigpo_advantages(episodes, cfg.gamma, cfg.step_advantage_weight, cfg.normalize)

    # ------------------------------------------------------------------ replay (EchoRL Algorithm 1's buffer)
    def _replayed(self, n_fresh: int) -> list[Sample]:
        """Prioritized samples from the buffer for this update (their PER weights multiply their loss terms; the
        truncated IS weight min(pi_old / pi_behaviour, C) of the learner corrects for the older policy)."""
        n = int(round(self.cfg.replay_ratio * max(n_fresh, 1)))
        if self.replay is None or len(self.replay) == 0 or n == 0:
            return []
        batch = self.replay.sample(n, self.rng)
        self._replay_slots = batch.indices
        out = []
        for it, w in zip(batch.items, batch.weights.tolist(), strict=True):
            out.append(Sample(StepRecord.from_transition(it), it.action, it.advantage, weight=float(w)))
        return out

    def _reprioritize(self, replayed: list[Sample]) -> None:
        """New ``|delta|`` of the replayed items after the update (:func:`~echorl_agent.replay.llm.critic_free_priority`
        under the updated weights: one no-grad learner pass over them), so items the policy has learned cool down."""
        if not replayed:
            return
        from echorl_agent.replay.llm import critic_free_priority

        lps = []
        with torch.no_grad():
            for lo in range(0, len(replayed), self.cfg.micro_batch):
                lps += self.policy.learner_scores_many([s.record for s in replayed[lo : lo + self.cfg.micro_batch]])[0]
        acts = [min(s.action, len(s.record.cands) - 1) for s in replayed]
        learner = torch.stack([lp[a] for lp, a in zip(lps, acts, strict=True)]).float().cpu()
        behaviour = torch.stack([s.record.rollout_logp[a] for s, a in zip(replayed, acts, strict=True)]).float().cpu()
        adv = torch.tensor([s.advantage for s in replayed], dtype=torch.float32)
        td = critic_free_priority(learner, behaviour, adv, self.policy.cfg.is_truncation)
        self.replay.update_priorities(self._replay_slots, td.numpy())

    def _remember(self, fresh: list[tuple[int, Sample]], rollout_version: int) -> None:
        from echorl_agent.replay.llm import LLMTransition

        base = 1000 * self.num_iterations
        # critic-free items: no value, so the buffer's |delta| term is |advantage| (hot = high-|A| and recent)
        items = [LLMTransition(list(s.record.context), s.record.num_prompt, [list(c) for c in s.record.cands],
                               s.action, s.record.rollout_logp, s.advantage, s.advantage, None, rollout_version, base + g,
                               window=s.record.window, context_states=s.record.context_states,
                               cand_states=None if s.record.cand_states is None else list(s.record.cand_states))
                 for g, s in fresh]
        if items:
            self.replay.add(items)
        self.replay.set_version(self.policy.lm.engine.weight_version)

    # ------------------------------------------------------------------ resuming (see echorl_agent.llm_rl.checkpoint)
    def state_dict(self) -> dict[str, Any]:
        """Counters, per-iteration rows, finished episodes and the trainer's own generators (numpy: seeds and
        minibatch orders and replay samples; torch: action samples) -- everything of a resumed run besides the
        weights, the optimizer and the replay buffer."""
        return {"num_iterations": self.num_iterations, "num_timesteps": self.num_timesteps,
                "history": [dict(h) for h in self.history], "episodes_done": [list(e) for e in self.episodes_done],
                "rng": self.rng.bit_generator.state, "generator": self.generator.get_state(),
                "ref_params": self.ref_params}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output."""
        self.num_iterations, self.num_timesteps = int(state["num_iterations"]), int(state["num_timesteps"])
        self.history = [dict(h) for h in state["history"]]
        self.episodes_done = [(int(s), bool(w), float(r)) for s, w, r in state["episodes_done"]]
        self.rng.bit_generator.state = state["rng"]
        self.generator.set_state(state["generator"])
        self.ref_params = state.get("ref_params")

    def train(self, total_timesteps: int, progress: bool = False, callback: Any = None) -> list[dict[str, float]]:
        """Iterate until ``total_timesteps`` env steps were collected since the start (counting a resumed run's
        earlier steps; at least one iteration)."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total_timesteps, initial=self.num_timesteps, desc="GiGPO env steps", unit="step")
        while True:
            s = self.iteration()
            if bar is not None:
                bar.update(int(s["timesteps"]) - bar.n)
                bar.set_postfix(success=f"{s['success_rate']:.2f}", steps_s=f"{s['env_steps_per_s']:.2f}")
            if callback is not None:
                callback(s)
            log.info("GiGPO it %d: %d steps, success %.2f, zero-std groups %.2f, %.2f env steps/s",
                     s["iteration"], s["timesteps"], s["success_rate"], s["frac_zero_std"], s["env_steps_per_s"])
            if self.num_timesteps >= total_timesteps:
                break
        if bar is not None:
            bar.close()
        return self.history

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False):
        """SB3's ``predict`` of the trained policy (for evaluation loops written against SB3 models)."""
        return self.policy.predict(observation, state, episode_start, deterministic)

    def evaluate(self, seeds: list[int], deterministic: bool = True,
                 envs: Sequence[Any] | None = None) -> list[Episode]:
        """One episode per seed (greedy or sampled), no learning; episodes in seed order. ``envs``: wrapped envs
        (``encode=False``) to play in instead of the training envs (a held-out env with other options)."""
        envs = self.envs if envs is None else list(envs)
        out = []
        n = len(envs)
        for lo in range(0, len(seeds), n):
            chunk = seeds[lo : lo + n]
            out += collect_groups(self.policy, envs[: len(chunk)], chunk, 1, self.generator, deterministic)
        return out
