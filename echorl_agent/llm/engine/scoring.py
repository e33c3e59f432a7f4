"""Scoring candidate continuations with a shared prompt KV (the scoring agent's inner loop).

For a prompt ``P`` (length p) and candidates ``a_1..a_N`` (lengths s_i), the log-likelihood is
``log pi(a_i | P) = sum_j log softmax(logits(P, a_i[:j]))[a_i[j]]``. Computing the N sequences independently costs
``N (p + s)`` token forwards; sharing the prompt's KV costs ``p + N s`` (EchoRL's KV_frozen reused N times): the
prompt is prefilled once (its leading blocks may already sit in the prefix cache), every candidate gets a block
table that shares the prompt's full blocks (ref counts) plus a copy of the partial last block (copy-on-write),
and all candidates run in one batched forward. A candidate's last token is never run: its logits would predict
past the candidate and no other token attends to it, so ``a_i`` costs ``s_i - 1`` token forwards (a one-token
candidate is scored from the prompt's last logits alone).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from echorl_agent.llm.engine.config import ScoreResult
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
    """``first``: log-probabilities predicting cand[0]; ``rest``: logits after each candidate token but the last."""
    total = float(first[cand[0]])
    if len(cand) > 1 and rest is not None:
        lp = torch.log_softmax(rest[: len(cand) - 1], -1)
        total += float(lp.gather(1, torch.tensor(cand[1:])[:, None]).sum())
    return total


def _check_request(prompt: Sequence[int], candidates: Sequence[Sequence[int]]) -> None:
    if not prompt:
        raise ValueError("the prompt is empty; scoring needs at least one prompt token")
    if not candidates or any(len(c) == 0 for c in candidates):
        raise ValueError("candidates must be a non-empty list of non-empty token lists")


def score_candidates(
    runner: ModelRunner,
    cache: PrefixCache,
    prompt: list[int],
    candidates: list[list[int]],
    share_prefix: bool = True,
    soft: SoftTokens | None = None,
    capture: bool = False,
) -> ScoreResult:
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
    if (soft is not None or capture) and not share_prefix:
        raise ValueError("soft tokens and capture need share_prefix=True")
    _check_request(prompt, candidates)
    if not share_prefix:
        return _score_unshared(runner, cache, prompt, candidates)
    (res,) = score_batch(runner, cache, [prompt], [candidates], [soft], capture)
    return res


def _score_unshared(
    runner: ModelRunner, cache: PrefixCache, prompt: list[int], candidates: list[list[int]]
) -> ScoreResult:
    """The naive baseline: every candidate recomputes the whole prompt, ``N (p + s)`` token forwards."""
    p, out, computed = len(prompt), [], 0
    for c in candidates:
        tokens = prompt + c
        alloc = cache.allocate(tokens, record_stats=False, use_cache=False)
        try:
            (lg,) = runner.forward([SeqChunk(tokens, 0, alloc.block_table, all_logits=True)])
        finally:
            cache.release(alloc.block_table)
        computed += len(tokens)
        out.append(_candidate_logprob(torch.log_softmax(lg[p - 1], -1), lg[p:], c))
    return ScoreResult(out, [len(c) for c in candidates], 0, computed)


def score_batch(
    runner: ModelRunner,
    cache: PrefixCache,
    prompts: Sequence[list[int]],
    candidates: Sequence[list[list[int]]],
    soft: Sequence[SoftTokens | None] | None = None,
    capture: bool = False,
) -> list[ScoreResult]:
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
        _check_request(p, cands)
    owner = _first_copies(prompts, candidates, softs)
    results: dict[int, ScoreResult] = {}
    for take in _pool_sized_groups(cache, prompts, candidates, [i for i in range(n) if owner[i] == i]):
        group = _score_group(runner, cache, [prompts[i] for i in take], [candidates[i] for i in take],
                             [softs[i] for i in take], capture)
        results.update(zip(take, group, strict=True))
    return [results[owner[i]] for i in range(n)]


def _first_copies(prompts: Sequence[list[int]], candidates: Sequence[list[list[int]]], softs: list) -> list[int]:
    """Per request, the index of its first exact duplicate (itself when it is the first or has soft tokens)."""
    owner: list[int] = []
    first_of: dict[tuple, int] = {}
    for i, (p, cands, s) in enumerate(zip(prompts, candidates, softs, strict=True)):
        if s is None:
            owner.append(first_of.setdefault((tuple(p), tuple(tuple(c) for c in cands)), i))
        else:
            owner.append(i)
    return owner


def _pool_sized_groups(
    cache: PrefixCache, prompts: Sequence[list[int]], candidates: Sequence[list[list[int]]], todo: list[int]
) -> Iterator[list[int]]:
    """Consecutive runs of ``todo`` whose prompts (and a block per candidate) fit the free blocks together.

    The free blocks are counted when each run is taken, after the previous run has released its blocks.
    """
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
        yield take


@dataclass
class _Contexts:
    """Per prompt of a group, the context the candidates continue: the prompt, then its soft tokens if any."""

    tables: list[list[int]]
    """Block table of each context (the prompt's allocation, extended by the soft tokens' blocks)."""
    lens: list[int]
    """Context lengths in tokens (prompt + soft tokens)."""
    firsts: list[torch.Tensor]
    """Logits after each context's last token (they predict every candidate's first token)."""
    lasts: list[torch.Tensor]
    """Final hidden state of each context's last token."""


