"""Configuration and result types of :class:`echorl_agent.llm.engine.LLMEngine`."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.engine.scheduler import SchedulerConfig

__all__ = [
    "EngineConfig", "SamplingParams", "GenerationResult", "ScoreResult", "QUANTIZED_BITS", "WEIGHT_DTYPES",
    "SAMPLERS", "check_weight_dtype", "PREFILL_DTYPES", "check_prefill_dtype",
]

#: The packed weight dtypes of :class:`~echorl_agent.llm.quant.linear.QuantizedLinear` and their bits per weight.
QUANTIZED_BITS = {"int8": 8, "int4": 4}
#: Values of ``EngineConfig.weight_dtype``: "float32" (the model's own weights, exact), "int8" and "int4" (packed
#: copies for the CPU decode kernel, :mod:`echorl_agent.llm.quant.linear`). The one list: the engine's check, ``echorl
#: serve --weight-dtype``, the quantized linears and the learner's engine option read it.
WEIGHT_DTYPES = ("float32", *QUANTIZED_BITS)
#: Values of ``SamplingParams.sampler``: how a token is drawn from softmax(logits / temperature) (same distribution).
#: "multinomial" is ``torch.multinomial`` (one exponential draw per vocabulary entry: ~1 ms for SmolLM2's 49,152
#: tokens on one CPU thread); "inverse_cdf" draws one uniform number and finds it in the float64 cumulative sum of
#: the probabilities (~0.09 ms). Same seed, different tokens between the two.
SAMPLERS = ("multinomial", "inverse_cdf")
#: Values of ``EngineConfig.prefill_dtype``: "float32" (exact), "int8" (the frozen layers' projections run as
#: SmoothQuant-smoothed int8 activations x int8 weights on multi-row forwards, :mod:`echorl_agent.llm.quant.w8a8`;
#: 2.3x float32's prefill rate on an AVX-512 VNNI host, where torch._int_mm runs the product; not faster on an
#: AVX2-only host: 1.02x at 1 thread, 0.72x at 2) or
#: "bfloat16" (activations and weights rounded to bfloat16, :mod:`echorl_agent.llm.quant.bf16`; faster only on CPUs
#: with AMX or AVX-512 BF16, slower elsewhere).
PREFILL_DTYPES = ("float32", "int8", "bfloat16")


def check_weight_dtype(weight_dtype: str) -> str:
    """Return ``weight_dtype`` or raise a ValueError naming the field and the allowed values."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(
            f"weight_dtype must be one of {WEIGHT_DTYPES}, got weight_dtype={weight_dtype!r}; "
            "use 'float32' for exact decoding, 'int8' for fast batched CPU decoding or 'int4' for the smallest "
            "weights and fastest single stream"
        )
    return weight_dtype


def check_prefill_dtype(prefill_dtype: str) -> str:
    """Return ``prefill_dtype`` or raise a ValueError naming the field and the allowed values."""
    if prefill_dtype not in PREFILL_DTYPES:
        raise ValueError(
            f"prefill_dtype must be one of {PREFILL_DTYPES}, got prefill_dtype={prefill_dtype!r}; use 'float32' "
            "for exact prefill, 'int8' for int8 activations x int8 weights in the frozen layers or 'bfloat16' for "
            "bfloat16 products there (fast on CPUs with AMX / AVX-512 BF16)"
        )
    return prefill_dtype


