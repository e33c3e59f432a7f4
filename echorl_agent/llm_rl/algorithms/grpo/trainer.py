"""GRPO for free-text envs (Arithmetic, GSM8K, Game24, CRUXEval, ARC): a token-level LLM policy on the env's reward.

Per step: ``prompts_per_step`` tasks (env resets), each answered ``group_size`` times by the rollout engine at
temperature 1. The group shares the prompt's KV: the prompt is prefilled once and its blocks are served from the
prefix cache to every sample. Each completion is judged by the env itself (a fresh reset of the same task, one
``step``), the advantage is the group-normalised reward ``(r - mean) / (std + eps)`` (GRPO, Shao et al. 2024), and the
learner maximises the clipped token-level surrogate with truncated importance weights
``min(pi_learner_old / pi_rollout, C)`` -- the same learner/rollout split as :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO`:
the learner starts from the activations the engine captured while sampling and runs only the trained top layers.
Groups whose rewards are all equal carry no signal; their fraction is reported (``frac_zero_std``).

Faster sampling (sampling is most of a step on a CPU): ``lm=LLMPolicyConfig(engine_weight_dtype="int8")`` decodes
on the int8 engine, whose frozen layers reproduce the embedded GGUF's weights exactly and whose trained top layers
stay float32, so the captured activations and the sampling log-probabilities remain the learner's own (to ~2e-5);
``sampler="inverse_cdf"`` draws each token with one uniform number instead of ``torch.multinomial``'s one per
vocabulary entry. ``benchmarks/grpo_step_vs_trl.py --ours float32 int8:inverse_cdf`` times both against TRL.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import echorl_envs  # noqa: F401 - registers the EchoRL/* ids the trainer makes
from echorl_agent.llm.engine.config import GenerationResult, SamplingParams
from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig
from echorl_agent.llm_rl.forward import candidate_token_logprobs, output_rows, pack, run_layers
from echorl_agent.llm_rl.lm import TrainableLM

__all__ = ["GRPOTrainer", "Group"]

log = logging.getLogger(__name__)


@dataclass
class Group:
    """One prompt and its sampled completions with their rewards."""

    seed: int
    prompt: list[int]
    completions: list[GenerationResult]
    rewards: np.ndarray
    texts: list[str]

    @property
    def advantages(self) -> np.ndarray:
        r = self.rewards
        return (r - r.mean()) / (r.std() + 1e-6)


class GRPOTrainer:
    """GRPO on an echorl env with the LM trained through LoRA/top layers (see the module docstring).

    Args:
        config: hyperparameters.
        lm: an existing :class:`TrainableLM` (default: built from ``config.lm``).
    """

    def __init__(self, config: GRPOConfig | None = None, lm: TrainableLM | None = None) -> None:
        self.cfg = config or GRPOConfig()
        self.lm = lm or TrainableLM(self.cfg.lm)
        self.env = gym.make(self.cfg.env_id, **self.cfg.env_kwargs)
        self.optimizer = torch.optim.Adam(self.lm.trainable_parameters(), lr=self.cfg.lr)
        self.rng = np.random.default_rng(self.cfg.seed)
        self.num_steps = 0
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------ rollouts
    def prompt_ids(self, seed: int) -> list[int]:
        obs, _ = self.env.reset(seed=seed)
        msgs = [{"role": "system", "content": self.cfg.system_prompt}, {"role": "user", "content": obs}]
        return self.lm.llm.chat_ids(msgs)

    def judge(self, seed: int, text: str) -> float:
        """The env's reward for answering task ``seed`` with ``text`` (a fresh episode)."""
        self.env.reset(seed=seed)
        _, reward, *_ = self.env.step(text)
        return float(reward)

    def sample_group(self, seed: int, temperature: float = 1.0, n: int | None = None) -> Group:
        """``n`` completions of task ``seed`` sharing the prompt's KV, judged by the env."""
        n = n or self.cfg.group_size
        prompt = self.prompt_ids(seed)
        eng = self.lm.engine
        # one group: the prompt is prefilled once and every sample forks its KV (LLMEngine.submit_group)
        params = SamplingParams(max_tokens=self.cfg.max_tokens, temperature=temperature, logprobs=True,
                                capture_states=self.lm.capture, seed=int(self.rng.integers(2**31)),
                                sampler=self.cfg.sampler)
        outs = [eng.wait(f) for f in eng.submit_group(prompt, params, n)]
        texts = [o.text for o in outs]
        rewards = np.array([self.judge(seed, t) for t in texts], dtype=np.float64)
        return Group(seed, prompt, outs, rewards, texts)

    # ------------------------------------------------------------------ learner
    def completion_logprobs(self, prompt: list[int], out: GenerationResult) -> torch.Tensor:
        """Learner log-probabilities of the completion tokens (differentiable): :meth:`group_logprobs` of one."""
        return self.group_logprobs(prompt, [out])[0]

    def group_logprobs(self, prompt: list[int], outs: list[GenerationResult]) -> list[torch.Tensor]:
        """Learner log-probabilities of every completion's tokens (differentiable), all in one packed forward.

        The sequence is ``[prompt, c_1, ..., c_n]``: the prompt rows run once and each completion attends to the
        prompt and to its own earlier tokens (:func:`~echorl_agent.llm_rl.forward.pack`), so a group costs one
        forward of at most ``|prompt| + sum (|c_i| - 1)`` rows (completions that begin alike share their common
        tokens' rows) instead of ``n`` forwards of ``|prompt| + |c_i|``. Equal to
        :meth:`completion_logprobs` of each completion (up to float rounding).
        """
        lm, parts, b = self.lm, self.lm.parts, self.lm.boundary
        p = len(prompt)
        captured = bool(outs) and all(o.states is not None and o.states.shape[0] == p + len(o.token_ids) - 1
                                      for o in outs)
        batch = pack(p, [list(o.token_ids) for o in outs], lm.device,
                     states=[o.states[p:] for o in outs] if captured else None)
        if captured:
            # rows entering layer b as the engine computed them: the prompt, then the completions' tree rows (each
            # completion but its last token; the packed sequence has no row for it: nothing attends to it and its
            # output predicts past the end)
            x = torch.cat([outs[0].states[:p], batch.candidate_rows([o.states[p:] for o in outs])]).to(lm.device)
        else:
            tokens = batch.row_ids(prompt)
            with torch.no_grad():
                x = run_layers(parts, parts.embed(torch.tensor(tokens, device=lm.device)), batch, 0, b)
        rows = output_rows(batch)  # the top layer runs only the rows that predict a completion token
        x = run_layers(parts, x, batch, b, lm.num_layers, keep=rows)
        return candidate_token_logprobs(parts, x, batch, rows)

    def update(self, groups: list[Group]) -> dict[str, float]:
        """One GRPO update over ``groups`` (one packed learner forward per group and epoch); returns statistics."""
        items: list[tuple[Group, list[int], torch.Tensor]] = []  # group, its completions used, their advantages
        zero = 0
        n_samples = 0
        for g in groups:
            if np.allclose(g.rewards, g.rewards[0]):
                zero += 1
                continue
            keep = [i for i, o in enumerate(g.completions) if o.token_ids]
            if keep:
                items.append((g, keep, torch.tensor(g.advantages[keep], dtype=torch.float32)))
                n_samples += len(keep)
        stats = {"reward_mean": float(np.mean([g.rewards.mean() for g in groups])),
                 "frac_zero_std": zero / len(groups), "num_samples": float(n_samples)}
        if not items:
            return {**stats, "loss": 0.0, "is_weight_mean": 1.0}

        eps = self.cfg.clip_range
        olds: list[list[torch.Tensor]] = []  # learner log-probs before the update: epoch 0's forward, detached
        weights: list[list[torch.Tensor]] = []  # truncated IS weights min(pi_learner_old / pi_rollout, C)
        losses = []
        for epoch in range(self.cfg.epochs):
            self.optimizer.zero_grad()
            total = 0.0
            for gi, (g, keep, adv) in enumerate(items):
                news = self.group_logprobs(g.prompt, [g.completions[i] for i in keep])
                if epoch == 0:  # no optimizer step has run yet: these are the old log-probs
                    olds.append([n.detach() for n in news])
                    weights.append([torch.exp(old - torch.tensor(g.completions[i].logprobs, dtype=old.dtype))
                                    .clamp(max=self.cfg.lm.is_truncation) for old, i in zip(olds[gi], keep, strict=True)])
                loss = torch.zeros(())
                for new, old, w, a in zip(news, olds[gi], weights[gi], adv, strict=True):
                    ratio = torch.exp(new - old)
                    surrogate = torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
                    loss = loss - (w * surrogate).mean() / n_samples
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(self.lm.trainable_parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            losses.append(total)
        self.lm.sync()
        return {**stats, "loss": float(np.mean(losses)),
                "is_weight_mean": float(torch.cat([w for w_g in weights for w in w_g]).mean())}

    def warm_start(self, seeds: list[int], epochs: int = 2, batch_size: int = 8) -> list[float]:
        """Supervised warm start on the env's oracle answers (``info["expert_action"]``); mean loss per epoch.

        A 135M model rarely answers right at temperature 1, so GRPO groups start with zero reward variance; a few
        oracle answers (SFT, as TRL users do before GRPO) give the groups signal.
        """
        data = []
        for s in seeds:
            _, info = self.env.reset(seed=s)
            answer = info.get("expert_action")
            if answer is None:
                raise ValueError(f"{self.cfg.env_id} has no oracle answer (info['expert_action']) for warm_start")
            ids = self.lm.llm.encode(str(answer)) + self.lm.llm.eos_token_ids[:1]
            data.append((self.prompt_ids(s), ids))
        losses = []
        for _ in range(epochs):
            order = self.rng.permutation(len(data))
            total = 0.0
            for lo in range(0, len(order), batch_size):
                self.optimizer.zero_grad()
                batch = [data[i] for i in order[lo : lo + batch_size]]
                for prompt, ids in batch:
                    out = GenerationResult(0, prompt, ids, "", "stop", 0, 0)
                    loss = -self.completion_logprobs(prompt, out).mean() / len(batch)
                    loss.backward()
                    total += float(loss.detach()) * len(batch)
                torch.nn.utils.clip_grad_norm_(self.lm.trainable_parameters(), self.cfg.max_grad_norm)
                self.optimizer.step()
            losses.append(total / len(data))
        self.lm.sync()
        return losses

    def step(self) -> dict[str, float]:
        """Sample ``prompts_per_step`` groups, update, push the weights to the engine."""
        seeds = [int(s) for s in self.rng.integers(0, 2**31 - 1, size=self.cfg.prompts_per_step)]
        groups = [self.sample_group(s) for s in seeds]
        stats = self.update(groups)
        self.num_steps += 1
        stats["step"] = float(self.num_steps)
        self.history.append(stats)
        return stats

    def train(self, steps: int, progress: bool = False) -> list[dict[str, float]]:
        it = range(steps)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="GRPO steps")
        for _ in it:
            s = self.step()
            log.info("GRPO step %d: reward %.3f, zero-std groups %.2f", s["step"], s["reward_mean"], s["frac_zero_std"])
        return self.history

    def answers(self, seeds: list[int], temperature: float = 0.0, batch: int = 32) -> list[str]:
        """One completion per task ``seed`` (greedy with ``temperature=0``; sampling seeded by the task seed),
        ``batch`` tasks per batched decode."""
        texts: list[str] = []
        eng = self.lm.engine
        for lo in range(0, len(seeds), batch):
            futs = [eng.submit(self.prompt_ids(s), SamplingParams(max_tokens=self.cfg.max_tokens,
                                                                 temperature=temperature, seed=s,
                                                                 sampler=self.cfg.sampler))
                    for s in seeds[lo : lo + batch]]
            texts.extend(eng.wait(f).text for f in futs)
        return texts

    def evaluate(self, seeds: list[int], temperature: float = 0.0, batch: int = 32) -> np.ndarray:
        """Success (the env's reward > 0) of one completion per task ``seed`` (see :meth:`answers`)."""
        texts = self.answers(seeds, temperature, batch)
        return np.asarray([self.judge(s, t) > 0 for s, t in zip(seeds, texts, strict=True)], dtype=bool)

    def config_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)
