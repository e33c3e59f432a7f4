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

Use it with :class:`~echorl_agent.llm_rl.algorithms.ppo.llm_ppo.LLMPPO` (``LLMPPO("LLMPolicy", env, policy_kwargs={...})``), or with SB3's ``PPO`` (``evaluate_actions`` is provided).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from torch import nn

from echorl_agent.llm.engine.scoring import SoftTokens
from echorl_agent.llm_rl.config import LLMPolicyConfig
from echorl_agent.llm_rl.forward import (
    PackedBatch,
    candidate_set_logprobs_many,
    output_rows,
    pack_sets,
    run_layers,
)
from echorl_agent.llm_rl.lm import TrainableLM
from echorl_agent.llm_rl.plan import PlanHead
from echorl_agent.llm_rl.prompt import candidate_ids, render_prompt
from echorl_envs.wrappers.llm import decode_llm_obs

__all__ = ["LLMPolicy", "StepRecord", "merge_prefixes"]

_MAX_FEATURES = 20_000
_REFRESH_CHUNK = 32
"""Records per learner pass when recomputing old log-probabilities."""


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
    """Per candidate, the captured activations of its tokens but the last, ``[len(cand) - 1, hidden]``."""
    window: torch.Tensor | None = None
    """Plan features of steps t-k-1..t, ``[k + 2, hidden]``."""
    learner_logp: torch.Tensor | None = None
    """log pi over the candidates recomputed by the learner before the update (see ``LLMPPO``)."""
    ref_logp: torch.Tensor | None = None
    """log pi_ref over the candidates under the reference weights (``ref_kl_coef`` of the group learner)."""

    @classmethod
    def from_transition(cls, item: Any) -> StepRecord:
        """The record of a replayed :class:`~echorl_agent.replay.llm.LLMTransition` (duck-typed): token ids,
        rollout distribution, plan window and, when kept, the captured activations (the learner recomputes the
        frozen layers of an item without them). A critic-free item's value is 0."""
        return cls(list(item.context), item.num_prompt, [list(c) for c in item.cands], item.rollout_logp,
                   0.0 if item.value is None else float(item.value), context_states=item.context_states,
                   cand_states=None if item.cand_states is None else list(item.cand_states), window=item.window)