@dataclass
class SamplingParams:
    """How one request is decoded."""

    max_tokens: int = 64
    """Maximum generated tokens."""
    temperature: float = 0.0
    """0 = greedy (argmax); > 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off; 0 keeps only the most probable token, as OpenAI's API allows)."""
    seed: int | None = None
    """Seed of this request's sampler (same seed -> same tokens)."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends once the text contains one (the text is cut before it)."""
    stop_token_ids: tuple[int, ...] | None = None
    """Token ids that end generation; None = the model's EOS ids."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks)."""
    logprobs: bool = False
    """Return the log-probability of every generated token."""
    capture_states: bool = False
    """Return the captured activations of every computed token (:meth:`LLMEngine.enable_capture`)."""
    top_logprobs: int = 0
    """Also return the ``top_logprobs`` most likely tokens and their log-probabilities at every step."""
    sampler: str = "multinomial"
    """How a token is drawn at temperature > 0 (one of :data:`SAMPLERS`): "multinomial" (``torch.multinomial``)
    or "inverse_cdf" (one uniform draw per token, ~10x cheaper on a CPU; the same distribution)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, numbers.Integral) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got max_tokens={self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got temperature={self.temperature}")
        if not math.isfinite(self.top_p) or not 0 <= self.top_p <= 1:
            raise ValueError(f"top_p must be in [0, 1], got top_p={self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise ValueError(f"seed must be an int or None, got seed={self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop must be non-empty strings, got stop={self.stop!r}")
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, numbers.Integral) or self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be an int >= 0, got top_logprobs={self.top_logprobs!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got sampler={self.sampler!r}")


@dataclass
class EngineConfig:
    """Engine size and policies."""

    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    """Block size, KV budget and the prefix-caching switch."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Request ordering (EchoRL Eq. 5 by default)."""
    max_num_seqs: int = 16
    """Sequences decoded together in one step."""
    max_num_batched_tokens: int = 2048
    """Tokens per forward step (prefill chunks + decode tokens)."""
    attention_backend: str = "auto"
    """"auto" (Triton on CUDA, torch reference on CPU), "torch" or "triton"."""
    weight_dtype: str = "float32"
    """Decode weights: "float32" (exact), "int8" (fast on CPU, best batched) or "int4" (smallest, fastest single stream); see echorl_agent.llm.quant."""
    float32_top_layers: int = 0
    """With an int8/int4 ``weight_dtype``: the top k decoder layers keep the model's float32 weights (the layers an
    RL learner trains: rollouts then compute them as the learner does, and a weight update re-packs nothing).
    With ``prefill_dtype`` "int8" or "bfloat16": the top k layers stay float32 in prefill too."""
    prefill_dtype: str = "float32"
    """Prefill of the layers below the ``float32_top_layers``: "float32" (exact), "int8" (W8A8: per-token int8
    activations x per-channel int8 weights after SmoothQuant smoothing calibrated when the engine is built, see
    :meth:`LLMEngine.calibrate_prefill`) or "bfloat16" (activations and weights rounded to bfloat16, float32
    accumulation, and the attention of those layers computed on bfloat16 queries, keys and values; no calibration;
    faster only where the CPU has AMX or AVX-512 BF16, a warning says so elsewhere).
    Applies to forward steps with more tokens than sequences (prefill and scoring chunks; a decode token in the same
    step rides along); pure decode steps and the LM head are unchanged."""

    score_memo_tokens: int = 32768
    """Scoring requests kept, in prompt tokens (0: none): a request scored again under the same weights returns
    the earlier result and prefills nothing (:class:`~echorl_agent.llm.engine.score_memo.ScoreMemo`; exact). Off
    with the prefix cache (``enable_prefix_caching=False``, the 'cache off' baseline)."""

    def __post_init__(self) -> None:
        check_weight_dtype(self.weight_dtype)
        check_prefill_dtype(self.prefill_dtype)
        k = self.float32_top_layers
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"float32_top_layers must be an int >= 0, got float32_top_layers={k!r}")
        m = self.score_memo_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"score_memo_tokens must be an int >= 0, got score_memo_tokens={m!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got max_num_seqs={self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_num_seqs, got max_num_batched_tokens="
                f"{self.max_num_batched_tokens}, max_num_seqs={self.max_num_seqs}"
            )


@dataclass
class GenerationResult:
    """A finished request."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated tokens, the stop token included (so an append-only history stays token-exact)."""
    text: str
    """Decoded generation without special tokens, cut before a stop string."""
    finish_reason: str
    """"stop" (stop token/string) or "length"."""
    num_cached_tokens: int
    """Prompt tokens whose KV came from the prefix cache."""
    num_computed_tokens: int
    """Prompt tokens prefilled by the model."""
    logprobs: list[float] | None = None
    """Log-probability of each generated token (when ``SamplingParams.logprobs``)."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per generated token, the ``SamplingParams.top_logprobs`` most likely (token id, log-probability) pairs."""
    states: Any = None
    """With ``SamplingParams.capture_states``: captured activations ``[prompt + generated - 1, hidden]``."""


@dataclass
class ScoreResult:
    """Log-likelihoods of candidate continuations (:meth:`LLMEngine.score`)."""

    logprobs: list[float]
    """Sum of token log-probabilities of each candidate given the prompt."""
    token_counts: list[int]
    num_cached_tokens: int
    num_computed_tokens: int
    hidden: Any = None
    """With ``capture=True``: final normed hidden state ``[hidden]`` of the last context token."""
    context_states: Any = None
    """With ``capture=True`` and runner capture on: captured activations ``[p (+ m soft), hidden]``."""
    candidate_states: Any = None
    """With ``capture=True`` and runner capture on: per candidate ``[len - 1, hidden]`` captured activations of its
    tokens but the last (the last token is never run: nothing reads its output)."""
