"""One LLM decision kept for replay (:class:`LLMTransition`) and its packing into the checksummed replay file.

The item mirrors what the rollout computed for one state (``echorl_agent.llm_rl.policy.StepRecord``: token ids,
candidate actions, the rollout distribution, the captured activations entering the first trained layer) plus
what the learner attached to it (taken action, advantage, return, weight version, group). The replay buffer
(:mod:`echorl_agent.replay.llm`) never needs the model: everything here is token ids and tensors.

Packing (:func:`pack_items` / :func:`unpack_items`) turns a list of items into flat numpy arrays (ragged fields as
concatenated rows plus per-item row counts) for :func:`echorl_agent.replay.serialization.write_arrays`; tensors
round-trip bit-exactly, bfloat16 included (stored as its int16 bit pattern).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from echorl_agent.replay.serialization import ReplayFileError

__all__ = ["LLMTransition", "pack_items", "unpack_items"]

_SCALAR_NBYTES = 64
"""Accounted bytes of an item's scalars (action, advantage, return, value, version, group, flags)."""


@dataclass(eq=False)  # identity equality: comparing tensors field by field has no single truth value
class LLMTransition:
    """One LLM decision: context tokens, candidate actions, the rollout's distribution and what the learner needs.

    Field names follow ``StepRecord`` of :mod:`echorl_agent.llm_rl.policy` (see :meth:`from_record`).
    """

    context: list[int]
    """Prompt token ids (+ the m soft-plan placeholder ids)."""
    num_prompt: int
    """How many of ``context`` are prompt tokens (the plan placeholders follow)."""
    cands: list[list[int]]
    """Token ids of each candidate action (a free-text item has one: the generated completion)."""
    action: int
    """Index into ``cands`` of the action taken."""
    rollout_logp: torch.Tensor
    """``[len(cands)]`` log pi_rollout over the candidates (free text: ``[1]``, the completion's log-prob)."""
    advantage: float
    """Advantage of the taken action (GAE, or the group-normalised reward of GRPO/GiGPO)."""
    ret: float
    """Return (the value target)."""
    value: float | None = None
    """Critic value at rollout time; None for critic-free learners (GRPO/GiGPO)."""
    version: int = 0
    """Weight version of the engine that produced the item (``LLMEngine.weight_version``)."""
    group: int | None = None
    """GRPO/GiGPO group id (items scored against each other); required for free-text items."""
    free_text: bool = False
    """True when the action is generated text rather than a choice among admissible actions."""
    plan: torch.Tensor | None = None
    """``[d]`` plan tau_t (EchoRL Eq. 6's plan term); when given for every item it enters the priority."""
    window: torch.Tensor | None = None
    """``[k + 2, hidden]`` plan-window features the plan head reads."""
    context_states: torch.Tensor | None = None
    """``[len(context), hidden]`` activations entering the first trained layer (None: dropped or never captured)."""
    cand_states: list[torch.Tensor] | None = None
    """``[len(cands[i]) - 1, hidden]`` activations of each candidate's tokens but its last entering the first trained
    layer (the learner gives a candidate's last token no row: it is only a target)."""

    @classmethod
    def from_record(cls, rec: Any, *, action: int, advantage: float, ret: float, version: int,
                    group: int | None = None, plan: torch.Tensor | None = None,
                    free_text: bool = False) -> LLMTransition:
        """Build an item from a rollout record with ``StepRecord``'s attributes (duck-typed, no import)."""
        return cls(context=list(rec.context), num_prompt=int(rec.num_prompt), cands=[list(c) for c in rec.cands],
                   action=int(action), rollout_logp=rec.rollout_logp, advantage=float(advantage), ret=float(ret),
                   value=None if rec.value is None else float(rec.value), version=int(version), group=group,
                   free_text=free_text, plan=plan, window=rec.window, context_states=rec.context_states,
                   cand_states=None if rec.cand_states is None else list(rec.cand_states))

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field (shapes, ranges, the free-text/group rule)."""
        if not self.context or not all(isinstance(t, (int, np.integer)) for t in self.context):
            raise ValueError(f"context must be a non-empty list of token ids, got context={self.context!r:.80}")
        if not 0 <= self.num_prompt <= len(self.context):
            raise ValueError(f"num_prompt must be in [0, len(context)={len(self.context)}], got "
                             f"num_prompt={self.num_prompt}")
        if not self.cands or any(not c for c in self.cands):
            raise ValueError(f"cands must be a non-empty list of non-empty token-id lists, got cands={self.cands!r:.80}")
        if not 0 <= self.action < len(self.cands):
            raise ValueError(f"action must index cands (0..{len(self.cands) - 1}), got action={self.action}")
        if tuple(self.rollout_logp.shape) != (len(self.cands),):
            raise ValueError(f"rollout_logp must have shape ({len(self.cands)},) (one per candidate), got "
                             f"rollout_logp.shape={tuple(self.rollout_logp.shape)}")
        for name in ("advantage", "ret"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {name}={getattr(self, name)}")
        if self.free_text and self.group is None:
            raise ValueError(
                "group must be set for a free-text item (free_text=True): replaying generated text needs the "
                "GRPO/GiGPO group its advantage was measured in; got group=None. Pass group=<id>, or replay=None")
        if self.free_text and len(self.cands) != 1:
            raise ValueError(f"a free-text item has one candidate (its completion), got {len(self.cands)} cands")
        if (self.context_states is None) != (self.cand_states is None):
            raise ValueError("context_states and cand_states must be given together (both captured, or neither)")
        if self.context_states is not None:
            hidden = self.context_states.shape[-1]
            if tuple(self.context_states.shape) != (len(self.context), hidden):
                raise ValueError(f"context_states must be [len(context)={len(self.context)}, hidden], got "
                                 f"context_states.shape={tuple(self.context_states.shape)}")
            shapes = [tuple(s.shape) for s in self.cand_states]
            if shapes != [(len(c) - 1, hidden) for c in self.cands]:
                raise ValueError(f"cand_states must be [len(cands[i]) - 1, {hidden}] per candidate (every token but "
                                 f"the last), got shapes {shapes}")

    # ------------------------------------------------------------------ sizes (the memory budget's units)
    @property
    def token_nbytes(self) -> int:
        """Bytes kept without activations: int64 token ids, the small tensors and the scalars."""
        n_tokens = len(self.context) + sum(len(c) for c in self.cands)
        small = sum(t.numel() * t.element_size() for t in (self.rollout_logp, self.plan, self.window) if t is not None)
        return 8 * n_tokens + small + _SCALAR_NBYTES

    @property
    def activation_nbytes(self) -> int:
        """Bytes of the captured activations (0 when dropped)."""
        if self.context_states is None:
            return 0
        return sum(t.numel() * t.element_size() for t in [self.context_states, *self.cand_states])

    def without_activations(self) -> LLMTransition:
        return dataclasses.replace(self, context_states=None, cand_states=None)


# ---------------------------------------------------------------------------------------------------- packing
def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _to_torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.array(a))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def _pack_ragged(name: str, tensors: Sequence[torch.Tensor | None], arrays: dict, meta: dict) -> None:
    """Optional per-item tensors of one dtype and trailing shape -> rows concatenated + per-item row counts."""
    present = [t for t in tensors if t is not None]
    arrays[f"{name}_rows"] = np.array([-1 if t is None else t.shape[0] for t in tensors], dtype=np.int64)
    if not present:
        return
    dtypes = {str(t.dtype).removeprefix("torch.") for t in present}
    tails = {tuple(t.shape[1:]) for t in present}
    if len(dtypes) != 1 or len(tails) != 1:
        raise ValueError(f"every item's {name} must share dtype and trailing shape to be saved, got {dtypes}, {tails}")
    arrays[name] = np.concatenate([_to_numpy(t) for t in present])
    meta[name] = {"dtype": dtypes.pop(), "tail": list(tails.pop())}


def _unpack_ragged(name: str, arrays: dict, meta: dict) -> list[torch.Tensor | None]:
    rows = np.asarray(arrays[f"{name}_rows"])
    if name not in meta:
        if (rows != -1).any():
            raise ReplayFileError(f"items/{name}: row counts given but no data")
        return [None] * len(rows)
    data, info = np.asarray(arrays[name]), meta[name]
    if (rows < -1).any() or int(rows[rows > 0].sum()) != len(data) or list(data.shape[1:]) != info["tail"]:
        raise ReplayFileError(f"items/{name}: row counts {int(rows[rows > 0].sum())} or shape {data.shape} do not "
                              "match the stored rows")
    out, start = [], 0
    for r in rows.tolist():
        if r < 0:
            out.append(None)
            continue
        out.append(_to_torch(data[start : start + r], info["dtype"]))
        start += r
    return out


def pack_items(items: Sequence[LLMTransition]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Flat arrays + meta describing ``items`` (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {
        "ctx_len": np.array([len(it.context) for it in items], dtype=np.int64),
        "num_prompt": np.array([it.num_prompt for it in items], dtype=np.int64),
        "num_cands": np.array([len(it.cands) for it in items], dtype=np.int64),
        "cand_len": np.array([len(c) for it in items for c in it.cands], dtype=np.int64),
        "tokens": np.array([t for it in items for t in (*it.context, *(x for c in it.cands for x in c))],
                           dtype=np.int64),
        "action": np.array([it.action for it in items], dtype=np.int64),
        "advantage": np.array([it.advantage for it in items], dtype=np.float64),
        "ret": np.array([it.ret for it in items], dtype=np.float64),
        "value": np.array([math.nan if it.value is None else it.value for it in items], dtype=np.float64),
        "has_value": np.array([it.value is not None for it in items], dtype=bool),
        "version": np.array([it.version for it in items], dtype=np.int64),
        "group": np.array([0 if it.group is None else it.group for it in items], dtype=np.int64),
        "has_group": np.array([it.group is not None for it in items], dtype=bool),
        "free_text": np.array([it.free_text for it in items], dtype=bool),
    }
    meta: dict[str, Any] = {}
    _pack_ragged("rollout_logp", [it.rollout_logp for it in items], arrays, meta)
    _pack_ragged("plan", [it.plan for it in items], arrays, meta)
    _pack_ragged("window", [it.window for it in items], arrays, meta)
    _pack_ragged("context_states", [it.context_states for it in items], arrays, meta)
    _pack_ragged("cand_states", [None if it.cand_states is None else torch.cat(it.cand_states) for it in items],
                 arrays, meta)
    return arrays, meta


def unpack_items(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> list[LLMTransition]:
    """Inverse of :func:`pack_items`; raises :class:`ReplayFileError` when the arrays disagree with each other."""
    ctx_len, num_cands = np.asarray(arrays["ctx_len"]), np.asarray(arrays["num_cands"])
    cand_len, tokens = np.asarray(arrays["cand_len"]).tolist(), np.asarray(arrays["tokens"]).tolist()
    n = len(ctx_len)
    if (ctx_len < 1).any() or (num_cands < 1).any() or len(cand_len) != int(num_cands.sum()) or \
            len(tokens) != int(ctx_len.sum()) + sum(cand_len):
        raise ReplayFileError("items: token and candidate counts do not add up")
    ragged = {k: _unpack_ragged(k, arrays, meta) for k in ("rollout_logp", "plan", "window", "context_states",
                                                             "cand_states")}
    scal = {k: np.asarray(arrays[k]).tolist() for k in ("num_prompt", "action", "advantage", "ret", "value",
                                                        "has_value", "version", "group", "has_group", "free_text")}
    if any(len(v) != n for v in (*scal.values(), *ragged.values())):
        raise ReplayFileError(f"items: per-item arrays do not all have {n} entries")
    items, tok, ci = [], 0, 0
    for i in range(n):
        context = tokens[tok : tok + int(ctx_len[i])]
        tok += int(ctx_len[i])
        cands = []
        for length in cand_len[ci : ci + int(num_cands[i])]:
            cands.append(tokens[tok : tok + length])
            tok += length
        lens = cand_len[ci : ci + int(num_cands[i])]
        ci += int(num_cands[i])
        cs, cand_states = ragged["cand_states"][i], None
        if cs is not None:
            if cs.shape[0] == sum(lens):  # written before the last token's row was dropped: drop it on load
                cand_states = [c[:-1] for c in torch.split(cs, lens)]
            elif cs.shape[0] == sum(lens) - len(lens):
                cand_states = list(torch.split(cs, [n - 1 for n in lens]))
            else:
                raise ReplayFileError(f"items: stored item {i} has {cs.shape[0]} candidate-state rows for "
                                      f"{sum(lens) - len(lens)} input tokens")
        it = LLMTransition(
            context=context, num_prompt=scal["num_prompt"][i], cands=cands, action=scal["action"][i],
            rollout_logp=ragged["rollout_logp"][i], advantage=scal["advantage"][i], ret=scal["ret"][i],
            value=scal["value"][i] if scal["has_value"][i] else None, version=scal["version"][i],
            group=scal["group"][i] if scal["has_group"][i] else None, free_text=scal["free_text"][i],
            plan=ragged["plan"][i], window=ragged["window"][i], context_states=ragged["context_states"][i],
            cand_states=cand_states)
        try:
            if it.rollout_logp is None:
                raise ValueError("rollout_logp is missing")
            it.validate()
        except ValueError as e:
            raise ReplayFileError(f"items: stored item {i} is invalid ({e})") from e
        items.append(it)
    return items