def merge_prefixes(recs: list[StepRecord]) -> list[tuple[int, list[int]]]:
    """Group records whose context is a prefix of a longer one's: ``[(head, members)]``, head = the longest."""
    order = sorted(range(len(recs)), key=lambda i: -len(recs[i].context))
    segments: list[tuple[int, list[int]]] = []
    for i in order:
        ctx = recs[i].context
        for head, members in segments:
            if recs[head].context[: len(ctx)] == ctx:
                members.append(i)
                break
        else:
            segments.append((i, [i]))
    return segments


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
    def _key(self, row: np.ndarray | dict[str, Any]) -> bytes:
        raw = json.dumps(row, ensure_ascii=False).encode("utf-8") if isinstance(row, dict) else row.tobytes()
        return hashlib.blake2b(raw, digest_size=16).digest()

    def _window(self, episode: str, t: int) -> torch.Tensor:
        k = self.planning.window
        zero = torch.zeros(self._hidden)
        return torch.stack([self._features.get((episode, i), zero) if i >= 0 else zero
                            for i in range(t - k - 1, t + 1)])

    def record(self, row: np.ndarray) -> StepRecord:
        """Score the state's admissible actions with the rollout engine (cached per observation bytes)."""
        return self.record_many([row])[0]

    def record_many(self, rows: np.ndarray | list[np.ndarray] | list[dict[str, Any]]) -> list[StepRecord]:
        """Score the admissible actions of several states (one per env) in one batched engine call. A state is the
        byte row of :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper` or its dict (``encode=False``).

        A state with no admissible action (the final observation of a truncated episode, whose value SB3
        bootstraps) gets a value-only record: its single placeholder candidate is the end-of-turn token.
        """
        out: list[StepRecord | None] = []
        todo: list[tuple[int, bytes, list[int], int, list[list[int]], str, int]] = []
        llm = self.lm.llm
        for row in rows:
            key = self._key(row)
            rec = self._store.get(key)
            out.append(rec)
            if rec is not None:
                continue
            state = decode_llm_obs(row)
            prompt, span = render_prompt(llm, state, self.cfg.system_prompt, self.cfg.show_admissible,
                                         self.cfg.admissible_in_system, self.cfg.drop_task_lines)
            cands = (candidate_ids(llm, state["admissible"], self.cfg.candidate_end_token) if state.get("admissible")
                     else [llm.eos_token_ids[:1]])
            todo.append((len(out) - 1, key, prompt, span, cands, str(state.get("episode", "")), int(state.get("t", 0))))
        if not todo:
            return out  # type: ignore[return-value]
        if self.remote is not None:
            for i, key, prompt, _, cands, _, _ in todo:
                out[i] = self._remote_record(key, prompt, cands)
            return out  # type: ignore[return-value]
        windows: dict[int, torch.Tensor] = {}
        # without a plan nothing reads the step features, and identical states (a group's common start) dedupe
        softs = None if self.plan is None else [self._plan_hook(i, span, episode, t, windows)
                                                for i, _, _, span, _, episode, t in todo]
        results = self.lm.engine.score_batch([t[2] for t in todo], [t[4] for t in todo], soft=softs, capture=True)
        with torch.no_grad():
            values = self.value_head(torch.stack([r.hidden for r in results]).to(self.lm.device).float())[:, 0]
        m = self.cfg.plan_tokens
        for (i, key, prompt, _, cands, _, _), res, value in zip(todo, results, values.tolist(), strict=True):
            scores = torch.tensor(res.logprobs, dtype=torch.float64)
            logp = self._logits(scores, cands).log_softmax(-1).float()
            rec = StepRecord(prompt + [self.placeholder_id] * m, len(prompt), cands, logp, value,
                             window=windows.get(i))
            if self.lm.capture:
                rec.context_states, rec.cand_states = res.context_states, res.candidate_states
            if self.recording:
                self._store[key] = rec
            out[i] = rec
        return out  # type: ignore[return-value]

    def _plan_hook(self, i: int, span: int, episode: str, t: int, windows: dict[int, torch.Tensor]):
        """The engine calls this after the prompt's prefill: store the step feature, return the plan's soft tokens."""

        def plan_tokens(states: torch.Tensor | None, last_h: torch.Tensor) -> SoftTokens | None:
            feat = (states[span:].mean(0) if states is not None else last_h).float().cpu()
            self._features[(episode, t)] = feat
            while len(self._features) > _MAX_FEATURES:
                self._features.popitem(last=False)
            windows[i] = self._window(episode, t)
            with torch.no_grad():
                mu = self.plan.plans(windows[i][None].to(self.lm.device))[0]
                embeds = self.plan.soft(mu)[0]
            return SoftTokens(embeds, layer=self.lm.boundary, token_id=self.placeholder_id)

        return plan_tokens

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
        for rec in self._records(obs):
            dist = torch.distributions.Categorical(logits=rec.rollout_logp)
            a = torch.argmax(rec.rollout_logp) if deterministic else dist.sample()
            actions.append(int(a))
            logps.append(float(rec.rollout_logp[a]))
            values.append(rec.value)
        dev = self.device
        return (torch.tensor(actions, device=dev), torch.tensor(values, device=dev)[:, None],
                torch.tensor(logps, device=dev))

    def predict_values(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([r.value for r in self._records(obs)], device=self.device)[:, None]

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
        logps, values, plans = self.learner_scores_many([rec])
        return logps[0], values[0], None if plans is None else tuple(p[:1] for p in plans)

    def learner_scores_many(self, recs: list[StepRecord]) -> tuple[list[torch.Tensor], torch.Tensor, tuple | None]:
        """:meth:`learner_scores` for a minibatch: ``(log pi per record, values [B, 1], plans or None)``.

        Records whose prompt is a prefix of another's (later steps of one episode inside a history chunk, or the
        same state reached again, e.g. the K episodes of a group) share one packed sequence: its context rows run
        once through the trained layers and each record's candidates attend to its own prefix
        (:func:`~echorl_agent.llm_rl.forward.pack_sets`). With soft plan tokens every record is its own sequence.
        """
        dev = self.lm.device
        segments = merge_prefixes(recs) if self.plan is None else [(i, [i]) for i in range(len(recs))]
        plans = self.plan.plans(torch.stack([r.window for r in recs]).to(dev)) if self.plan is not None else None
        logps: list[torch.Tensor | None] = [None] * len(recs)
        values: list[torch.Tensor | None] = [None] * len(recs)
        packed, owners = [], []
        for head, members in segments:
            sets: dict[tuple, int] = {}  # (prefix, candidates) -> candidate-set index in the packed sequence
            reps: list[StepRecord] = []  # the record that stands for each set
            member_set = []
            for i in members:
                k = sets.setdefault((len(recs[i].context), tuple(map(tuple, recs[i].cands))), len(reps))
                if k == len(reps):
                    reps.append(recs[i])
                member_set.append(k)
            packed.append(self._segment_layers(recs[head], reps,
                                               None if plans is None else self.plan.soft(plans[0][head : head + 1])[0]))
            owners.append((members, member_set))
        # the LM head and the value head once for the whole minibatch (their weights are read once)
        outs = candidate_set_logprobs_many(self.lm.parts, packed)
        set_v = self.value_head(torch.cat([ctx_h for _, ctx_h in outs]).float())
        off = 0
        for (set_lp, ctx_h), (members, member_set) in zip(outs, owners, strict=True):
            for i, k in zip(members, member_set, strict=True):
                logps[i] = self._logits(set_lp[k].double(), recs[i].cands).log_softmax(-1).float()
                values[i] = set_v[off + k]
            off += len(ctx_h)
        return logps, torch.stack(values), plans  # type: ignore[arg-type]

    def _segment_layers(self, head: StepRecord, reps: list[StepRecord],
                        soft: torch.Tensor | None) -> tuple[torch.Tensor, PackedBatch, list[int]]:
        """Trained layers over ``head``'s context with the candidate sets of ``reps`` (whose prompts are prefixes of
        it): ``(x, batch, rows)``, the top layer's output on the rows the LM head and the value head read."""
        lm, parts, b = self.lm, self.lm.parts, self.lm.boundary
        dev = lm.device
        captured = head.context_states is not None and all(r.cand_states is not None for r in reps)
        states = [c for r in reps for c in r.cand_states] if captured else None
        batch = pack_sets(len(head.context), [(len(r.context), r.cands) for r in reps], dev, states=states)
        if states is not None:
            # the frozen layers' activations as the rollout captured them (a prefix's are the same rows)
            x = torch.cat([head.context_states, batch.candidate_rows(states)], dim=0).to(dev)
        else:
            ids = torch.tensor(batch.row_ids(head.context), device=dev)
            with torch.no_grad():
                x = run_layers(parts, parts.embed(ids), batch, 0, b)
        inject = {b: (head.num_prompt, soft)} if soft is not None else None
        rows = output_rows(batch, [s.prefix - 1 for s in batch.sets])  # the top layer runs only these rows
        return run_layers(parts, x, batch, b, lm.num_layers, inject, keep=rows), batch, rows

    def _records(self, obs: torch.Tensor) -> list[StepRecord]:
        return self.record_many(obs.cpu().numpy().astype(np.uint8))

    def evaluate_actions_and_plans(self, obs: torch.Tensor, actions: torch.Tensor, action_masks: Any = None):
        """``(values [B, 1], log_prob [B], entropy [B], (mu_t, log_std_t, mu_{t-1}, log_std_{t-1}))``."""
        recs = self._records(obs)
        logps, values, plans = self.learner_scores_many(recs)
        acts = [min(a, len(r.cands) - 1) for r, a in zip(recs, actions.long().flatten().tolist(), strict=True)]
        logp = torch.stack([lp[a] for lp, a in zip(logps, acts, strict=True)])
        ent = torch.stack([-(lp.exp() * lp).sum() for lp in logps])
        if plans is None:
            z = torch.zeros(len(recs), 1, device=self.lm.device)
            plans = (z, z, z, z)
        return values, logp, ent, plans

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
        recs = self._records(obs)
        todo = [r for r in {id(r): r for r in recs}.values() if r.learner_logp is None]
        for lo in range(0, len(todo), _REFRESH_CHUNK):
            chunk = todo[lo : lo + _REFRESH_CHUNK]
            for rec, lp in zip(chunk, self.learner_scores_many(chunk)[0], strict=True):
                rec.learner_logp = lp.detach()
        olds, ws = [], []
        for rec, a in zip(recs, actions.long().flatten().tolist(), strict=True):
            a = min(a, len(rec.cands) - 1)
            olds.append(rec.learner_logp[a])
            ws.append(torch.exp(rec.learner_logp[a] - rec.rollout_logp[a]).clamp(max=self.cfg.is_truncation))
        return torch.stack(olds), torch.stack(ws)

    def importance_weights(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The truncated IS weights of :meth:`refresh_old_log_prob` for a minibatch."""
        return self.refresh_old_log_prob(obs, actions)[1]
