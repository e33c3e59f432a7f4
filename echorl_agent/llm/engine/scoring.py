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

from echorl_agent.llm.engine.prefix_cache import PrefixCache
from echorl_agent.llm.engine.runner import ModelRunner, SeqChunk

__all__ = ["score_candidates", "score_batch", "prompt_logprobs", "SoftTokens"]


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
    from echorl_agent.llm.engine.config import ScoreResult

    if (soft is not None or capture) and not share_prefix:
        raise ValueError("soft tokens and capture need share_prefix=True")
    if not prompt:
        raise ValueError("the prompt is empty; scoring needs at least one prompt token")
    if not candidates or any(len(c) == 0 for c in candidates):
        raise ValueError("candidates must be a non-empty list of non-empty token lists")
    if not share_prefix:
        p, out, computed = len(prompt), [], 0
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

    (res,) = score_batch(runner, cache, [prompt], [candidates], [soft], capture)
    return res


def score_batch(
    runner: ModelRunner,
    cache: PrefixCache,
    prompts: Sequence[list[int]],
    candidates: Sequence[list[list[int]]],
    soft: Sequence[SoftTokens | None] | None = None,
    capture: bool = False,
):
    """Score the candidates of several prompts in two batched forwards (many envs of one rollout step).

    All prompts' uncached tokens run in one forward (each prompt's leading blocks may come from the prefix cache),
    then every candidate of every prompt runs in one more forward (as many as fit the free blocks). Exact duplicate
    requests without soft tokens -- the K episodes of a group that start from one state -- are computed once and
    share one result.

    Args:
        prompts: token ids of each prompt.
        candidates: per prompt, its candidate token lists.
        soft: per prompt, soft tokens or a callable as in :func:`score_candidates` (None: none).
        capture: as in :func:`score_candidates`.

    Returns:
        One :class:`echorl_agent.llm.engine.config.ScoreResult` per prompt (duplicates get the same object).
    """
    n = len(prompts)
    if len(candidates) != n:
        raise ValueError(f"candidates must have one list per prompt: {len(candidates)} lists for {n} prompts")
    softs = list(soft) if soft is not None else [None] * n
    if len(softs) != n:
        raise ValueError(f"soft must have one entry per prompt: {len(softs)} for {n} prompts")
    for p, cands in zip(prompts, candidates, strict=True):
        if not p:
            raise ValueError("the prompt is empty; scoring needs at least one prompt token")
        if not cands or any(len(c) == 0 for c in cands):
            raise ValueError("candidates must be a non-empty list of non-empty token lists")
    owner: list[int] = []
    first_of: dict[tuple, int] = {}
    for i in range(n):
        if softs[i] is None:
            key = (tuple(prompts[i]), tuple(tuple(c) for c in candidates[i]))
            owner.append(first_of.setdefault(key, i))
        else:
            owner.append(i)
    todo = [i for i in range(n) if owner[i] == i]
    results: dict[int, object] = {}
    # sub-batches whose prompts (and a block per candidate) fit the pool together
    while todo:
        budget = max(1, cache.num_free_blocks)
        take, need = [], 0
        for i in todo:
            blocks = cache.num_blocks_needed(len(prompts[i])) + len(candidates[i]) + 1
            if take and need + blocks > budget:
                break
            take.append(i)
            need += blocks
        todo = todo[len(take):]
        for i, r in zip(take, _score_group(runner, cache, [prompts[i] for i in take],
                                            [candidates[i] for i in take], [softs[i] for i in take], capture),
                        strict=True):
            results[i] = r
    return [results[owner[i]] for i in range(n)]