def _score_group(
    runner: ModelRunner,
    cache: PrefixCache,
    prompts: list[list[int]],
    candidates: list[list[list[int]]],
    softs: list,
    capture: bool,
) -> list[ScoreResult]:
    """:func:`score_batch` for prompts that fit the pool together: prefill, soft tokens, candidates, results."""
    allocs = []
    try:
        for p in prompts:
            allocs.append(cache.allocate(p))
        ctx = _prefill_prompts(runner, cache, prompts, allocs)
        _append_soft_tokens(runner, cache, ctx, softs)
        extras = _captured_context(runner, ctx, candidates) if capture else [{} for _ in prompts]
        scores = _score_candidate_tokens(runner, cache, ctx, candidates, extras)
    finally:
        for a in allocs:
            cache.release(a.block_table)  # the soft tokens' blocks were appended to it
    return _assemble_results(cache, allocs, ctx.lens, candidates, scores, extras)


def _prefill_prompts(runner: ModelRunner, cache: PrefixCache, prompts: list[list[int]], allocs: list) -> _Contexts:
    """Step 1: every prompt's uncached tokens in one forward; its full blocks are published to the prefix cache."""
    chunks = [SeqChunk(p[a.num_cached_tokens :], a.num_cached_tokens, a.block_table)
              for p, a in zip(prompts, allocs, strict=True)]
    firsts, lasts = runner.forward(chunks, return_hidden=True)
    for p, a in zip(prompts, allocs, strict=True):
        _register_full(cache, a.block_table, p, list(a.block_hashes))
    return _Contexts([a.block_table for a in allocs], [len(p) for p in prompts], firsts, lasts)


def _append_soft_tokens(runner: ModelRunner, cache: PrefixCache, ctx: _Contexts, softs: list) -> None:
    """Step 2: soft tokens (EchoRL's plan, computed from the prompt's own activations), one forward for all.

    A callable entry of ``softs`` is resolved here from the prompt's captured activations and last hidden state.
    The soft tokens extend the prompt's own blocks, which are never registered, so their KV stays private to this
    call. ``ctx`` moves past the soft tokens (tables, lengths, logits and hidden states).
    """
    resolved = []
    for k, s in enumerate(softs):
        if callable(s):
            states = runner.gather_hidden(ctx.tables[k], 0, ctx.lens[k]) if runner.h_pool is not None else None
            s = s(states, ctx.lasts[k])
        resolved.append(s)
    soft_rows = [k for k, s in enumerate(resolved) if s is not None]
    if not soft_rows:
        return
    bs = cache.block_size
    soft_chunks = []
    for k in soft_rows:
        m = resolved[k].embeds.shape[0]
        while len(ctx.tables[k]) * bs < ctx.lens[k] + m:
            ctx.tables[k].append(cache.append_block())
        soft_chunks.append(SeqChunk([resolved[k].token_id] * m, ctx.lens[k], ctx.tables[k],
                                    embeds=resolved[k].embeds, embeds_layer=resolved[k].layer))
    f2, l2 = runner.forward(soft_chunks, return_hidden=True)
    for j, k in enumerate(soft_rows):
        ctx.firsts[k], ctx.lasts[k] = f2[j], l2[j]
        ctx.lens[k] += resolved[k].embeds.shape[0]


