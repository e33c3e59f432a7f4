"""Per-request parts of :class:`~echorl_agent.llm.engine.LLMEngine`: sequences, groups, validation, abort, isolation.

Kept apart from the step loop in ``llm_engine.py``: how a request enters (validated in ``submit``, so a bad prompt is a
``ValueError`` for its caller alone), how it leaves early (``abort`` or a cancelled future: dropped at the next step,
KV freed), how a failing sequence is failed alone (a batched forward that raises is retried sequence by sequence),
and how ``n`` samples of one prompt share its prefill (``submit_group`` + fork, as vLLM's parallel sampling).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from echorl_agent.llm.engine.config import GenerationResult, SamplingParams
from echorl_agent.llm.engine.runner import SeqChunk

__all__ = ["TokenCallback", "draw"]

log = logging.getLogger("echorl_agent.llm.engine")

@dataclass
class _Seq:
    id: int
    tokens: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    priority: float
    arrival: int
    future: Future
    enqueued_step: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached_tokens: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    generator: torch.Generator | None = None
    text: str | None = None
    """The generation cut before a stop string (None: no stop string hit)."""
    finish_reason: str | None = None
    index: int = 0
    """Position in its group (:meth:`LLMEngine.submit_group`)."""
    followers: list[_Seq] = field(default_factory=list)
    """Group members that fork this sequence's KV once its prompt is prefilled."""
    on_token: Callable[[int, int, float | None, list[tuple[int, float]] | None], None] | None = None
    aborted: bool = False
    states: torch.Tensor | None = None
    """Captured activations of the computed tokens (``SamplingParams.capture_states``)."""

def draw(probs: torch.Tensor, generator: torch.Generator | None, sampler: str = "multinomial") -> int:
    """One token id drawn from the distribution ``probs [V]`` (``SamplingParams.sampler``).

    "multinomial" is ``torch.multinomial(probs, 1)``, which draws one exponential number per entry. "inverse_cdf"
    draws a single uniform ``u`` in ``[0, total)`` and returns the first index whose float64 cumulative sum exceeds
    it: P(token i) = probs[i] / total up to float64 rounding of the sum (~1e-16 per entry), and a zero-probability
    entry (outside the nucleus) is never returned, since its cumulative sum equals its predecessor's.
    """
    if sampler == "multinomial":
        return int(torch.multinomial(probs, 1, generator=generator))
    cdf = probs.double().cumsum_(0)  # [V]
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cdf[-1]
    i = int(torch.searchsorted(cdf, u, right=True))
    if i == probs.numel():  # u rounded up to the total (odds ~1e-16): the last entry with a positive probability
        i = int(torch.searchsorted(cdf, cdf[-1:]))
    return i


#: ``on_token(index, token_id, logprob, top_logprobs)``: called from the engine loop after every sampled token.
TokenCallback = Callable[[int, int, "float | None", "list[tuple[int, float]] | None"], None]


