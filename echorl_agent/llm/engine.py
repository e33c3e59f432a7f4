"""KV-aware rollout engine: async submission, prefix-cached prefill, continuous batched decode.

One engine serves many actors (one per env). Actors call :meth:`LLMEngine.submit` from any thread and get a
``concurrent.futures.Future``; a loop (the background thread from :meth:`LLMEngine.start`, or the caller of
:meth:`LLMEngine.generate`) runs :meth:`LLMEngine.step`:

1. admit waiting requests in :class:`~echorl_agent.llm.scheduler.Scheduler` order while there is room
   (``max_num_seqs``) and KV blocks; each admitted prompt gets its longest cached prefix from the
   :class:`~echorl_agent.llm.prefix_cache.PrefixCache` (EchoRL's KV_frozen) and fresh blocks for the rest;
2. run one :class:`~echorl_agent.llm.runner.ModelRunner` forward over every running sequence at once: the uncached
   suffix of new prompts (chunked to ``max_num_batched_tokens``) and one decode token of the others;
3. sample, publish every block that became full -- generated tokens included, so turn t+1 of an append-only
   dialogue reuses turn t's answer (the bug fixed in SGLang #16521) -- and retire finished sequences, whose slots
   new requests take at the next step (continuous batching).

:meth:`LLMEngine.score` computes log-likelihoods of N candidate continuations of one prompt sharing the prompt's KV
(one prefix, N short suffixes, one batched forward), the core of the scoring agent.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from echorl_agent.llm.config import EngineConfig, GenerationResult, SamplingParams, ScoreResult
from echorl_agent.llm.models import LoadedModel, load_model
from echorl_agent.llm.prefix_cache import CacheStats, PrefixCache
from echorl_agent.llm.runner import ModelRunner, SeqChunk
from echorl_agent.llm.scheduler import Scheduler

__all__ = ["EngineConfig", "SamplingParams", "GenerationResult", "ScoreResult", "LLMEngine"]

log = logging.getLogger(__name__)


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
    generator: torch.Generator | None = None
    text: str = ""
    finish_reason: str | None = None


class LLMEngine:
    """Batched, prefix-cached generation and scoring over a local model (see the module docstring).

    Args:
        model: a :class:`~echorl_agent.llm.models.LoadedModel` or a name for :func:`load_model`.
        config: engine configuration.
    """

    def __init__(self, model: LoadedModel | str = "smollm2-135m", config: EngineConfig | None = None) -> None:
        self.llm = load_model(model) if isinstance(model, str) else model
        self.config = config or EngineConfig()
        pc = self.config.prefix_cache
        num_blocks = pc.num_blocks(ModelRunner.kv_bytes_per_token(self.llm.model))
        self.runner = ModelRunner(
            self.llm.model, num_blocks, pc.block_size, self.config.attention_backend, self.config.weight_dtype
        )
        self.cache = PrefixCache(num_blocks, pc)
        self.scheduler = Scheduler(self.config.scheduler)
        self.eos_token_ids = tuple(self.llm.eos_token_ids)
        self.max_model_len = int(getattr(self.llm.model.config, "max_position_embeddings", 1 << 30))
        self._ids = itertools.count()
        self._waiting: list[_Seq] = []
        self._running: list[_Seq] = []
        self._lock = threading.RLock()
        self._work = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.num_steps = 0
        self.num_generated_tokens = 0
        self._weight_version = 0

    # ------------------------------------------------------------------ public API
    @property
    def stats(self) -> CacheStats:
        """Prefix-cache counters: cached/computed prompt tokens, reuse rate rho, evictions, collisions."""
        return self.cache.stats

    def submit(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, priority: float = 1.0
    ) -> Future:
        """Queue a generation request (thread-safe); the future resolves to a :class:`GenerationResult`."""
        params = params or SamplingParams()
        tokens = self.llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens:
            raise ValueError("the prompt is empty; pass at least one token")
        if len(tokens) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(tokens)} tokens, the model's limit is {self.max_model_len}")
        if priority < 0:
            raise ValueError(f"priority must be >= 0, got priority={priority}")
        fut: Future = Future()
        seq = _Seq(next(self._ids), tokens, len(tokens), params, float(priority), 0, fut)
        seq.arrival = seq.id
        if params.temperature > 0:
            seq.generator = torch.Generator().manual_seed(params.seed if params.seed is not None else seq.id)
        with self._work:
            seq.enqueued_step = self.num_steps
            self._waiting.append(seq)
            self._work.notify_all()
        return fut

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | None = None
    ) -> list[GenerationResult]:
        """Generate for several prompts at once (batched); runs the loop in this thread unless started."""
        futs = [self.submit(p, params) for p in prompts]
        return [self.wait(f) for f in futs]

    def wait(self, fut: Future) -> GenerationResult:
        """The result of ``fut``; without a background loop, runs steps in this thread until it is done."""
        if self._thread is None:
            with self._lock:  # one driving thread at a time; others wait here and then find their future done
                while not fut.done():
                    self.step()
        return fut.result()

    def has_work(self) -> bool:
        with self._work:
            return bool(self._waiting or self._running)

    def start(self) -> LLMEngine:
        """Run the step loop in a daemon thread (for many concurrent actors or a server)."""
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="echorl-llm-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background loop (pending requests stay queued)."""
        if self._thread is not None:
            with self._work:
                self._stop = True
                self._work.notify_all()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> LLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def score(
        self, prompt: str | Sequence[int], candidates: Sequence[str | Sequence[int]], share_prefix: bool = True
    ) -> ScoreResult:
        """Log-likelihood of each candidate continuation given ``prompt`` (see :mod:`echorl_agent.llm.scoring`).

        Args:
            prompt: prompt text or token ids.
            candidates: continuations (text is tokenized on its own, without special tokens).
            share_prefix: True = the prompt's KV is computed once (or taken from the cache) and shared by all
                candidates in one batched forward; False = the naive baseline, one full forward per candidate.
        """
        from echorl_agent.llm.scoring import score_candidates

        p = self.llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        cands = [self.llm.encode(c) if isinstance(c, str) else [int(t) for t in c] for c in candidates]
        with self._lock:
            return score_candidates(self.runner, self.cache, p, cands, share_prefix)

    # ------------------------------------------------------------------ weights (RL)
    @property
    def weight_version(self) -> int:
        """Bumped by every :meth:`update_weights`; KV computed under older weights is never served."""
        return self._weight_version

    def update_weights(self, state: Mapping[str, torch.Tensor]) -> int:
        """Copy new weights into the engine's model (a learner update), re-pack quantized copies, drop the cache.

        Args:
            state: parameter name (as in ``model.named_parameters()``) -> new tensor of the same shape.

        Returns:
            The new weight version.

        Raises:
            RuntimeError: requests are in flight (their KV would mix old and new weights).
            ValueError: an unknown parameter name or a shape mismatch.
        """
        params = dict(self.llm.model.named_parameters())
        for name, t in state.items():
            if name not in params:
                hint = difflib.get_close_matches(name, list(params), n=1)
                raise ValueError(f"unknown parameter {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
            if tuple(params[name].shape) != tuple(t.shape):
                raise ValueError(f"shape of {name!r}: engine {tuple(params[name].shape)}, given {tuple(t.shape)}")
        with self._lock:
            if self.has_work():
                raise RuntimeError("update_weights while requests are in flight; wait for them to finish")
            with torch.no_grad():
                for name, t in state.items():
                    params[name].copy_(t.to(params[name].dtype))
            self.on_weights_updated(list(state))
            # no sequence holds blocks now, so a fresh cache forgets every block computed with the old weights
            self.cache = PrefixCache(self.cache.num_blocks, self.config.prefix_cache)
            self._weight_version += 1
            return self._weight_version

    def on_weights_updated(self, names: list[str]) -> None:
        """Hook run after :meth:`update_weights` copied ``names``: re-packs the changed quantized linears."""
        self.runner.refresh_weights(names)

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            with self._work:
                while not self._stop and not (self._waiting or self._running):
                    self._work.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:  # fail the affected requests rather than killing the loop silently
                log.exception("engine step failed")
                with self._lock:
                    for s in self._running + self._waiting:
                        if s.block_table:
                            self.cache.release(s.block_table)
                        if not s.future.done():
                            s.future.set_exception(e)
                    self._running.clear()
                    with self._work:
                        self._waiting.clear()

    def step(self) -> int:
        """Admit, run one batched forward, sample, retire. Returns the number of sequences advanced."""
        with self._lock:
            self._admit()
            if not self._running:
                return 0
            chunks, advanced = self._build_chunks()
            logits = self.runner.forward(chunks)
            finished = self._postprocess(advanced, logits)
            self.num_steps += 1
        for s in finished:
            s.future.set_result(self._result(s))
        return len(advanced)

    # ------------------------------------------------------------------ step parts
    def _admit(self) -> None:
        with self._work:
            waiting = list(self._waiting)
        room = self.config.max_num_seqs - len(self._running)
        if not waiting or room <= 0:
            return
        cached = [len(self.cache.match(s.tokens)[0]) * self.cache.block_size for s in waiting]
        admitted = []
        for s in self.scheduler.order(waiting, cached, self.num_steps):
            if len(admitted) >= room:
                break
            # keep one free block per running sequence for decode growth
            if not self.cache.can_allocate(s.tokens) or self._blocks_after(s) < len(self._running) + 1:
                break
            alloc = self.cache.allocate(s.tokens)
            s.block_table = alloc.block_table
            s.block_hashes = alloc.block_hashes
            s.num_computed = s.num_cached_tokens = alloc.num_cached_tokens
            admitted.append(s)
        if admitted:
            with self._work:
                ids = {s.id for s in admitted}
                self._waiting = [s for s in self._waiting if s.id not in ids]
            self._running.extend(admitted)
        elif not self._running and waiting:
            raise MemoryError(
                f"the prompt of {waiting[0].num_prompt_tokens} tokens does not fit the KV pool of "
                f"{self.cache.num_blocks * self.cache.block_size} tokens; raise PrefixCacheConfig.max_tokens"
            )

    def _blocks_after(self, s: _Seq) -> int:
        return self.cache.num_free_blocks - self.cache.num_blocks_needed(len(s.tokens))

    def _build_chunks(self) -> tuple[list[SeqChunk], list[tuple[_Seq, int]]]:
        budget = self.config.max_num_batched_tokens
        chunks: list[SeqChunk] = []
        advanced: list[tuple[_Seq, int]] = []
        # decode tokens first (1 each), then prefill chunks, so a long prompt never stalls the batch
        for s in sorted(self._running, key=lambda s: len(s.tokens) - s.num_computed):
            todo = len(s.tokens) - s.num_computed
            n = min(todo, budget)
            if n <= 0:
                continue
            end = s.num_computed + n
            while len(s.block_table) * self.cache.block_size < end:
                if self.cache.num_free_blocks == 0:
                    self._preempt(s)
                    break
                s.block_table.append(self.cache.append_block())
            else:
                chunks.append(SeqChunk(s.tokens[s.num_computed : end], s.num_computed, s.block_table))
                advanced.append((s, n))
                budget -= n
        return chunks, advanced

    def _preempt(self, s: _Seq) -> None:
        """Out of blocks: release ``s`` and requeue it; its KV is recomputed (mostly from cache) later."""
        log.warning("KV pool full: preempting request %d (raise PrefixCacheConfig.max_tokens)", s.id)
        self.cache.release(s.block_table)
        s.block_table, s.block_hashes, s.num_computed = [], [], 0
        self._running.remove(s)
        with self._work:
            s.enqueued_step = self.num_steps
            self._waiting.insert(0, s)

    def _postprocess(self, seqs: list[tuple[_Seq, int]], logits: list[torch.Tensor]) -> list[_Seq]:
        bs = self.cache.block_size
        finished = []
        for (s, n), lg in zip(seqs, logits, strict=True):
            s.num_computed += n
            # publish blocks that are now full (prompt and generated tokens alike)
            for i in range(len(s.block_hashes), s.num_computed // bs):
                prev = s.block_hashes[-1] if s.block_hashes else None
                s.block_hashes.append(self.cache.register(s.block_table[i], prev, s.tokens[i * bs : (i + 1) * bs]))
            if s.num_computed < len(s.tokens):
                continue  # chunked prefill not finished yet
            tok, lp = self._sample(s, lg)
            s.tokens.append(tok)
            self.num_generated_tokens += 1
            if s.params.logprobs:
                s.logprobs.append(lp)
            if self._check_stop(s, tok):
                finished.append(s)
        for s in finished:
            self._running.remove(s)
            self.cache.release(s.block_table)
            s.block_table = []
        return finished

    def _sample(self, s: _Seq, logits: torch.Tensor) -> tuple[int, float | None]:
        """Next token of ``s`` and, only when ``params.logprobs`` asks for it, its log-probability."""
        p = s.params
        if p.temperature == 0:
            tok = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, idx = torch.sort(probs, descending=True)
                keep = torch.cumsum(sp, 0) - sp < p.top_p
                probs = torch.zeros_like(probs).scatter(0, idx[keep], sp[keep])
            tok = int(torch.multinomial(probs, 1, generator=s.generator))
        if not p.logprobs:
            return tok, None  # skip the full-vocabulary log-softmax nobody reads
        return tok, float(torch.log_softmax(logits, dim=-1)[tok])

    def _check_stop(self, s: _Seq, tok: int) -> bool:
        p = s.params
        n_gen = len(s.tokens) - s.num_prompt_tokens
        stop_ids = self.eos_token_ids if p.stop_token_ids is None else p.stop_token_ids
        if not p.ignore_eos and tok in stop_ids:
            s.finish_reason = "stop"
        elif p.stop:
            text = self.llm.decode(s.tokens[s.num_prompt_tokens :])
            cut = min((text.find(x) for x in p.stop if x in text), default=-1)
            if cut >= 0:
                s.finish_reason, s.text = "stop", text[:cut]
        if s.finish_reason is None and (n_gen >= p.max_tokens or len(s.tokens) >= self.max_model_len):
            s.finish_reason = "length"
        return s.finish_reason is not None

    def _result(self, s: _Seq) -> GenerationResult:
        gen = s.tokens[s.num_prompt_tokens :]
        text = s.text if s.text else self.llm.decode(gen)
        return GenerationResult(
            request_id=s.id,
            prompt_token_ids=s.tokens[: s.num_prompt_tokens],
            token_ids=gen,
            text=text,
            finish_reason=s.finish_reason or "length",
            num_cached_tokens=s.num_cached_tokens,
            num_computed_tokens=s.num_prompt_tokens - s.num_cached_tokens,
            logprobs=list(s.logprobs) if s.params.logprobs else None,
        )