def _captured_context(runner: ModelRunner, ctx: _Contexts, candidates: list[list[list[int]]]) -> list[dict]:
    """With ``capture=True``: per prompt, the last context token's hidden state and (runner capture on) the
    context's activations, with a slot per candidate that :func:`_score_candidate_tokens` fills."""
    extras = []
    for k, last in enumerate(ctx.lasts):
        ex = {"hidden": last.clone()}
        if runner.h_pool is not None:
            ex["context_states"] = runner.gather_hidden(ctx.tables[k], 0, ctx.lens[k])
            # filled by _score_candidate_tokens; a one-token candidate has no input rows
            ex["candidate_states"] = [ex["context_states"][:0]] * len(candidates[k])
        extras.append(ex)
    return extras


def _score_candidate_tokens(
    runner: ModelRunner, cache: PrefixCache, ctx: _Contexts, candidates: list[list[list[int]]], extras: list[dict]
) -> list[list[float]]:
    """Step 3: every candidate of every prompt but its last token, sharing its context's full blocks (+ a copy of
    the partial one).

    Candidates run in batched forwards of as many as fit the free blocks; each one's blocks are released as soon
    as its batch is done. A one-token candidate needs no forward (the context's last logits predict it).

    Returns:
        Per prompt, the log-likelihood of each candidate.
    """
    pairs = [(k, j) for k in range(len(candidates)) for j in range(len(candidates[k])) if len(candidates[k][j]) > 1]
    firsts = [torch.log_softmax(f, -1) for f in ctx.firsts]  # once per context, not per candidate
    scores = [[_candidate_logprob(firsts[k], None, c) for c in cands] for k, cands in enumerate(candidates)]
    lens = ctx.lens
    i = 0
    while i < len(pairs):
        group = _share_context_blocks(runner, cache, ctx, candidates, pairs[i:])
        i += len(group)
        try:
            logits = runner.forward([SeqChunk(candidates[k][j][:-1], lens[k], t, all_logits=True, prefix_group=k)
                                     for k, j, t in group])
            for k, j, t in group:
                if "candidate_states" in extras[k]:
                    end = lens[k] + len(candidates[k][j]) - 1
                    extras[k]["candidate_states"][j] = runner.gather_hidden(t, lens[k], end)
        finally:
            for _, _, t in group:
                cache.release(t)
        for (k, j, _), lg in zip(group, logits, strict=True):
            scores[k][j] = _candidate_logprob(firsts[k], lg, candidates[k][j])
    return scores


def _share_context_blocks(
    runner: ModelRunner,
    cache: PrefixCache,
    ctx: _Contexts,
    candidates: list[list[list[int]]],
    pairs: list[tuple[int, int]],
) -> list[tuple[int, int, list[int]]]:
    """Block tables for the leading ``pairs`` (prompt k, candidate j) that fit the free blocks: the context's full
    blocks shared (ref counts) plus new blocks for the candidate's tokens but its last, the first holding a copy of
    the context's partial block.

    Raises:
        MemoryError: not even the first candidate fits.
    """
    bs = cache.block_size
    group = []
    free = cache.num_free_blocks
    for k, j in pairs:
        c, p, table = candidates[k][j], ctx.lens[k], ctx.tables[k]
        full, partial = p // bs, p % bs
        need = cache.num_blocks_needed(p + len(c) - 1) - full
        if need > free:
            break
        free -= need
        cache.share(table[:full])
        own = [cache.append_block() for _ in range(need)]
        if partial:
            runner.copy_block(table[full], own[0])
        group.append((k, j, table[:full] + own))
    if not group:
        raise MemoryError("prefix cache full while scoring; raise PrefixCacheConfig.max_tokens")
    return group


def _assemble_results(
    cache: PrefixCache,
    allocs: list,
    lens: list[int],
    candidates: list[list[list[int]]],
    scores: list[list[float]],
    extras: list[dict],
) -> list[ScoreResult]:
    """Step 4: one :class:`ScoreResult` per prompt, and the token counts into the prefix cache's stats.

    Candidates reuse the whole context's KV (KV_frozen) and compute only their own tokens but the last.
    """
    out = []
    for k, cands in enumerate(candidates):
        n_cand = sum(len(c) - 1 for c in cands)
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
