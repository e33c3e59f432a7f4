"""Scoring candidate continuations with a shared prompt KV (the scoring agent's inner loop).

For a prompt ``P`` (length p) and candidates ``a_1..a_N`` (lengths s_i), the log-likelihood is
``log pi(a_i | P) = sum_j log softmax(logits(P, a_i[:j]))[a_i[j]]``. Computing the N sequences independently costs
``N (p + s)`` token forwards; sharing the prompt's KV costs ``p + N s`` (EchoRL's KV_frozen reused N times): the
prompt is prefilled once (its leading blocks may already sit in the prefix cache), every candidate gets a block
table that shares the prompt's full blocks (ref counts) plus a copy of the partial last block (copy-on-write),
and all candidates run in one batched forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from echorl_agent.llm.prefix_cache import PrefixCache
from echorl_agent.llm.runner import ModelRunner, SeqChunk

__all__ = ["score_candidates", "prompt_logprobs", "SoftTokens"]


@dataclass
class SoftTokens:
    """Soft tokens placed after a prompt: ``m`` placeholder tokens ``token_id`` whose residual stream entering
    ``layer`` gets ``embeds`` added (layers below see only the placeholders, so their activations do not depend on
    the plan)."""

    embeds: torch.Tensor
    """``[m, hidden]``."""
    layer: int = 0
    token_id: int = 0


def _register_full(cache: PrefixCache, table: list[int], tokens: Sequence[int], hashes: list[int]) -> None:
    bs = cache.block_size
    for i in range(len(hashes), len(tokens) // bs):
        prev = hashes[-1] if hashes else None
        hashes.append(cache.register(table[i], prev, tokens[i * bs : (i + 1) * bs]))


def _candidate_logprob(first: torch.Tensor, rest: torch.Tensor | None, cand: Sequence[int]) -> float:
    """``first``: logits predicting cand[0]; ``rest``: logits after each candidate token (last row unused)."""
    total = float(torch.log_softmax(first, -1)[cand[0]])
    if len(cand) > 1 and rest is not None:
        lp = torch.log_softmax(rest[: len(cand) - 1], -1)
        total += float(lp.gather(1, torch.tensor(cand[1:])[:, None]).sum())
    return total


def score_candidates(
    runner: ModelRunner,
    cache: PrefixCache,
    prompt: list[int],
    candidates: list[list[int]],
    share_prefix: bool = True,
    soft: SoftTokens | None = None,
    capture: bool = False,
):
    """Log-likelihoods of ``candidates`` after ``prompt`` (see the module docstring).

    Args:
        soft: soft tokens appended after the prompt and before every candidate (EchoRL's plan); their KV is
            computed for this call only and never published to the prefix cache. A callable
            ``(prompt_activations | None, last_hidden) -> SoftTokens | None`` is called after the prompt's prefill.
        capture: also return the final hidden state of the last context token and the runner's captured
            activations (:meth:`ModelRunner.enable_capture`) of the prompt, soft and candidate tokens.

    Returns:
        :class:`echorl_agent.llm.engine.ScoreResult`.
    """
    from echorl_agent.llm.config import ScoreResult

    if (soft is not None or capture) and not share_prefix:
        raise ValueError("soft tokens and capture need share_prefix=True")
    if not prompt:
        raise ValueError("the prompt is empty; scoring needs at least one prompt token")
    if not candidates or any(len(c) == 0 for c in candidates):
        raise ValueError("candidates must be a non-empty list of non-empty token lists")
    bs = cache.block_size
    p = len(prompt)
    out: list[float] = []
    if not share_prefix:
        computed = 0
        for c in candidates:
            tokens = prompt + c
            alloc = cache.allocate(tokens, record_stats=False, use_cache=False)
            try:
                (lg,) = runner.forward([SeqChunk(tokens, 0, alloc.block_table, all_logits=True)])
            finally:
                cache.release(alloc.block_table)
            computed += len(tokens)
            out.append(_candidate_logprob(lg[p - 1], lg[p:], c))
        return ScoreResult(out, [len(c) for c in candidates], 0, computed)

    alloc = cache.allocate(prompt)
    table, hashes = alloc.block_table, list(alloc.block_hashes)
    extra: dict = {}
    try:
        (first,), (last_h,) = runner.forward(
            [SeqChunk(prompt[alloc.num_cached_tokens :], alloc.num_cached_tokens, table)], return_hidden=True
        )
        _register_full(cache, table, prompt, hashes)
        if callable(soft):  # a plan computed from the prompt's own activations (EchoRL: tau_t = F(s_{t-k:t}))
            states = runner.gather_hidden(table, 0, p) if runner.h_pool is not None else None
            soft = soft(states, last_h)
        if soft is not None:
            # the soft tokens extend the prompt's own blocks; blocks holding them are never registered
            m = soft.embeds.shape[0]
            while len(table) * bs < p + m:
                table.append(cache.append_block())
            (first,), (last_h,) = runner.forward(
                [SeqChunk([soft.token_id] * m, p, table, embeds=soft.embeds, embeds_layer=soft.layer)],
                return_hidden=True,
            )
            p += m
        if capture:
            extra["hidden"] = last_h.clone()
            if runner.h_pool is not None:
                extra["context_states"] = runner.gather_hidden(table, 0, p)
                extra["candidate_states"] = [None] * len(candidates)
        full, partial = p // bs, p % bs
        # candidates in groups that fit the free blocks
        i = 0
        while i < len(candidates):
            group: list[tuple[list[int], list[int]]] = []
            free = cache.num_free_blocks
            while i < len(candidates):
                need = cache.num_blocks_needed(p + len(candidates[i])) - full
                if need > free:
                    break
                free -= need
                cache.share(table[:full])
                own = [cache.append_block() for _ in range(need)]
                if partial:
                    runner.copy_block(table[full], own[0])
                group.append((candidates[i], table[:full] + own))
                i += 1
            if not group:
                raise MemoryError("prefix cache full while scoring; raise PrefixCacheConfig.max_tokens")
            try:
                logits = runner.forward([SeqChunk(c, p, t, all_logits=True) for c, t in group])
                if "candidate_states" in extra:
                    for j, (c, t) in enumerate(group):
                        extra["candidate_states"][len(out) + j] = runner.gather_hidden(t, p, p + len(c))
            finally:
                for _, t in group:
                    cache.release(t)
            for (c, _), lg in zip(group, logits, strict=True):
                out.append(_candidate_logprob(first, lg, c))
    finally:
        cache.release(table)
    # candidates reuse the whole prompt's KV (KV_frozen) and compute only their own tokens
    n_cand = sum(len(c) for c in candidates)
    cache.stats.num_cached_tokens += p * len(candidates)
    cache.stats.num_computed_tokens += n_cand
    return ScoreResult(
        out, [len(c) for c in candidates], alloc.num_cached_tokens + p * len(candidates),
        p - alloc.num_cached_tokens + n_cand, **extra,
    )


def prompt_logprobs(
    runner: ModelRunner, cache: PrefixCache, tokens: list[int], top_k: int = 0
) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """``log p(tokens[i] | tokens[:i])`` for every prompt token (None for the first), plus the top-k alternatives.

    What lm-eval-harness reads from ``echo=True, logprobs=k, max_tokens=0`` on ``/v1/completions``. One full
    forward with logits at every position (cached blocks hold KV, not logits, so the prefix cache is bypassed).
    """
    alloc = cache.allocate(tokens, record_stats=False, use_cache=False)
    try:
        (lg,) = runner.forward([SeqChunk(tokens, 0, alloc.block_table, all_logits=True)])
    finally:
        cache.release(alloc.block_table)
    lsm = torch.log_softmax(lg[:-1].float(), dim=-1)  # row i predicts tokens[i + 1]
    chosen = lsm.gather(1, torch.tensor(tokens[1:], dtype=torch.long)[:, None])[:, 0].tolist()
    lps: list[float | None] = [None, *chosen]
    tops: list[list[tuple[int, float]] | None] = [None]
    if top_k:
        v, i = torch.topk(lsm, min(top_k, lsm.shape[-1]), dim=-1)
        tops += [list(zip(a, b, strict=True)) for a, b in zip(i.tolist(), v.tolist(), strict=True)]
    else:
        tops += [None] * (len(tokens) - 1)
    return lps, tops
