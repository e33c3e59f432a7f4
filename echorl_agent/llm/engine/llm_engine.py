"""KV-aware rollout engine: async submission, prefix-cached prefill, continuous batched decode.

One engine serves many actors (one per env). Actors call :meth:`LLMEngine.submit` from any thread and get a
``concurrent.futures.Future``; a loop (the background thread from :meth:`LLMEngine.start`, or the caller of
:meth:`LLMEngine.generate`) runs :meth:`LLMEngine.step`:

1. admit waiting requests in :class:`~echorl_agent.llm.engine.scheduler.Scheduler` order while there is room
   (``max_num_seqs``) and KV blocks; each admitted prompt gets its longest cached prefix from the
   :class:`~echorl_agent.llm.engine.prefix_cache.PrefixCache` (EchoRL's KV_frozen) and fresh blocks for the rest;
2. run one :class:`~echorl_agent.llm.engine.runner.ModelRunner` forward over every running sequence at once: the uncached
   suffix of new prompts (chunked to ``max_num_batched_tokens``) and one decode token of the others;
3. sample, publish every block that became full -- generated tokens included, so turn t+1 of an append-only
   dialogue reuses turn t's answer (the bug fixed in SGLang #16521) -- and retire finished sequences, whose slots
   new requests take at the next step (continuous batching).

:meth:`LLMEngine.score` computes log-likelihoods of N candidate continuations of one prompt sharing the prompt's KV
(one prefix, N short suffixes, one batched forward), the core of the scoring agent.

Requests fail alone: prompts are validated in :meth:`LLMEngine.submit`; when a batched forward or a sampling step
raises, the affected sequences are retried one by one and only the culprit's future gets the exception.
:meth:`LLMEngine.abort` (or cancelling the returned future) stops a request between two steps and frees its KV.
:meth:`LLMEngine.submit_group` samples ``n`` continuations of one prompt that is prefilled once: after the leader's
prefill the other ``n - 1`` sequences fork its KV (full blocks shared, the partial last block copied), as vLLM's
parallel sampling does.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import torch

from echorl_agent.llm.engine.config import EngineConfig, GenerationResult, SamplingParams, ScoreResult
from echorl_agent.llm.engine.engine_requests import TokenCallback, _RequestsMixin, _Seq
from echorl_agent.llm.engine.prefix_cache import CacheStats, PrefixCache
from echorl_agent.llm.engine.runner import ModelRunner, SeqChunk
from echorl_agent.llm.engine.scheduler import Scheduler
from echorl_agent.llm.engine.score_memo import ScoreMemo
from echorl_agent.llm.engine.scoring import SoftTokens
from echorl_agent.llm.models.loading import LoadedModel, load_model

__all__ = ["EngineConfig", "SamplingParams", "GenerationResult", "ScoreResult", "LLMEngine"]

log = logging.getLogger(__name__)



class LLMEngine(_RequestsMixin):
    """Batched, prefix-cached generation and scoring over a local model (see the module docstring).

    Args:
        model: a :class:`~echorl_agent.llm.models.loading.LoadedModel` or a name for :func:`load_model`.
        config: engine configuration.
    """

    def __init__(self, model: LoadedModel | str = "smollm2-135m", config: EngineConfig | None = None) -> None:
        self.llm = load_model(model) if isinstance(model, str) else model
        self.config = config or EngineConfig()
        pc = self.config.prefix_cache
        num_blocks = pc.num_blocks(ModelRunner.kv_bytes_per_token(self.llm.model))
        self.runner = ModelRunner(
            self.llm.model, num_blocks, pc.block_size, self.config.attention_backend, self.config.weight_dtype,
            self.config.float32_top_layers, self.config.prefill_dtype,
        )
        self.cache = PrefixCache(num_blocks, pc)
        self.score_memo = ScoreMemo(self.config.score_memo_tokens if pc.enable_prefix_caching else 0)
        """Scoring requests already answered under the current weights (:mod:`~echorl_agent.llm.engine.score_memo`)."""
        self.scheduler = Scheduler(self.config.scheduler)
        self.eos_token_ids = tuple(self.llm.eos_token_ids)
        self.max_model_len = int(getattr(self.llm.model.config, "max_position_embeddings", 1 << 30))
        self._ids = itertools.count()
        self.vocab_size = int(self.llm.model.get_input_embeddings().num_embeddings)
        self._waiting: list[_Seq] = []
        self._running: list[_Seq] = []
        self._live: dict[int, _Seq] = {}  # request id -> unfinished sequence (for abort)
        self._aborted: set[int] = set()
        self._lock = threading.RLock()
        self._work = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.num_steps = 0
        self.num_generated_tokens = 0
        if self.runner.num_w8a8_layers:  # the built-in calibration set (an empty cache: nothing to invalidate)
            from echorl_agent.llm.engine.calibration import calibration_token_ids

            self.runner.calibrate_prefill(calibration_token_ids(self.llm))

    # ------------------------------------------------------------------ public API
    @property
    def stats(self) -> CacheStats:
        """Prefix-cache counters: cached/computed prompt tokens, reuse rate rho, evictions, collisions."""
        return self.cache.stats

    def submit(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, priority: float = 1.0,
        on_token: TokenCallback | None = None,
    ) -> Future:
        """Queue a generation request (thread-safe); the future resolves to a :class:`GenerationResult`.

        The future carries ``request_id`` (for :meth:`abort`); cancelling it aborts the request. ``on_token`` is
        called from the engine loop after each sampled token (streaming).

        Raises:
            ValueError: empty prompt, a token id outside ``[0, vocab_size)``, a prompt longer than the model's
                context or the KV pool, or a negative priority.
        """
        return self.submit_group(prompt, params, 1, priority, on_token)[0]

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
            return bool(self._waiting or self._running or self._aborted)

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
        self,
        prompt: str | Sequence[int],
        candidates: Sequence[str | Sequence[int]],
        share_prefix: bool = True,
        soft: SoftTokens | None = None,
        capture: bool = False,
    ) -> ScoreResult:
        """Log-likelihood of each candidate continuation given ``prompt`` (see :mod:`echorl_agent.llm.engine.scoring`).

        Args:
            prompt: prompt text or token ids.
            candidates: continuations (text is tokenized on its own, without special tokens).
            share_prefix: True = the prompt's KV is computed once (or taken from the cache) and shared by all
                candidates in one batched forward; False = the naive baseline, one full forward per candidate.
            soft: soft tokens between the prompt and the candidates (never cached).
            capture: also return the last context hidden state and captured activations (for a learner).
        """
        from echorl_agent.llm.engine.scoring import score_candidates

        p = self.llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        cands = [self.llm.encode(c) if isinstance(c, str) else [int(t) for t in c] for c in candidates]
        if not share_prefix:
            with self._lock:
                return score_candidates(self.runner, self.cache, p, cands, share_prefix, soft=soft, capture=capture)
        return self.score_batch([p], [cands], None if soft is None else [soft], capture)[0]

    def score_batch(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[Sequence[int]]],
        soft: Sequence[SoftTokens | None] | None = None,
        capture: bool = False,
    ) -> list[ScoreResult]:
        """:meth:`score` for several prompts at once (the envs of one rollout step), in two batched forwards.

        Exact duplicate requests (no soft tokens) are computed once; see :func:`echorl_agent.llm.engine.scoring.score_batch`.
        A request answered before under the same weights returns that result (:attr:`score_memo`).
        """
        from echorl_agent.llm.engine.scoring import score_batch

        ps = [[int(t) for t in p] for p in prompts]
        cs = [[[int(t) for t in c] for c in cands] for cands in candidates]
        with self._lock:
            return self.score_memo.score_batch(
                lambda ps_, cs_, ss_: score_batch(self.runner, self.cache, ps_, cs_, ss_, capture),
                self.cache.generation, ps, cs, soft, capture)

    # ------------------------------------------------------------------ weights (RL)
    @property
    def weight_version(self) -> int:
        """Bumped by every :meth:`update_weights`; KV cached under an older version is never served."""
        return self.cache.weight_version

    def update_weights(self, state: Mapping[str, torch.Tensor]) -> int:
        """Copy new weights into the engine's model (a learner update) and invalidate the prefix cache.

        Args:
            state: parameter name (as in ``model.named_parameters()``) -> new tensor of the same shape.

        Returns:
            The new weight version.

        Raises:
            RuntimeError: requests are in flight (their KV mixes old and new weights); update between rollouts.
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
            return self.cache.invalidate()

    def reset_prefix_cache(self, weight_version: int | None = None) -> None:
        """Empty the prefix cache, optionally continuing at ``weight_version`` (see :meth:`PrefixCache.reset`).

        Raises:
            RuntimeError: requests are in flight.
        """
        with self._lock:
            if self.has_work():
                raise RuntimeError("reset_prefix_cache while requests are in flight; wait for them to finish")
            self.cache.reset(weight_version)

    def on_weights_updated(self, names: list[str]) -> None:
        """Hook run after :meth:`update_weights` copied ``names``: re-packs the changed quantized linears."""
        self.runner.refresh_weights(names)

    def calibrate_prefill(self, texts: Sequence | None = None) -> None:
        """(Re-)calibrate the int8 prefill (``prefill_dtype="int8"``) on ``texts`` and invalidate the prefix cache.

        Args:
            texts: strings, token id lists or chat conversations (see
                :func:`~echorl_agent.llm.engine.calibration.calibration_token_ids`); None = the built-in set
                :data:`~echorl_agent.llm.engine.calibration.CALIBRATION_CONVERSATIONS` (what the engine uses when it
                is built). Prompts like the ones the engine will serve give the smoothing their channel ranges.

        Raises:
            ValueError: the engine has no int8 prefill layers.
            RuntimeError: requests are in flight.
        """
        from echorl_agent.llm.engine.calibration import calibration_token_ids

        token_lists = calibration_token_ids(self.llm, texts)
        with self._lock:
            if self.has_work():
                raise RuntimeError("calibrate_prefill while requests are in flight; wait for them to finish")
            self.runner.calibrate_prefill(token_lists)
            self.cache.invalidate()

    def enable_capture(self, layer: int | None) -> None:
        """Capture activations entering ``layer`` for every token (see :meth:`ModelRunner.enable_capture`).

        Blocks cached before capture was on have no activations, so the prefix cache is invalidated.
        """
        with self._lock:
            if self.runner.capture_layer != layer:
                self.runner.enable_capture(layer)
                self.cache.invalidate()

    def prompt_logprobs(
        self, prompt: str | Sequence[int], top_k: int = 0
    ) -> tuple[list[int], list[float | None], list[list[tuple[int, float]] | None]]:
        """Log-probability of every prompt token given the tokens before it (None for the first token).

        Returns ``(token ids, logprobs, top_k alternatives per position)`` (see
        :func:`echorl_agent.llm.engine.scoring.prompt_logprobs`).
        """
        from echorl_agent.llm.engine.scoring import prompt_logprobs

        tokens = self.validate_prompt(prompt)
        with self._lock:
            lps, tops = prompt_logprobs(self.runner, self.cache, tokens, top_k)
        return tokens, lps, tops

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            with self._work:
                while not self._stop and not (self._waiting or self._running or self._aborted):
                    self._work.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception:  # step() isolates per-request errors; this is a bug guard that keeps the loop alive
                log.exception("engine step failed outside per-request isolation")

    def step(self) -> int:
        """Admit, run one batched forward, sample, retire. Returns the number of sequences advanced."""
        with self._lock:
            self._purge_aborted()
            self._admit()
            if not self._running:
                return 0
            chunks, advanced = self._build_chunks()
            logits = self._forward(chunks, advanced)
            finished = self._postprocess(advanced, logits)
            self.num_steps += 1
        for s in finished:
            self._resolve(s, result=self._result(s))
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
        elif not self._running and waiting:  # submit() checks the size, so only a pool held by scoring gets here
            s = self.scheduler.order(waiting, cached, self.num_steps)[0]
            self._fail(s, MemoryError(
                f"the prompt of {s.num_prompt_tokens} tokens does not fit the free KV pool of "
                f"{self.cache.num_free_blocks * self.cache.block_size} tokens; raise PrefixCacheConfig.max_tokens"
            ))

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

    def _postprocess(self, seqs: list[tuple[_Seq, int]], logits: list[torch.Tensor | None]) -> list[_Seq]:
        bs = self.cache.block_size
        finished: list[_Seq] = []
        for (s, n), lg in zip(seqs, logits, strict=True):
            if lg is None:
                continue  # failed alone in _forward
            try:
                s.num_computed += n
                # publish blocks that are now full (prompt and generated tokens alike)
                for i in range(len(s.block_hashes), s.num_computed // bs):
                    prev = s.block_hashes[-1] if s.block_hashes else None
                    s.block_hashes.append(
                        self.cache.register(s.block_table[i], prev, s.tokens[i * bs : (i + 1) * bs]))
                if s.num_computed < len(s.tokens):
                    continue  # chunked prefill not finished yet
                if s.followers:
                    finished += self._fork(s, lg)
                if self._advance(s, lg):
                    finished.append(s)
            except Exception as e:
                self._fail(s, e)
        for s in finished:
            if s.params.capture_states and self.runner.h_pool is not None:
                s.states = self.runner.gather_hidden(s.block_table, 0, s.num_computed)
            self._drop(s)
        return finished

    def _advance(self, s: _Seq, lg: torch.Tensor) -> bool:
        """Sample the next token of ``s`` from ``lg``; True when ``s`` is finished."""
        tok, lp, top = self._sample(s, lg)
        s.tokens.append(tok)
        self.num_generated_tokens += 1
        if s.params.logprobs:
            s.logprobs.append(lp)
        if top is not None:
            s.top_logprobs.append(top)
        done = self._check_stop(s, tok)
        if s.on_token is not None:
            s.on_token(s.index, tok, lp, top)
        return done

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
        text = s.text if s.text is not None else self.llm.decode(gen)
        return GenerationResult(
            request_id=s.id,
            prompt_token_ids=s.tokens[: s.num_prompt_tokens],
            token_ids=gen,
            text=text,
            finish_reason=s.finish_reason or "length",
            num_cached_tokens=s.num_cached_tokens,
            num_computed_tokens=s.num_prompt_tokens - s.num_cached_tokens,
            logprobs=list(s.logprobs) if s.params.logprobs else None,
            top_logprobs=list(s.top_logprobs) if s.params.top_logprobs else None,
            states=s.states,
        )
