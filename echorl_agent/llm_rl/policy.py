"""``LLMPolicy``: the language model itself as an SB3 actor-critic policy over admissible actions.

pi(a | s, tau) = softmax over the admissible actions of ``score(a) / temperature``, where ``score(a)`` is the sum
(or, with ``length_norm``, the mean) of the action tokens' true log-probabilities ``log_softmax`` given the chat
prompt (task + history window + current observation [+ m soft plan tokens]) -- not raw logits (the GLAM/lamorel
bug, lamorel #37). The value is an MLP on the last context token's final hidden state (GLAM's value head).

Rollouts go through :class:`~echorl_agent.llm.engine.LLMEngine` (prefix cache, shared-prefix scoring of all
candidates): :meth:`LLMPolicy.forward` scores the candidates with the engine, which also captures the frozen
layers' activations of every prompt and candidate token. The learner (:meth:`evaluate_actions_and_plans`) starts
from those activations and runs only the trained top layers (:mod:`echorl_agent.llm_rl.forward`), with the prompt
computed once for all candidates. Observations come from :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper`.

Use it with ``EchoPPO("LLMPolicy", env, policy_kwargs={...})`` (returns an
:class:`~echorl_agent.llm_rl.ppo.LLMPPO`), or with SB3's ``PPO`` (``evaluate_actions`` is provided).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from torch import nn

from echorl_agent.llm.scoring import SoftTokens
from echorl_agent.llm_rl.config import LLMPolicyConfig
from echorl_agent.llm_rl.forward import candidate_logprobs, pack, run_layers
from echorl_agent.llm_rl.lm import TrainableLM
from echorl_agent.llm_rl.plan import PlanHead
from echorl_agent.llm_rl.prompt import candidate_ids, render_prompt
from echorl_envs.wrappers.llm import decode_llm_obs

__all__ = ["LLMPolicy", "StepRecord"]

_MAX_FEATURES = 20_000


@dataclass
class StepRecord:
    """What the rollout computed for one state, kept for the learner."""

    context: list[int]
    """Prompt token ids (+ the m soft-token placeholders)."""
    num_prompt: int
    cands: list[list[int]]
    rollout_logp: torch.Tensor
    """log pi_rollout over the candidates (the engine's distribution, which sampled the action)."""
    value: float
    context_states: torch.Tensor | None = None
    """Captured activations entering the first trained layer, ``[len(context), hidden]`` (None: recompute)."""
    cand_states: list[torch.Tensor] | None = None
    window: torch.Tensor | None = None
    """Plan features of steps t-k-1..t, ``[k + 2, hidden]``."""
    learner_logp: torch.Tensor | None = None
    """log pi over the candidates recomputed by the learner before the update (see ``LLMPPO``)."""


class LLMPolicy(BasePolicy):
    """The LM as policy and critic over admissible actions (see the module docstring).

    Args:
        observation_space: ``Box(uint8)`` of :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper`.
        action_space: ``Discrete(max_actions)`` (positional slots of the admissible list).
        lr_schedule: SB3 learning-rate schedule.
        **kwargs: :class:`~echorl_agent.llm_rl.config.LLMPolicyConfig` fields (and PlanningConfig fields).
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, lr_schedule: Any,
                 use_sde: bool = False, optimizer_class: type = torch.optim.Adam,
                 optimizer_kwargs: dict[str, Any] | None = None, lm: TrainableLM | None = None, **kwargs: Any) -> None:
        if use_sde:
            raise ValueError("LLMPolicy has a discrete action space; use_sde must be False")
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(f"LLMPolicy needs a Discrete action space (admissible slots), got {action_space}")
        if not (isinstance(observation_space, spaces.Box) and observation_space.dtype == np.uint8
                and len(observation_space.shape) == 1):
            raise ValueError("LLMPolicy reads the byte observations of echorl_envs.wrappers.llm.LLMObservationWrapper"
                             f" (Box(uint8, (max_bytes,))), got observation_space={observation_space}")
        super().__init__(observation_space, action_space, normalize_images=False, optimizer_class=optimizer_class,
                         optimizer_kwargs=optimizer_kwargs)
        self.cfg = LLMPolicyConfig.from_kwargs(**kwargs)
        self.lm = lm if lm is not None else TrainableLM(self.cfg)
        hidden = self.lm.llm.model.config.hidden_size
        self.value_head = nn.Sequential(nn.Linear(hidden, self.cfg.value_hidden), nn.Tanh(),
                                        nn.Linear(self.cfg.value_hidden, 1))
        self.plan = PlanHead(hidden, self.cfg.planning, self.cfg.plan_tokens) if self.cfg.plan_tokens else None
        self.planning = self.cfg.planning
        if self.plan is None:
            self.planning.kl_coef = 0.0  # nothing to regularise without a plan
        self.placeholder_id = self.lm.llm.encode(" plan")[0]
        self._hidden = hidden
        self._store: dict[bytes, StepRecord] = {}
        self._features: OrderedDict[tuple[str, int], torch.Tensor] = OrderedDict()
        self.recording = False
        """True while collecting rollouts: records (with activations) are kept for the learner."""
        self.remote = None
        if self.cfg.rollout_url:
            from echorl_agent.llm_rl.remote import RemoteRollout

            self.remote = RemoteRollout(self.cfg.rollout_url, tokenizer=self.lm.tokenizer)
            self.remote.push(self.lm)
        self.to(self.lm.device)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    # ------------------------------------------------------------------ parameters (LM adapters included)
    def parameters(self, recurse: bool = True):  # type: ignore[override]
        yield from super().parameters(recurse)
        yield from self.lm.trainable_parameters()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        sd = super().state_dict(*args, **kwargs)
        for k, v in self.lm.trainable_state().items():
            sd["lm." + k] = v
        return sd

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False):  # type: ignore[override]
        lm_state = {k[3:]: v for k, v in state_dict.items() if k.startswith("lm.")}
        rest = {k: v for k, v in state_dict.items() if not k.startswith("lm.")}
        out = super().load_state_dict(rest, strict=strict, assign=assign)
        if lm_state:
            self.lm.load_trainable_state(lm_state)  # also pushes the weights to the rollout engine
        return out

    def _get_constructor_parameters(self) -> dict[str, Any]:
        import dataclasses

        data = super()._get_constructor_parameters()
        cfg = dataclasses.asdict(self.cfg)
        cfg["planning"] = self.cfg.planning
        data.update(cfg)
        return data

    def sync_engine(self) -> int:
        """Push the learner's weights to the rollout engine or server (after an update); returns the version."""
        if self.remote is not None:
            return self.remote.push(self.lm)
        return self.lm.sync()

    def clear_store(self) -> None:
        """Forget the records of the previous rollout."""
        self._store.clear()

    # ------------------------------------------------------------------ rollout side (engine)
    def _key(self, row: np.ndarray) -> bytes:
        return hashlib.blake2b(row.tobytes(), digest_size=16).digest()

    def _window(self, episode: str, t: int) -> torch.Tensor:
        k = self.planning.window
        zero = torch.zeros(self._hidden)
        return torch.stack([self._features.get((episode, i), zero) if i >= 0 else zero
                            for i in range(t - k - 1, t + 1)])

    def record(self, row: np.ndarray) -> StepRecord:
        """Score the state's admissible actions with the rollout engine (cached per observation bytes)."""
        key = self._key(row)
        rec = self._store.get(key)
        if rec is not None:
            return rec
        state = decode_llm_obs(row)
        if not state.get("admissible"):
            raise ValueError("the state lists no admissible action; LLMPolicy needs a choice env")
        llm = self.lm.llm
        prompt, span = render_prompt(llm, state, self.cfg.system_prompt, self.cfg.show_admissible)
        cands = candidate_ids(llm, state["admissible"])
        if self.remote is not None:
            return self._remote_record(key, prompt, cands)
        holder: dict[str, torch.Tensor] = {}
        episode, t = str(state.get("episode", "")), int(state.get("t", 0))

        def plan_tokens(states: torch.Tensor | None, last_h: torch.Tensor) -> SoftTokens | None:
            feat = (states[span:].mean(0) if states is not None else last_h).float().cpu()
            self._features[(episode, t)] = feat
            while len(self._features) > _MAX_FEATURES:
                self._features.popitem(last=False)
            holder["window"] = self._window(episode, t)
            if self.plan is None:
                return None
            with torch.no_grad():
                mu = self.plan.plans(holder["window"][None].to(self.lm.device))[0]
                embeds = self.plan.soft(mu)[0]
            return SoftTokens(embeds, layer=self.lm.boundary, token_id=self.placeholder_id)

        res = self.lm.engine.score(prompt, cands, soft=plan_tokens, capture=True)
        scores = torch.tensor(res.logprobs, dtype=torch.float64)
        logp = self._logits(scores, cands).log_softmax(-1).float()
        with torch.no_grad():
            value = float(self.value_head(res.hidden.to(self.lm.device).float()).item())
        m = self.cfg.plan_tokens
        rec = StepRecord(prompt + [self.placeholder_id] * m, len(prompt), cands, logp, value,
                         window=holder.get("window"))
        if self.lm.capture:
            rec.context_states, rec.cand_states = res.context_states, res.candidate_states
        if self.recording:
            self._store[key] = rec
        return rec

    def _remote_record(self, key: bytes, prompt: list[int], cands: list[list[int]]) -> StepRecord:
        scores = torch.tensor(self.remote.score(prompt, cands), dtype=torch.float64)
        rec = StepRecord(prompt, len(prompt), cands, self._logits(scores, cands).log_softmax(-1).float(), 0.0)
        with torch.no_grad():  # the critic lives on the learner
            rec.value = float(self.learner_scores(rec)[1].item())
        if self.recording:
            self._store[key] = rec
        return rec

    def _logits(self, scores: torch.Tensor, cands: list[list[int]]) -> torch.Tensor:
        if self.cfg.length_norm:
            scores = scores / torch.tensor([len(c) for c in cands], dtype=scores.dtype, device=scores.device)
        return scores / self.cfg.temperature

    def forward(self, obs: torch.Tensor, deterministic: bool = False, action_masks: Any = None):
        """Rollout step: ``(actions, values [B, 1], log_probs)`` from the engine's distribution."""
        actions, values, logps = [], [], []
        for row in obs.cpu().numpy().astype(np.uint8):
            rec = self.record(row)
            dist = torch.distributions.Categorical(logits=rec.rollout_logp)
            a = torch.argmax(rec.rollout_logp) if deterministic else dist.sample()
            actions.append(int(a))
            logps.append(float(rec.rollout_logp[a]))
            values.append(rec.value)
        dev = self.device
        return (torch.tensor(actions, device=dev), torch.tensor(values, device=dev)[:, None],
                torch.tensor(logps, device=dev))

    def predict_values(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.record(r).value for r in obs.cpu().numpy().astype(np.uint8)],
                            device=self.device)[:, None]

    def _predict(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.forward(observation, deterministic)[0]

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False,
                action_masks: Any = None):
        """SB3's ``predict`` (``action_masks`` is accepted for EchoPPO and ignored: the state lists the actions)."""
        return super().predict(observation, state, episode_start, deterministic)

    # ------------------------------------------------------------------ learner side
    def learner_scores(self, rec: StepRecord) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """``(log pi over candidates, value [1], plans)`` recomputed by the learner, differentiable.

        Starts from the captured activations when the record has them (exact reuse), otherwise recomputes the
        frozen layers without gradients.
        """
        lm, parts, b = self.lm, self.lm.parts, self.lm.boundary
        dev = lm.device
        batch = pack(len(rec.context), rec.cands, dev)
        if rec.context_states is not None:
            x = torch.cat([rec.context_states] + list(rec.cand_states), dim=0).to(dev)
        else:
            ids = torch.tensor(rec.context + [t for c in rec.cands for t in c], device=dev)
            with torch.no_grad():
                x = run_layers(parts, parts.embed(ids), batch, 0, b)
        inject, plans = None, None
        if self.plan is not None:
            plans = self.plan.plans(rec.window[None].to(dev))
            inject = {b: (rec.num_prompt, self.plan.soft(plans[0])[0])}
        x = run_layers(parts, x, batch, b, lm.num_layers, inject)
        lp, ctx_h = candidate_logprobs(parts, x, batch)
        logp = self._logits(lp.double(), rec.cands).log_softmax(-1).float()
        value = self.value_head(ctx_h.float())
        return logp, value, plans

    def _records(self, obs: torch.Tensor) -> list[StepRecord]:
        return [self.record(r) for r in obs.cpu().numpy().astype(np.uint8)]

    def evaluate_actions_and_plans(self, obs: torch.Tensor, actions: torch.Tensor, action_masks: Any = None):
        """``(values [B, 1], log_prob [B], entropy [B], (mu_t, log_std_t, mu_{t-1}, log_std_{t-1}))``."""
        values, logps, ents, plans = [], [], [], []
        for rec, a in zip(self._records(obs), actions.long().flatten().tolist(), strict=True):
            logp, value, p = self.learner_scores(rec)
            a = min(a, len(rec.cands) - 1)
            logps.append(logp[a])
            ents.append(-(logp.exp() * logp).sum())
            values.append(value)
            plans.append(p)
        if self.plan is not None:
            plan_t = tuple(torch.cat([p[i] for p in plans]) for i in range(4))
        else:
            z = torch.zeros(len(values), 1, device=self.lm.device)
            plan_t = (z, z, z, z)
        return torch.stack(values), torch.stack(logps), torch.stack(ents), plan_t

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor):
        """SB3 ``ActorCriticPolicy.evaluate_actions`` contract, for ``stable_baselines3.PPO``."""
        return self.evaluate_actions_and_plans(obs, actions)[:3]

    @torch.no_grad()
    def refresh_old_log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Before an update: the learner's log pi of the taken actions and the truncated IS weights.

        The rollout engine and the learner compute the same distribution with different kernels (or, with a
        quantized engine, different weights). PPO's ratio uses the learner's own old log-probabilities (so it is
        exactly 1 on the first minibatch) and the policy-gradient term is weighted by
        ``min(pi_learner_old(a|s) / pi_rollout(a|s), C)`` (truncated importance sampling) since the action was
        sampled by the rollout distribution.
        """
        olds, ws = [], []
        for rec, a in zip(self._records(obs), actions.long().flatten().tolist(), strict=True):
            if rec.learner_logp is None:
                rec.learner_logp = self.learner_scores(rec)[0].detach()
            a = min(a, len(rec.cands) - 1)
            olds.append(rec.learner_logp[a])
            ws.append(torch.exp(rec.learner_logp[a] - rec.rollout_logp[a]).clamp(max=self.cfg.is_truncation))
        return torch.stack(olds), torch.stack(ws)

    def importance_weights(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The truncated IS weights of :meth:`refresh_old_log_prob` for a minibatch."""
        return self.refresh_old_log_prob(obs, actions)[1]
