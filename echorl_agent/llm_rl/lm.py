"""The trainable LM and its rollout twin: a peft-wrapped learner copy, an engine copy, and the weight sync.

nano-vllm keeps rollout, learner and weight sync as separate small parts; so does this module. The learner holds
the HF model with LoRA adapters (peft) -- or unfrozen top layers -- on the top ``train_layers`` layers. The
rollout :class:`~echorl_agent.llm.engine.LLMEngine` runs a second copy of the same weights with the adapters
merged (``W + B A * alpha / r``), so its decode and scoring paths need nothing LoRA-specific. After every learner
update :meth:`TrainableLM.sync` copies the merged top layers into the engine
(:meth:`~echorl_agent.llm.engine.LLMEngine.update_weights`), which bumps the weight version and so never serves
KV computed with the old weights.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

from echorl_agent.llm import LLMEngine
from echorl_agent.llm.engine.config import EngineConfig
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
from echorl_agent.llm.models.loading import LoadedModel, load_model
from echorl_agent.llm.models.registry import layout_for
from echorl_agent.llm.quant.bf16 import cpu_has_native_bf16
from echorl_agent.llm_rl.config import LLMPolicyConfig
from echorl_agent.llm_rl.forward import DecoderParts
from echorl_agent.llm_rl.learner_bf16 import bf16_frozen_linears

__all__ = ["TrainableLM", "resolve_device"]


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


class TrainableLM:
    """Learner model (with adapters) + rollout engine (merged weights) of one LLM policy.

    Args:
        cfg: the policy config (model, trained layers, LoRA rank/targets, engine size).
        llm: an already loaded model to start from (default: load ``cfg.model``).
    """

    def __init__(self, cfg: LLMPolicyConfig, llm: LoadedModel | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        base = llm if llm is not None else load_model(cfg.model, dtype=dtype, device=str(self.device))
        hf = base.model
        layers = layout_for(hf.config).decoder_layers(hf)
        self.num_layers = len(layers)
        if cfg.train_layers > self.num_layers:
            raise ValueError(f"train_layers must be <= the model's {self.num_layers} layers, "
                             f"got train_layers={cfg.train_layers}")
        self.boundary = self.num_layers - cfg.train_layers
        """First trainable layer b: activations entering it are what the learner starts from."""
        rollout_model = copy.deepcopy(hf)
        available = sorted({n.rsplit(".", 1)[-1] for n, m in layers[0].named_modules()
                            if isinstance(m, torch.nn.Linear)})
        bad = [t for t in cfg.lora_targets if t not in available]
        if bad:
            raise ValueError(f"lora_targets {bad} do not exist in {cfg.model!r}; its decoder layers have "
                             f"linear layers {available}")
        hf.requires_grad_(False)
        self.layer_ids = list(range(self.boundary, self.num_layers))
        if cfg.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                              target_modules=list(cfg.lora_targets), layers_to_transform=self.layer_ids)
            with warnings.catch_warnings():  # raised inside peft, not at our call (transformers 5 rename)
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(hf, lcfg)
        else:
            self.model = hf
            for i in self.layer_ids:
                layers[i].requires_grad_(True)
        self.model.train(False)
        self.tokenizer = base.tokenizer
        self.llm = LoadedModel(model=hf, tokenizer=base.tokenizer, name=base.name, extra=base.extra)
        self.parts = DecoderParts.of(self.model)
        if cfg.learner_matmul_dtype == "bfloat16":
            if self.device.type == "cpu" and not cpu_has_native_bf16():
                warnings.warn("learner_matmul_dtype='bfloat16' on a CPU without AMX or AVX-512 BF16 (/proc/cpuinfo): "
                              "its bfloat16 products are emulated and slower than float32; keep 'float32'",
                              stacklevel=2)
            bf16_frozen_linears([self.parts.layers[i] for i in self.layer_ids] + [self.parts.lm_head])
        pc = PrefixCacheConfig(max_tokens=cfg.max_kv_tokens, enable_prefix_caching=cfg.prefix_caching)
        rollout_model.requires_grad_(False).eval()
        self.engine = LLMEngine(LoadedModel(rollout_model, base.tokenizer, base.name, base.extra),
                                EngineConfig(prefix_cache=pc, weight_dtype=cfg.engine_weight_dtype,
                                             float32_top_layers=cfg.train_layers * cfg.engine_float32_trained_layers,
                                             prefill_dtype=cfg.engine_prefill_dtype,
                                             score_memo_tokens=cfg.score_memo_tokens))
        # captured activations are reused only where exact: the engine's frozen layers below b compute the learner's
        # float32 ones (float32 weights, or quantized copies that dequantize to exactly those weights -- the
        # embedded SmolLM2 is a Q4_1 GGUF -- so the engine differs from float32 by summation order only); with int8
        # (or bfloat16) prefill they are reused by design: the learner starts from what the rollout's layers computed
        self.capture = (cfg.reuse_activations and self.boundary > 0
                        and (self.engine.runner.reproduces_layers(self.boundary)
                             or cfg.engine_prefill_dtype != "float32"))
        if self.capture:
            self.engine.enable_capture(self.boundary)

    # ------------------------------------------------------------------ parameters
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained weights only (LoRA adapters, or the unfrozen layers), detached copies."""
        if self.cfg.lora_rank > 0:
            from peft import get_peft_model_state_dict

            return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.cfg.lora_rank > 0:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state)
        else:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for n, t in state.items():
                    params[n].copy_(t)
        self.sync()

    def merged_state(self) -> dict[str, torch.Tensor]:
        """Engine parameter name -> learner weight with adapters merged, for every trained linear/layer."""
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if self.cfg.lora_rank > 0:
                prefix = "base_model.model."
                for name, mod in self.model.named_modules():
                    if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer") and "default" in getattr(
                            mod, "lora_A", {}):
                        w = mod.base_layer.weight + mod.get_delta_weight("default")
                        out[name.removeprefix(prefix) + ".weight"] = w.detach().clone()
            else:
                for n, p in self.model.named_parameters():
                    if p.requires_grad:
                        out[n] = p.detach().clone()
        return out

    def sync(self) -> int:
        """Push the learner's current weights into the rollout engine; returns the engine's new weight version."""
        return self.engine.update_weights(self.merged_state())

    # ------------------------------------------------------------------ adapters in peft's format
    def save_adapter(self, path: str | Path) -> Path:
        """Save the LoRA adapter as peft does (``PeftModel.from_pretrained(plain_hf_model, path)`` reloads it)."""
        if self.cfg.lora_rank == 0:
            raise ValueError("save_adapter needs lora_rank > 0 (full-layer training has no adapter to save)")
        path = Path(path)
        self.model.save_pretrained(str(path))
        return path
