"""Scoring candidate continuations with a shared prompt KV (the scoring agent's inner loop).

For a prompt ``P`` (length p) and candidates ``a_1..a_N`` (lengths s_i), the log-likelihood is
``log pi(a_i | P) = sum_j log softmax(logits(P, a_i[:j]))[a_i[j]]``. Computing the N sequences independently costs
``N (p + s)`` token forwards; sharing the prompt's KV costs ``p + N s`` (EchoRL's KV_frozen reused N times): the
prompt is prefilled once (its leading blocks may already sit in the prefix cache), every candidate gets a block
table that shares the prompt's full blocks (ref counts) plus a copy of the partial last block (copy-on-write),
and all candidates run in one batched forward. A candidate's last token is never run: its logits would predict
past the candidate and no other token attends to it, so ``a_i`` costs ``s_i - 1`` token forwards (a one-token
candidate is scored from the prompt's last logits alone). Candidates that begin alike share more: each distinct
prefix of the candidates' inputs is computed once ("go to shelf 1", "go to shelf 2" and "go to sidetable 1" run
"go to" once, "shelf" once), so the candidates cost one token forward per node of their inputs' prefix tree, in one
batched forward per level of that tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from echorl_agent.llm.engine.config import ScoreResult
from echorl_agent.llm.engine.prefix_cache import PrefixCache
from echorl_agent.llm.engine.runner import ModelRunner, SeqChunk

__all__ = ["score_candidates", "score_batch", "prompt_logprobs", "SoftTokens", "common_prefix_len"]


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
        scores, computed = _score_candidate_tokens(runner, cache, ctx, candidates, extras)
    finally:
        for a in allocs:
            cache.release(a.block_table)  # the soft tokens' blocks were appended to it
    return _assemble_results(cache, allocs, ctx.lens, candidates, scores, computed, extras)


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


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _CandidateTree:
    """How the candidates of one context share their input tokens (each candidate's tokens but its last).

    Candidates are taken in lexicographic order of their inputs, so each one's longest common prefix with any
    earlier input is the one with its predecessor. A candidate *computes* the input tokens after that common prefix
    (``shared[j]`` of them are not recomputed: their KV, hidden states and logits come from the candidates that
    computed them, ``owners[j][i]`` for position ``i`` of its input); ``parent[j]`` computed its last shared token.
    A candidate whose whole input is shared computes nothing (``level[j]`` is None). Candidates of one level
    depend only on lower levels, so each level is one batched forward.
    """

    shared: dict[int, int]
    parent: dict[int, int | None]
    owners: dict[int, list[int]]
    level: dict[int, int | None]
    ends: dict[int, list[int]]
    """Computing candidate -> the candidates whose last input token it computed (its blocks hold their inputs)."""

    @property
    def depth(self) -> int:
        """Forwards the candidates need (levels)."""
        return 1 + max((v for v in self.level.values() if v is not None), default=-1)

    @property
    def computed(self) -> int:
        """Input tokens the candidates compute."""
        return sum(len(o) - self.shared[j] for j, o in self.owners.items() if self.level[j] is not None)

    @classmethod
    def build(cls, cands: list[list[int]], deep: bool = True) -> _CandidateTree:
        """``deep=False``: share only whole inputs (a candidate whose input begins another's computes nothing),
        which needs no forward beyond level 0."""
        tree = cls({}, {}, {}, {}, {})
        prev = None
        for j in sorted((j for j, c in enumerate(cands) if len(c) > 1), key=lambda j: cands[j][:-1]):
            inp = cands[j][:-1]
            n = 0 if prev is None else common_prefix_len(inp, cands[prev][:-1])
            if not deep and n < len(inp):
                n = 0
            parent = tree.owners[prev][n - 1] if n else None
            tree.shared[j], tree.parent[j] = n, parent
            tree.owners[j] = (tree.owners[prev][:n] if n else []) + [j] * (len(inp) - n)
            tree.level[j] = None if n == len(inp) else (0 if parent is None else tree.level[parent] + 1)
            tree.ends.setdefault(tree.owners[j][-1], []).append(j)
            prev = j
        return tree


#: A tree level past the first costs one more forward through every layer (its fixed cost: ~30 layers of small
#: kernels); it is taken only when it saves at least this many input tokens over sharing whole inputs alone. A guess
#: at the break-even, not tuned: 16 ALFWorld states save ~25 tokens each, far above it (benchmarks/candidate_tree.py);
#: one state's "go to sidetable 1" next to "go to shelf 1" saves 2, below it.
MIN_TOKENS_PER_LEVEL = 32


def _candidate_trees(candidates: list[list[list[int]]]) -> list[_CandidateTree]:
    """Each prompt's :class:`_CandidateTree`: the full prefix trees, or only whole-input sharing when the deeper
    levels save fewer than :data:`MIN_TOKENS_PER_LEVEL` tokens per extra forward."""
    deep = [_CandidateTree.build(c) for c in candidates]
    extra = max(t.depth for t in deep) - 1
    if extra <= 0:
        return deep
    flat = [_CandidateTree.build(c, deep=False) for c in candidates]
    saved = sum(t.computed for t in flat) - sum(t.computed for t in deep)
    return deep if saved >= MIN_TOKENS_PER_LEVEL * extra else flat


def _score_candidate_tokens(
    runner: ModelRunner, cache: PrefixCache, ctx: _Contexts, candidates: list[list[list[int]]], extras: list[dict]
) -> tuple[list[list[float]], list[int]]:
    """Step 3: every candidate of every prompt but its last token, each distinct input prefix computed once.

    Candidates that begin alike ("go to shelf 1", "go to shelf 2", "go to sidetable 1") compute their common
    tokens once (:class:`_CandidateTree`): a candidate continues the blocks of the candidate that computed its last
    shared token (its full blocks shared by reference count, a copy of the partial one), or the context's when it
    shares nothing. One batched forward per tree level (as many candidates as fit the free blocks); a candidate's
    blocks are released once it and every candidate continuing it have run. A one-token candidate needs no forward
    (the context's last logits predict it).

    Returns:
        Per prompt, the log-likelihood of each candidate, and the number of candidate tokens computed.
    """
    trees = _candidate_trees(candidates)
    firsts = [torch.log_softmax(f, -1) for f in ctx.firsts]  # once per context, not per candidate
    heads = [[float(firsts[k][c[0]]) for c in cands] for k, cands in enumerate(candidates)]
    rest = [[torch.zeros(len(c) - 1) for c in cands] for cands in candidates]
    computed = [0] * len(candidates)
    # the (candidate, input position) pairs whose log-probability each computing candidate's rows give
    reads: dict[tuple[int, int], list[tuple[int, int]]] = {}
    waiting: dict[tuple[int, int], int] = {}  # computing candidates still to run that continue this one's blocks
    for k, tree in enumerate(trees):
        for j, owners in tree.owners.items():
            for i, o in enumerate(owners):
                reads.setdefault((k, o), []).append((j, i))
            if tree.level[j] is not None and tree.parent[j] is not None:
                waiting[(k, tree.parent[j])] = waiting.get((k, tree.parent[j]), 0) + 1
    todo = sorted(((tree.level[j], k, j) for k, tree in enumerate(trees) for j in tree.level
                   if tree.level[j] is not None))
    tables: dict[tuple[int, int], list[int]] = {}
    groups: dict[tuple, int] = {}
    lens = ctx.lens
    try:
        while todo:
            level = todo[0][0]
            batch = _share_parent_blocks(runner, cache, ctx, candidates, trees, tables,
                                         [(k, j) for lv, k, j in todo if lv == level])
            todo = todo[len(batch):]
            chunks = []
            for k, j in batch:
                n, inp = trees[k].shared[j], candidates[k][j][:-1]
                key = groups.setdefault((k, tuple(inp[:n])), len(groups))
                chunks.append(SeqChunk(inp[n:], lens[k] + n, tables[(k, j)], all_logits=True, prefix_group=key))
                computed[k] += len(inp) - n
                parent = trees[k].parent[j]
                if parent is not None:
                    waiting[(k, parent)] -= 1
            logits = runner.forward(chunks)
            for (k, j), lg in zip(batch, logits, strict=True):
                _read_rows(runner, candidates[k], trees[k], tables, k, j, lg, reads.get((k, j), []), rest[k],
                           extras[k], lens[k])
            for key in [key for key in tables if not waiting.get(key)]:
                cache.release(tables.pop(key))
    finally:
        for t in tables.values():
            cache.release(t)
    scores = [[h + (float(r.sum()) if len(r) else 0.0) for h, r in zip(hs, rs, strict=True)]
              for hs, rs in zip(heads, rest, strict=True)]
    return scores, computed


def _read_rows(runner: ModelRunner, cands: list[list[int]], tree: _CandidateTree, tables: dict, k: int, o: int,
               logits: torch.Tensor, reads: list[tuple[int, int]], rest: list[torch.Tensor], extras: dict,
               ctx_len: int) -> None:
    """After candidate ``o`` ran: the log-probabilities its rows give (to itself and the candidates sharing them),
    and with capture the hidden states of every candidate whose last input token ``o`` computed."""
    n = tree.shared[o]
    lp = torch.log_softmax(logits, -1)
    rows = torch.tensor([i - n for _, i in reads], dtype=torch.long)
    targets = torch.tensor([cands[j][i + 1] for j, i in reads], dtype=torch.long)
    for (j, i), v in zip(reads, lp[rows, targets], strict=True):
        rest[j][i] = v
    if "candidate_states" in extras:
        for j in tree.ends[o]:  # o's blocks hold j's whole input
            extras["candidate_states"][j] = runner.gather_hidden(tables[(k, o)], ctx_len, ctx_len + len(cands[j]) - 1)


def _share_parent_blocks(
    runner: ModelRunner,
    cache: PrefixCache,
    ctx: _Contexts,
    candidates: list[list[list[int]]],
    trees: list[_CandidateTree],
    tables: dict[tuple[int, int], list[int]],
    pairs: list[tuple[int, int]],
) -> list[tuple[int, int]]:
    """Block tables (into ``tables``) for the leading ``pairs`` (prompt k, candidate j) that fit the free blocks:
    the full blocks before the candidate's first computed token shared (ref counts) from the candidate that computed
    the token before it (or the context), plus new blocks for the rest of its input, the first holding a copy of
    the partial block.

    Raises:
        MemoryError: not even the first candidate fits.
    """
    bs = cache.block_size
    done = []
    free = cache.num_free_blocks
    for k, j in pairs:
        c, parent = candidates[k][j], trees[k].parent[j]
        start = ctx.lens[k] + trees[k].shared[j]
        src = ctx.tables[k] if parent is None else tables[(k, parent)]
        full, partial = start // bs, start % bs
        need = cache.num_blocks_needed(ctx.lens[k] + len(c) - 1) - full
        if need > free:
            break
        free -= need
        cache.share(src[:full])
        own = [cache.append_block() for _ in range(need)]
        if partial:
            runner.copy_block(src[full], own[0])
        tables[(k, j)] = src[:full] + own
        done.append((k, j))
    if not done:
        raise MemoryError("prefix cache full while scoring; raise PrefixCacheConfig.max_tokens")
    return done


def _assemble_results(
    cache: PrefixCache,
    allocs: list,
    lens: list[int],
    candidates: list[list[list[int]]],
    scores: list[list[float]],
    computed: list[int],
    extras: list[dict],
) -> list[ScoreResult]:
    """Step 4: one :class:`ScoreResult` per prompt, and the token counts into the prefix cache's stats.

    Candidates reuse the whole context's KV (KV_frozen) and compute only the input tokens (all but the last) that no
    other candidate computed for them: the rest count as cached.
    """
    out = []
    for k, cands in enumerate(candidates):
        reused = sum(len(c) - 1 for c in cands) - computed[k] + lens[k] * len(cands)
        p, cached = lens[k], allocs[k].num_cached_tokens
        cache.stats.num_cached_tokens += reused
        cache.stats.num_computed_tokens += computed[k]
        out.append(ScoreResult(scores[k], [len(c) for c in cands], cached + reused, p - cached + computed[k],
                               **extras[k]))
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
