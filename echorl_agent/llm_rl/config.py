"""Configuration of the LLM policies (:class:`~echorl_agent.llm_rl.policy.LLMPolicy`, GRPO)."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from echorl_agent.config import PlanningConfig
from echorl_agent.llm.engine.config import PREFILL_DTYPES, WEIGHT_DTYPES
from echorl_agent.llm.models import llama
from echorl_agent.llm_rl.learner_bf16 import LEARNER_MATMUL_DTYPES

__all__ = ["LLMPolicyConfig", "LORA_TARGETS", "check_no_plan_on_free_text"]

LORA_TARGETS = llama.NAMES.projection_leaves
"""The seven linear layers of a decoder layer of the Llama family (Qwen2 and Mistral name them alike): every one can
carry a LoRA adapter."""


@dataclass
class LLMPolicyConfig:
    """What is trained and how the LLM policy scores actions.

    Pass the fields through ``policy_kwargs`` (``LLMPPO("LLMPolicy", env, policy_kwargs={"lora_rank": 8})``).
    """

    model: str = "smollm2-135m"
    """The LM: ``"smollm2-135m"`` (embedded), an HF id or a local folder (Llama/Mistral/Qwen2 layouts)."""
    train_layers: int = 2
    """k: the top k decoder layers hold the trainable parameters; layers below are frozen, so the learner starts
    from the activations the rollout engine captured at layer L - k (exact reuse). Use the model's layer count
    to train every layer (then nothing is reused)."""
    lora_rank: int = 8
    """LoRA rank of the adapters on the top ``train_layers`` layers (peft); 0 = train those layers' full weights."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (peft ``lora_alpha``)."""
    lora_targets: tuple[str, ...] = LORA_TARGETS
    """Linear layers that get adapters (names inside a decoder layer)."""
    length_norm: bool = False
    """Score an action by its mean token log-probability instead of the sum (long actions are not penalised)."""
    temperature: float = 1.0
    """pi(a|s) = softmax(score(a) / temperature) over the admissible actions."""
    plan_tokens: int = 0
    """m: soft plan tokens conditioning the LM (EchoRL's tau_t); 0 = no plan (the plain LLM-PPO baseline)."""
    planning: PlanningConfig = field(default_factory=lambda: PlanningConfig(window=2, kl_coef=0.0))
    """The plan encoder F_phi over the last ``window + 1`` step features and lambda_KL (``kl_coef``)."""
    reuse_activations: bool = True
    """Learner starts from the rollout's captured activations (False: recompute the frozen layers)."""
    is_truncation: float = 2.0
    """Cap C of the truncated importance weight min(pi_learner / pi_rollout, C) (rollout/learner mismatch)."""
    value_hidden: int = 256
    """Width of the value head (an MLP on the last context token's final hidden state)."""
    max_kv_tokens: int = 16384
    """KV pool of the rollout engine in tokens."""
    prefix_caching: bool = True
    """Prefix cache of the rollout engine (False: the cache-off baseline)."""
    score_memo_tokens: int = 32768
    """Scoring requests the rollout engine keeps under the current weights, in prompt tokens
    (``EngineConfig.score_memo_tokens``): a state scored again -- a GiGPO group's episodes meet the same states --
    returns the first result and prefills nothing. 0: every repeat is recomputed on the cached prefix, which differs
    from the first result by float rounding only (as the engine ran before the memo)."""
    engine_weight_dtype: str = "float32"
    """Weights of the rollout engine: "float32" (exact), "int8" or "int4" (faster decode). The learner reuses the
    captured activations when the engine's frozen layers reproduce the float32 weights exactly (the embedded
    SmolLM2, a Q4_1 GGUF; int8 then differs from float32 by summation order only), else it recomputes the frozen
    layers in float32; the truncated IS weights correct any rollout/learner mismatch."""
    engine_float32_trained_layers: bool = True
    """With a quantized engine, the trained top layers stay float32 in the engine (``EngineConfig.float32_top_layers``):
    rollouts compute them as the learner does and an update re-packs nothing. False: they are packed too and
    re-packed after every update (their weights leave the GGUF grid, so the IS weights see a real mismatch)."""
    engine_prefill_dtype: str = "float32"
    """Prefill of the rollout engine's frozen layers: "float32" (exact), "int8" (W8A8 after SmoothQuant
    smoothing, ``EngineConfig.prefill_dtype``; a small policy shift, KL ~0.004 per GoToLocal decision) or "bfloat16"
    (KL ~0.0001; fast only on CPUs with AMX / AVX-512 BF16). The learner then starts from the activations those
    layers captured, so rollout and learner log-probs still agree. Both depend on the CPU: on an AVX-512 VNNI /
    BF16 host int8 prefills 2.3x and bfloat16 2.0x float32's rate; on an AVX2-only AMD EPYC the package's own
    W8A8 kernel prefills int8 at 1.3x float32's rate (an earlier kernel was 0.97x) and bfloat16 is slower
    (docs/results/engine-speed.md): there int8 buys ~1.3x for its
    small shift, and bfloat16 only pays where the CPU has AMX or AVX-512 BF16."""
    learner_matmul_dtype: str = "float32"
    """Products of the learner with frozen weights -- the trained layers' base projections and the LM head: "float32"
    (exact) or "bfloat16" (inputs and weights rounded to bfloat16, float32 accumulation;
    :mod:`~echorl_agent.llm_rl.learner_bf16`). The learner's time is almost all those products; on an AMD EPYC with
    AVX-512 BF16 they run about 4x faster in bfloat16 and the learner's forward + backward 2x; on an AVX2-only CPU
    they are slower (a warning says so).
    Trainable weights (LoRA adapters), attention, norms and the residual stream stay float32. On CUDA the learner
    loads the model in bfloat16 already, so this has no effect there."""
    show_admissible: bool = True
    """List the admissible actions in each observation turn (off: shorter prompts when the set never changes)."""
    admissible_in_system: bool = False
    """List the admissible actions once, at the end of the system message, and in no observation turn (overrides
    ``show_admissible``): the model still sees them, at no cost per step while the set stays the same (BabyAI's
    never changes; an env whose set changes re-prefills the whole prompt whenever it does). The LM reads another
    prompt, so the policy moves: KL 0.071 per state from gotolocal-rl's on one iteration's GoToLocal states
    (``benchmarks/prompt_lever_tokens.py``; "pick up" 0.018 -> 0.063, "done" 0.026 -> 0.052)."""
    drop_task_lines: bool = False
    """Leave the lines of an observation that repeat the task (BabyAI's ``Mission: ...``) out of its turn: the
    system message already names the task, and those tokens were prefilled again at every step. The policy moves:
    KL 0.021 per state from gotolocal-rl's ("go forward" 0.15 -> 0.22; ``benchmarks/prompt_lever_tokens.py``)."""
    candidate_end_token: bool = True
    """Score a candidate as the whole assistant reply ``action<end-of-turn>``. False: the action's tokens only, so
    log pi sums the action's own tokens and the engine prefills fewer candidate tokens per state (it never runs a
    candidate's last token; BabyAI: 4 instead of 12). An action that is a token prefix of another admissible action
    is then favoured over it, and the pretrained LM's start policy moves: on GoToLocal (goal line, length_norm) the
    mean probability of "pick up" over 6 reset states goes 0.02 -> 0.60 ("go forward" 0.23 -> 0.06), since "up" is
    near certain after "pick" while the end of the reply after "pick up" is not. On one gotolocal-rl iteration's 177
    states: KL 0.72 per state, "pick up" 0.018 -> 0.45 (``benchmarks/prompt_lever_tokens.py``).
    The end-of-turn token itself is never run either way: True reads ``log P(end | prompt, action)`` from the logits
    of the action's last token (engine and learner alike), so what False saves is that last action token, at the
    price of the policy. Kept opt-in for a study that asks whether the lean policy learns; no recipe uses it."""
    rollout_url: str | None = None
    """Score rollouts on this OpenAI-compatible server (``.../v1``) instead of the local engine; the learner pushes
    its adapter there after every update (:class:`~echorl_agent.llm_rl.remote.RemoteRollout`)."""
    system_prompt: str = (
        "You are an agent in a text game. Reply with the single best action from the admissible actions."
    )
    """System message of the chat prompt."""
    device: str = "auto"
    """"auto" (CUDA when available), "cpu" or "cuda"."""

    def __post_init__(self) -> None:
        for name in ("train_layers", "value_hidden", "max_kv_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        for name in ("lora_rank", "plan_tokens", "score_memo_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {name}={v!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got temperature={self.temperature!r}")
        if not self.is_truncation >= 1.0:
            raise ValueError(f"is_truncation must be >= 1, got is_truncation={self.is_truncation!r}")
        self.lora_targets = tuple(self.lora_targets)
        if not self.lora_targets:
            raise ValueError(f"lora_targets must name at least one layer, e.g. {LORA_TARGETS}")
        if isinstance(self.planning, dict):
            self.planning = PlanningConfig.from_kwargs(self.planning)
        if self.planning.window is None:
            self.planning.window = 2
        if self.rollout_url is not None and (self.plan_tokens or not self.lora_rank):
            raise ValueError(f"rollout_url needs lora_rank > 0 and plan_tokens=0 (adapters travel by name, soft tokens "
                             f"cannot), got lora_rank={self.lora_rank}, plan_tokens={self.plan_tokens}")
        if self.engine_weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"engine_weight_dtype must be one of {WEIGHT_DTYPES}, got "
                             f"engine_weight_dtype={self.engine_weight_dtype!r}")
        if self.engine_prefill_dtype not in PREFILL_DTYPES:
            raise ValueError(f"engine_prefill_dtype must be one of {PREFILL_DTYPES}, got "
                             f"engine_prefill_dtype={self.engine_prefill_dtype!r}")
        if self.learner_matmul_dtype not in LEARNER_MATMUL_DTYPES:
            raise ValueError(f"learner_matmul_dtype must be one of {LEARNER_MATMUL_DTYPES}, got "
                             f"learner_matmul_dtype={self.learner_matmul_dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got device={self.device!r}")

    @classmethod
    def from_kwargs(cls, config: LLMPolicyConfig | None = None, **kwargs: Any) -> LLMPolicyConfig:
        """A config from keyword arguments (``policy_kwargs``); unknown names raise ``ValueError`` with a hint."""
        names = [f.name for f in dataclasses.fields(cls)]
        planning_names = [f.name for f in dataclasses.fields(PlanningConfig)]
        base = dataclasses.asdict(config) if config is not None else {}
        if config is not None:
            base["planning"] = config.planning
        plan_over = {}
        for k, v in kwargs.items():
            if k in names:
                base[k] = v
            elif k in planning_names:
                plan_over[k] = v
            else:
                hint = difflib.get_close_matches(k, names + planning_names, n=1)
                raise ValueError(f"unknown LLMPolicy option {k!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                                 + f" (options: {', '.join(names)})")
        planning = base.get("planning")
        if plan_over or not isinstance(planning, PlanningConfig):
            defaults = dataclasses.asdict(cls().planning) if planning is None else (
                dataclasses.asdict(planning) if isinstance(planning, PlanningConfig) else dict(planning))
            base["planning"] = PlanningConfig.from_kwargs({**defaults, **plan_over})
        return cls(**base)


def check_no_plan_on_free_text(plan_tokens: int, env_id: str) -> None:
    """Raise if a latent plan is asked of free-text (GRPO) training, which has no window of an episode's states.

    Raises:
        ValueError: ``plan_tokens > 0`` (the message names the field, its value and the env).
    """
    if plan_tokens:
        raise ValueError(f"plan_tokens={plan_tokens}: the latent plan needs a window of an episode's states, and GRPO "
                         f"answers free-text prompts (env_id={env_id!r}) one completion at a time; set plan_tokens=0, "
                         "or use method 'echorl' on a choice env")