class _RequestsMixin:
    """Request entry, exit and isolation; mixed into :class:`~echorl_agent.llm.engine.LLMEngine`."""

    def submit_group(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, n: int = 1,
        priority: float = 1.0, on_token: TokenCallback | None = None,
    ) -> list[Future]:
        """Queue ``n`` samples of one prompt, which is prefilled once (the others fork its KV).

        With ``params.seed`` set, sample ``i`` uses seed ``seed + i``. Returns one future per sample.
        """
        params = params or SamplingParams()
        tokens = self.validate_prompt(prompt, priority)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got n={n!r}")
        group: list[_Seq] = []
        for i in range(n):
            fut: Future = Future()
            seq = _Seq(next(self._ids), list(tokens), len(tokens), params, float(priority), 0, fut, index=i,
                       on_token=on_token)
            seq.arrival = seq.id
            fut.request_id = seq.id  # type: ignore[attr-defined]
            if params.temperature > 0:
                seed = params.seed + i if params.seed is not None else seq.id
                seq.generator = torch.Generator().manual_seed(seed)
            fut.add_done_callback(lambda f, rid=seq.id: f.cancelled() and self.abort(rid))
            group.append(seq)
        group[0].followers = group[1:]
        with self._work:
            group[0].enqueued_step = self.num_steps
            self._live.update((s.id, s) for s in group)
            self._waiting.append(group[0])
            self._work.notify_all()
        return [s.future for s in group]

    def validate_prompt(self, prompt: str | Sequence[int], priority: float = 1.0) -> list[int]:
        """The prompt's token ids, or ValueError saying what is wrong (see :meth:`submit`)."""
        if isinstance(prompt, str):
            tokens = self.llm.encode(prompt)
        else:
            try:
                tokens = [operator.index(t) for t in prompt]
            except TypeError as e:
                raise ValueError(f"prompt token ids must be ints, got {list(prompt)[:8]!r}: {e}") from None
        if not tokens:
            raise ValueError("the prompt is empty; pass at least one token")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size}) (the model's vocabulary), "
                             f"got {bad[:5]}")
        if len(tokens) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(tokens)} tokens, the model's limit is {self.max_model_len}")
        if self.cache.num_blocks_needed(len(tokens) + 1) > self.cache.num_blocks:
            raise ValueError(
                f"the prompt of {len(tokens)} tokens does not fit the KV pool of "
                f"{self.cache.num_blocks * self.cache.block_size} tokens; raise PrefixCacheConfig.max_tokens"
            )
        if not priority >= 0:
            raise ValueError(f"priority must be >= 0, got priority={priority}")
        return tokens

    def abort_all(self) -> int:
        """Abort every unfinished request (shutdown, a replaced adapter); returns how many."""
        with self._work:
            ids = list(self._live)
        return sum(self.abort(i) for i in ids)

    def abort(self, request_id: int) -> bool:
        """Stop request ``request_id`` at the next step and free its KV; its future is cancelled.

        Thread-safe; returns False when the request is unknown or already finished.
        """
        with self._work:
            if request_id not in self._live:
                return False
            self._aborted.add(request_id)
            self._work.notify_all()
        return True

    # ------------------------------------------------------------------ isolation, abort
    @staticmethod
    def _resolve(s: _Seq, result: GenerationResult | None = None, exc: BaseException | None = None) -> None:
        try:
            if exc is not None:
                s.future.set_exception(exc)
            else:
                s.future.set_result(result)
        except InvalidStateError:  # cancelled by its owner meanwhile
            pass

    def _drop(self, s: _Seq) -> None:
        """Take ``s`` out of the queues and free its KV (the caller resolves its future)."""
        if s in self._running:
            self._running.remove(s)
        with self._work:
            if s in self._waiting:
                self._waiting.remove(s)
            self._live.pop(s.id, None)
            self._aborted.discard(s.id)
        if s.block_table:
            self.cache.release(s.block_table)
            s.block_table = []

    def _fail(self, s: _Seq, exc: BaseException) -> None:
        """Fail ``s`` alone (and its not yet forked group members, which share its prompt)."""
        log.warning("request %d failed: %r", s.id, exc)
        self._drop(s)
        self._resolve(s, exc=exc)
        for f in s.followers:
            self._drop(f)
            self._resolve(f, exc=exc)
        s.followers = []

    def _purge_aborted(self) -> None:
        with self._work:
            ids = set(self._aborted)
        for rid in ids:
            s = self._live.get(rid)
            if s is None:
                with self._work:
                    self._aborted.discard(rid)
                continue
            s.aborted = True
            if s in self._running or s in self._waiting:
                followers, s.followers = [f for f in s.followers if not f.aborted], []
                if followers:  # the group's other samples go on without the leader
                    followers[0].followers = followers[1:]
                    with self._work:
                        followers[0].enqueued_step = self.num_steps
                        self._waiting.insert(0, followers[0])
            self._drop(s)
            s.future.cancel()

    def _forward(self, chunks: list[SeqChunk], advanced: list[tuple[_Seq, int]]) -> list[torch.Tensor | None]:
        """The batched forward; if it raises, each sequence alone, failing only those that still raise."""
        try:
            return self.runner.forward(chunks)
        except Exception:
            log.exception("batched forward failed; retrying %d sequences one by one", len(chunks))
        out: list[torch.Tensor | None] = []
        for c, (s, _) in zip(chunks, advanced, strict=True):
            try:
                out.append(self.runner.forward([c])[0])
            except Exception as e:
                self._fail(s, e)
                out.append(None)
        return out

    def _fork(self, s: _Seq, lg: torch.Tensor) -> list[_Seq]:
        """Give ``s``'s group members its prompt KV (full blocks shared, partial block copied) and sample them."""
        bs, p = self.cache.block_size, s.num_prompt_tokens
        full, partial = p // bs, p % bs
        finished = []
        followers, s.followers = s.followers, []
        for f in followers:
            if f.aborted or f.id in self._aborted:
                continue  # purged at the next step
            room = len(self._running) < self.config.max_num_seqs
            if not room or self.cache.num_free_blocks < int(partial > 0) + len(self._running):
                with self._work:  # no room now: it waits and reuses the prompt's cached full blocks
                    f.enqueued_step = self.num_steps
                    self._waiting.insert(0, f)
                continue
            self.cache.share(s.block_table[:full])
            own = [self.cache.append_block()] if partial else []
            if partial:
                self.runner.copy_block(s.block_table[full], own[0])
            f.block_table, f.block_hashes = s.block_table[:full] + own, list(s.block_hashes[:full])
            f.num_computed, f.num_cached_tokens = p, s.num_cached_tokens
            self._running.append(f)
            if self._advance(f, lg):
                finished.append(f)
        return finished

    def _sample(self, s: _Seq, logits: torch.Tensor) -> tuple[int, float | None, list[tuple[int, float]] | None]:
        """Next token of ``s`` and, only when asked for, its log-probability and the top-k alternatives."""
        p = s.params
        if p.temperature == 0:
            tok = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, idx = torch.sort(probs, descending=True)
                keep = torch.cumsum(sp, 0) - sp < p.top_p
                keep[0] = True  # the most likely token is always in the nucleus (top_p = 0 -> top-1)
                probs = torch.zeros_like(probs).scatter(0, idx[keep], sp[keep])
            tok = draw(probs, s.generator, p.sampler)
        if not (p.logprobs or p.top_logprobs):
            return tok, None, None  # skip the full-vocabulary log-softmax nobody reads
        lsm = torch.log_softmax(logits.float(), dim=-1)
        top = None
        if p.top_logprobs:
            v, i = torch.topk(lsm, min(p.top_logprobs, lsm.numel()))
            top = list(zip(i.tolist(), v.tolist(), strict=True))
        return tok, float(lsm[tok]) if p.logprobs else None, top