def _score_group(runner, cache, prompts, candidates, softs, capture):
    """:func:`score_batch` for prompts that fit the pool together."""
    from echorl_agent.llm.engine.config import ScoreResult

    bs = cache.block_size
    allocs, tables, hashes = [], [], []
    try:
        for p in prompts:
            a = cache.allocate(p)
            allocs.append(a)
            tables.append(a.block_table)
            hashes.append(list(a.block_hashes))
        # 1. every prompt's uncached tokens in one forward
        chunks = [SeqChunk(p[a.num_cached_tokens :], a.num_cached_tokens, a.block_table)
                  for p, a in zip(prompts, allocs, strict=True)]
        firsts, lasts = runner.forward(chunks, return_hidden=True)
        for p, t, h in zip(prompts, tables, hashes, strict=True):
            _register_full(cache, t, p, h)
        # 2. soft tokens (EchoRL's plan, computed from the prompt's own activations), one forward for all
        lens = [len(p) for p in prompts]
        resolved = []
        for k, s in enumerate(softs):
            if callable(s):
                states = runner.gather_hidden(tables[k], 0, lens[k]) if runner.h_pool is not None else None
                s = s(states, lasts[k])
            resolved.append(s)
        soft_rows = [k for k, s in enumerate(resolved) if s is not None]
        if soft_rows:
            soft_chunks = []
            for k in soft_rows:
                m = resolved[k].embeds.shape[0]
                while len(tables[k]) * bs < lens[k] + m:  # soft tokens extend the prompt's own, never-registered blocks
                    tables[k].append(cache.append_block())
                soft_chunks.append(SeqChunk([resolved[k].token_id] * m, lens[k], tables[k],
                                            embeds=resolved[k].embeds, embeds_layer=resolved[k].layer))
            f2, l2 = runner.forward(soft_chunks, return_hidden=True)
            for j, k in enumerate(soft_rows):
                firsts[k], lasts[k] = f2[j], l2[j]
                lens[k] += resolved[k].embeds.shape[0]
        extras = [{} for _ in prompts]
        if capture:
            for k, ex in enumerate(extras):
                ex["hidden"] = lasts[k].clone()
                if runner.h_pool is not None:
                    ex["context_states"] = runner.gather_hidden(tables[k], 0, lens[k])
                    ex["candidate_states"] = [None] * len(candidates[k])
        # 3. every candidate of every prompt, sharing its prompt's full blocks (+ a copy of the partial one)
        pairs = [(k, j) for k in range(len(prompts)) for j in range(len(candidates[k]))]
        scores = [[0.0] * len(c) for c in candidates]
        i = 0
        while i < len(pairs):
            group = []
            free = cache.num_free_blocks
            while i < len(pairs):
                k, j = pairs[i]
                c, p = candidates[k][j], lens[k]
                full, partial = p // bs, p % bs
                need = cache.num_blocks_needed(p + len(c)) - full
                if need > free:
                    break
                free -= need
                cache.share(tables[k][:full])
                own = [cache.append_block() for _ in range(need)]
                if partial:
                    runner.copy_block(tables[k][full], own[0])
                group.append((k, j, tables[k][:full] + own))
                i += 1
            if not group:
                raise MemoryError("prefix cache full while scoring; raise PrefixCacheConfig.max_tokens")
            try:
                logits = runner.forward([SeqChunk(candidates[k][j], lens[k], t, all_logits=True) for k, j, t in group])
                for k, j, t in group:
                    if "candidate_states" in extras[k]:
                        extras[k]["candidate_states"][j] = runner.gather_hidden(t, lens[k], lens[k] + len(candidates[k][j]))
            finally:
                for _, _, t in group:
                    cache.release(t)
            for (k, j, _), lg in zip(group, logits, strict=True):
                scores[k][j] = _candidate_logprob(firsts[k], lg, candidates[k][j])
    finally:
        for t in tables:
            cache.release(t)
    out = []
    for k, cands in enumerate(candidates):
        # candidates reuse the whole prompt's KV (KV_frozen) and compute only their own tokens
        n_cand = sum(len(c) for c in cands)
        p, cached = lens[k], allocs[k].num_cached_tokens
        cache.stats.num_cached_tokens += p * len(cands)
        cache.stats.num_computed_tokens += n_cand
        out.append(ScoreResult(scores[k], [len(c) for c in cands], cached + p * len(cands),
                               p - cached + n_cand, **extras[k]))
    return out


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
