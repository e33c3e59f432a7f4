"""The learner's forward: one prompt and all its candidate actions in one packed sequence, from any layer up.

For a context ``C`` (prompt tokens, then optional soft plan tokens; ``P`` rows) and candidates ``a_1..a_N`` the
packed sequence is ``[C, a_1[:-1], ..., a_N[:-1]]``; candidate ``a_i`` sits at positions ``P .. P + |a_i| - 2`` and
attends to all of ``C`` and to its own earlier tokens (a block mask, as lamorel's ``pre_encode_inputs`` but in one
pass). Every token of ``C`` is computed once however many candidates there are, and a candidate's last token gets
no row at all: its output would predict past the candidate and no row attends to it (its id is only a target).
Candidates that begin alike share rows: ``[C, tree]`` holds one row per distinct input prefix of the candidates
(ALFWorld's "go to shelf 1", "go to shelf 2" share "go", " to", " shelf"), each row attending to ``C`` and its
ancestors -- the same computation per candidate token, on fewer rows (the rollout engine's candidate tree does the
same, :mod:`echorl_agent.llm.engine.scoring`).

The forward can start at any layer ``b``: given the activations entering layer ``b`` (the rollout engine captured
them, see :meth:`echorl_agent.llm.engine.runner.ModelRunner.enable_capture`) only layers ``b..L-1`` run -- with gradients
when they hold the trainable parameters (LoRA adapters or unfrozen top layers) -- so the frozen layers below are
never recomputed by the learner. Only some rows' outputs are ever read (the rows that predict a candidate token,
and each set's last context row): ``run_layers(..., keep=rows)`` runs the last layer's queries, attention output and
MLP on those rows alone (its keys and values still cover every row), which is exact and skips most of that layer
(:func:`output_rows`). The arithmetic is the HF modules' own (RMSNorm, projections incl. peft's LoRA
wrappers, rotary embedding, MLP), found through the model's :class:`~echorl_agent.llm.models.base.ModelLayout` (Llama,
SmolLM2, Qwen2, Mistral); attention is ``scaled_dot_product_attention`` with the block mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from echorl_agent.llm.models.base import ModelLayout
from echorl_agent.llm.models.registry import layout_for

__all__ = ["DecoderParts", "CandidateSet", "PackedBatch", "pack", "pack_sets", "output_rows", "run_layers",
           "candidate_logprobs", "candidate_set_logprobs", "candidate_set_logprobs_many",
           "candidate_token_logprobs"]


@dataclass
class DecoderParts:
    """The modules of a causal LM the packed forward needs (works through a peft wrapper), found through its
    :class:`~echorl_agent.llm.models.base.ModelLayout`."""

    embed: torch.nn.Module
    layers: list[torch.nn.Module]
    norm: torch.nn.Module
    rotary: torch.nn.Module
    lm_head: torch.nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layout: ModelLayout
    """Where each decoder layer keeps its norms and projections."""
    rope: Callable
    """The family's RoPE function ``(q, k, cos, sin, unsqueeze_dim) -> (q, k)`` (:meth:`ModelLayout.rope_function`)."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> DecoderParts:
        """Find the parts in an HF ``*ForCausalLM`` or a peft model wrapping one."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the wrapped HF model
        layout = layout_for(base.config)
        return cls(
            embed=layout.embedding(base), layers=layout.decoder_layers(base), norm=layout.final_norm(base),
            rotary=layout.rotary(base), lm_head=layout.lm_head(base), num_heads=layout.num_heads,
            num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim, layout=layout,
            rope=layout.rope_function(base),
        )


@dataclass
class CandidateSet:
    """The candidates of one state in a packed sequence: they see the first ``prefix`` context rows.

    ``rows[i]`` are the packed rows holding candidate ``i``'s tokens but its last (``ids[i][:-1]``), in order; row
    ``rows[i][j]`` predicts token ``ids[i][j + 1]``. Candidates that begin alike share the rows of their common
    tokens (a prefix tree), so ``rows`` of different candidates can overlap.
    """

    prefix: int
    rows: list[list[int]]
    ids: list[list[int]]


@dataclass
class PackedBatch:
    """Positions, attention mask and candidate rows of one packed ``[context, candidate tree rows...]`` sequence.

    Several states whose prompts are prefixes of one context (consecutive steps of an episode inside one history
    chunk, or the same state reached twice) share the context rows: each state's candidate set attends to its own
    prefix of the context only, so every state's log-probabilities are those of its own prompt.
    """

    positions: torch.Tensor  # [T]
    mask: torch.Tensor  # [T, T] bool, True = may attend
    context_len: int
    sets: list[CandidateSet]
    #: for each row after the context: its index in the concatenation of every candidate's input tokens
    #: (``ids[:-1]`` of each candidate of each set, in order) -- the first candidate token that row stands for
    sources: list[int]

    @property
    def cand_rows(self) -> list[list[int]]:
        """Every candidate's rows (:attr:`CandidateSet.rows`), all sets in order."""
        return [r for s in self.sets for r in s.rows]

    @property
    def cand_ids(self) -> list[list[int]]:
        return [c for s in self.sets for c in s.ids]

    def row_ids(self, context: Sequence[int]) -> list[int]:
        """The token id of every packed row: the context's ``context_len`` tokens, then the token each candidate row
        stands for (what :func:`run_layers` embeds when it starts from layer 0)."""
        flat = [t for c in self.cand_ids for t in c[:-1]]
        return list(context[: self.context_len]) + [flat[i] for i in self.sources]

    def candidate_rows(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The candidate rows from per-candidate activations ``states`` (``[len(ids[i]) - 1, hidden]`` each, as the
        rollout engine captured them, all sets' candidates in order): ``[T - context_len, hidden]``."""
        flat = torch.cat(list(states), dim=0)
        return flat[torch.tensor(self.sources, device=flat.device, dtype=torch.long)]


def pack(context_len: int, cand_ids: Sequence[Sequence[int]], device: torch.device | str = "cpu",
         share_prefixes: bool = True, states: Sequence[torch.Tensor] | None = None) -> PackedBatch:
    """Build the block mask and positions for a context of ``context_len`` rows and the candidates."""
    return pack_sets(context_len, [(context_len, cand_ids)], device, share_prefixes, states)


def pack_sets(context_len: int, sets: Sequence[tuple[int, Sequence[Sequence[int]]]],
              device: torch.device | str = "cpu", share_prefixes: bool = True,
              states: Sequence[torch.Tensor] | None = None) -> PackedBatch:
    """A context of ``context_len`` rows and candidate sets ``(prefix, cand_ids)`` attached after ``prefix`` rows.

    With ``share_prefixes`` (the default) the candidates of a set form a prefix tree: "go to shelf 1" and "go to
    shelf 2" share the rows of "go", " to" and " shelf" (one row per distinct input prefix, attending to the set's
    context prefix and to its ancestors). Every candidate token is predicted by the same computation as with one row
    per candidate token (``share_prefixes=False``), on fewer rows -- in the trained layers and in the LM head.

    Args:
        states: the activations the rows will start from, per candidate (all sets' candidates in order,
            ``[len(ids) - 1, hidden]`` each; :meth:`PackedBatch.candidate_rows`). Two candidates then share a row
            only when their activations there are equal too: the rollout engine computes a common prefix once when
            its own candidate tree does, but with int8 prefill two separate computations of one prefix differ by
            rounding, and the learner should compute what the engine scored.
    """
    pos = list(range(context_len))
    row = context_len
    out: list[CandidateSet] = []
    sources: list[int] = []
    flat = 0
    flat_states = torch.cat(list(states)) if states is not None and len(states) else None
    need = sum(max(len(c) - 1, 0) for _, cands in sets for c in cands)
    if flat_states is not None and flat_states.shape[0] != need:
        raise ValueError(f"states hold {flat_states.shape[0]} rows, the candidates' inputs {need}")
    for prefix, cands in sets:
        if not 0 < prefix <= context_len:
            raise ValueError(f"a candidate set's prefix must be in [1, {context_len}], got prefix={prefix}")
        nodes: dict[tuple[int | None, int], list[int]] = {}  # (parent row, token) -> the rows standing for it
        rows_of = []
        for c in cands:
            if not c:
                raise ValueError("every candidate needs at least one token, got an empty candidate")
            rr: list[int] = []
            for j in range(len(c) - 1):
                key = (rr[-1] if rr else None, c[j])
                r = None
                for cand_row in nodes.get(key, []) if share_prefixes else []:
                    if flat_states is None or torch.equal(flat_states[sources[cand_row - context_len]],
                                                          flat_states[flat + j]):
                        r = cand_row
                        break
                if r is None:
                    r = row
                    nodes.setdefault(key, []).append(r)
                    row += 1
                    pos.append(prefix + j)
                    sources.append(flat + j)
                rr.append(r)
            flat += len(c) - 1
            rows_of.append(rr)
        out.append(CandidateSet(prefix, rows_of, [list(c) for c in cands]))
    mask = torch.zeros(row, row, dtype=torch.bool)
    mask[:context_len, :context_len] = torch.ones(context_len, context_len, dtype=torch.bool).tril()
    for s in out:
        for rr in s.rows:
            if rr:
                idx = torch.tensor(rr)
                mask[idx, : s.prefix] = True
                mask[idx[:, None], idx[None, :]] |= torch.ones(len(rr), len(rr), dtype=torch.bool).tril()
    return PackedBatch(torch.tensor(pos, device=device), mask.to(device), context_len, out, sources)


def output_rows(batch: PackedBatch, extra_rows: Sequence[int] = ()) -> list[int]:
    """The rows whose last-layer output is read: every row that predicts a candidate token, and ``extra_rows``
    (sorted, each once) -- ``keep`` for :func:`run_layers`, ``rows`` for the log-probability functions."""
    rows, _, _ = _candidate_token_rows(batch)
    return sorted(set(rows) | set(extra_rows))


def run_layers(parts: DecoderParts, x: torch.Tensor, batch: PackedBatch, start: int, stop: int,
               inject: dict[int, tuple[int, torch.Tensor]] | None = None,
               keep: Sequence[int] | None = None) -> torch.Tensor:
    """Run decoder layers ``start..stop-1`` on the packed rows ``x`` ``[T, hidden]``.

    Args:
        inject: ``{layer: (row, embeds [m, hidden])}`` -- ``embeds`` is added to rows ``row..row+m-1`` entering
            ``layer`` (the soft plan tokens; differentiable).
        keep: if given, return only these rows ``[len(keep), hidden]``: the last layer computes keys and values for
            every row but queries, attention output and MLP for these rows only (the other rows' outputs would
            never be read).
    """
    inject = inject or {}
    if not parts.layers[start:stop]:
        return x if keep is None else x[torch.as_tensor(list(keep), device=x.device, dtype=torch.long)]
    cos, sin = parts.rotary(x, batch.positions[None, :])
    cos, sin = cos[0], sin[0]
    rope, layout = parts.rope, parts.layout
    n, hq, hkv, d = x.shape[0], parts.num_heads, parts.num_kv_heads, parts.head_dim
    rep = hq // hkv
    for li in range(start, stop):
        if li in inject:
            row, e = inject[li]
            x = torch.cat([x[:row], x[row : row + e.shape[0]] + e.to(x.dtype), x[row + e.shape[0]:]], dim=0)
        layer = parts.layers[li]
        wq, wk, wv, wo = layout.attention_projections(layer)
        h = layout.input_norm(layer)(x)
        k = wk(h).view(n, hkv, d)
        v = wv(h).view(n, hkv, d).repeat_interleave(rep, dim=1)
        if keep is not None and li == stop - 1:
            idx = torch.as_tensor(list(keep), device=x.device, dtype=torch.long)
            q = wq(h[idx]).view(len(idx), hq, d)
            q, _ = rope(q, q, cos[idx], sin[idx], unsqueeze_dim=1)
            _, k = rope(k, k, cos, sin, unsqueeze_dim=1)
            mask, x = batch.mask[idx], x[idx]
        else:
            q = wq(h).view(n, hq, d)
            q, k = rope(q, k, cos, sin, unsqueeze_dim=1)
            mask = batch.mask
        k = k.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           attn_mask=mask)  # [H, rows, D]
        x = x + wo(o.transpose(0, 1).reshape(q.shape[0], hq * d))
        x = x + layout.mlp(layer)(layout.post_attention_norm(layer)(x))
    return x


def candidate_logprobs(parts: DecoderParts, x: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token log-probabilities of each candidate, and the final hidden state of the last context row.

    Args:
        x: the packed rows after the last layer ``[T, hidden]`` (before the final norm).

    Returns:
        ``(logprobs [N], context_hidden [hidden])`` for a batch with one candidate set (see
        :func:`candidate_set_logprobs` for several).
    """
    lps, ctx = candidate_set_logprobs(parts, x, batch)
    if len(lps) != 1:
        raise ValueError(f"candidate_logprobs takes one candidate set, the batch has {len(lps)}")
    return lps[0], ctx[0]


def _candidate_token_rows(batch: PackedBatch) -> tuple[list[int], list[int], list[int]]:
    """For every candidate token: the row that predicts it, the token id, and the index of its candidate."""
    rows, targets, owners = [], [], []
    n = 0
    for s in batch.sets:
        for rr, ids in zip(s.rows, s.ids, strict=True):
            # ids[0] is predicted by the set's last context row, ids[j] (j >= 1) by row rr[j - 1]
            rows.append(s.prefix - 1)
            rows.extend(rr)
            targets.extend(ids)
            owners.extend([n] * len(ids))
            n += 1
    return rows, targets, owners


def _candidate_token_lp(parts: DecoderParts, x: torch.Tensor, batch: PackedBatch, extra_rows: Sequence[int] = (),
                        x_rows: Sequence[int] | None = None) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """Log-probability of every candidate token (flat), its candidate index, and the normed ``extra_rows``.

    Only candidate tokens (and ``extra_rows``) go through the final norm; only candidate tokens through the LM head.
    ``x_rows``: the packed rows ``x`` holds, in order (``run_layers(..., keep=x_rows)``); ``None`` = all rows.
    """
    return _candidate_token_lp_many(parts, [(x, batch, extra_rows, x_rows)])[0]


def _candidate_token_lp_many(parts: DecoderParts, items: Sequence[tuple[torch.Tensor, PackedBatch, Sequence[int],
                                                                        Sequence[int] | None]]
                             ) -> list[tuple[torch.Tensor, list[int], torch.Tensor]]:
    """:func:`_candidate_token_lp` of several packed sequences ``(x, batch, extra_rows, x_rows)``, with one final
    norm, one LM head and one softmax over all their rows: the head's weight (576 x 49,152 for SmolLM2) is read once
    per call, not once per sequence (a learner micro-batch holds about 16 GoToLocal states of 13 head rows each)."""
    dev = items[0][0].device
    extra_x, tok_x, which, targets, per_item, off = [], [], [], [], [], 0
    for x, batch, extra_rows, x_rows in items:
        rows, tgt, owners = _candidate_token_rows(batch)
        need = list(extra_rows) + rows
        if x_rows is not None:
            at = {r: i for i, r in enumerate(x_rows)}
            missing = [r for r in need if r not in at]
            if missing:
                raise ValueError(f"x holds rows {list(x_rows)[:8]}..., the log-probabilities need rows {missing[:8]}")
            need = [at[r] for r in need]
        # a set's last prompt row predicts the first token of all its candidates: the LM head and softmax run once
        # per distinct row (a GoToLocal state's 7 candidates: 19 tokens, 13 distinct rows), and each token gathers
        # its row's (rows of all items are stacked, so an item's rows start after the earlier items')
        n = len(extra_rows)
        tok = list(dict.fromkeys(need[n:]))
        at_t = {r: off + i for i, r in enumerate(tok)}
        off += len(tok)
        extra_x.append(x[torch.tensor(need[:n], device=dev, dtype=torch.long)])
        tok_x.append(x[torch.tensor(tok, device=dev, dtype=torch.long)])
        which.extend(at_t[r] for r in need[n:])
        targets.extend(tgt)
        per_item.append((len(tgt), owners))
    extras = parts.norm(torch.cat(extra_x)).split([len(e) for e in extra_x])
    logp = torch.log_softmax(parts.lm_head(parts.norm(torch.cat(tok_x))).float(), dim=-1)
    lp = logp[torch.tensor(which, device=dev, dtype=torch.long), torch.tensor(targets, device=dev, dtype=torch.long)]
    lps = lp.split([k for k, _ in per_item])
    return [(a, owners, e) for a, (_, owners), e in zip(lps, per_item, extras, strict=True)]


def candidate_set_logprobs(parts: DecoderParts, x: torch.Tensor, batch: PackedBatch,
                           rows: Sequence[int] | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per candidate set: the summed token log-probabilities of its candidates; and ``[sets, hidden]``: the normed
    hidden state of each set's last context row (the value head's input; it predicts every candidate's first token).

    Only candidate tokens go through the LM head (one matmul for all sets). ``rows``: the packed rows ``x`` holds
    (from ``run_layers(..., keep=rows)``); ``None`` = all.
    """
    return candidate_set_logprobs_many(parts, [(x, batch, rows)])[0]


def candidate_set_logprobs_many(parts: DecoderParts, items: Sequence[tuple[torch.Tensor, PackedBatch,
                                                                           Sequence[int] | None]]
                                ) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """:func:`candidate_set_logprobs` of several packed sequences ``(x, batch, rows)`` with one LM head call for all
    (:func:`_candidate_token_lp_many`)."""
    outs = _candidate_token_lp_many(parts, [(x, b, [s.prefix - 1 for s in b.sets], r) for x, b, r in items])
    res = []
    for (x, batch, _), (lp, owners, ctx_h) in zip(items, outs, strict=True):
        n = sum(len(s.ids) for s in batch.sets)
        sums = torch.zeros(n, dtype=lp.dtype, device=x.device).index_add(0, torch.tensor(owners, device=x.device), lp)
        res.append((list(sums.split([len(s.ids) for s in batch.sets])), ctx_h))
    return res


def candidate_token_logprobs(parts: DecoderParts, x: torch.Tensor, batch: PackedBatch,
                             rows: Sequence[int] | None = None) -> list[torch.Tensor]:
    """The log-probability of every token of every candidate, one tensor per candidate (in ``batch.cand_ids``
    order) -- e.g. the completions of a GRPO group packed after their shared prompt. ``rows`` as in
    :func:`candidate_set_logprobs`."""
    lp, _, _ = _candidate_token_lp(parts, x, batch, (), rows)
    return list(lp.split([len(c) for c in batch.cand_ids]))
