"""Calibration of the W8A8 prefill (``EngineConfig.prefill_dtype="int8"``): per-channel activation maxima.

SmoothQuant's smoothing (:mod:`echorl_agent.llm.quant.w8a8`) needs ``max|X_j|`` of every input channel of every
projection it quantizes. The engine takes them once, when it is built, from :data:`CALIBRATION_CONVERSATIONS`
(a fixed, built-in set of short chat conversations -- game observations and actions, prose, code, arithmetic,
lists -- rendered with the model's chat template so the special tokens and the first-token outliers of a real
prompt are seen) run through the float32 model; :meth:`LLMEngine.calibrate_prefill` re-takes them on a user's own
prompts. The maxima only balance each channel's range between activation and weight (the product is exact in
float), and the per-token activation scale adapts to any row at run time, so a value larger than calibration saw
is never clipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from echorl_agent.llm.models.base import ModelLayout
from echorl_agent.llm.models.registry import layout_for
from echorl_agent.llm.quant.bf16 import BF16Linear, pack_bf16
from echorl_agent.llm.quant.w8a8 import DEFAULT_ALPHA, W8A8Linear, pack_w8a8

__all__ = ["CALIBRATION_CONVERSATIONS", "LayerMaxima", "W8A8Layer", "activation_maxima", "pack_layer", "pack_layer_bf16",
           "calibration_token_ids"]

_SYSTEM = "You are an agent in a text game. Reply with the single best action from the admissible actions."

CALIBRATION_CONVERSATIONS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("system", _SYSTEM),
     ("user", "You see a wall 2 steps forward, a red ball 1 step left and 3 steps forward, a grey key 2 steps "
              "right. Your mission: go to the red ball.\nAdmissible actions: turn left, turn right, go forward, "
              "pick up, drop, toggle, done"),
     ("assistant", "turn left"),
     ("user", "You see a red ball 3 steps forward. Admissible actions: turn left, turn right, go forward"),
     ("assistant", "go forward")),
    (("system", _SYSTEM),
     ("user", "-= Kitchen =-\nYou are in a kitchen. A fridge is here; it is closed. On the counter you see a knife "
              "and a yellow potato. Exits: north, east.\nGoal: slice the potato and put it in the fridge.\n"
              "Admissible actions: open fridge, take knife, take yellow potato, go north, go east, inventory"),
     ("assistant", "take knife")),
    (("system", "You are a helpful assistant."),
     ("user", "Write a Python function that returns the n-th Fibonacci number, and explain its complexity."),
     ("assistant", "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                   "    return a\n\nThe loop runs n times, so it takes O(n) time and O(1) memory.")),
    (("system", "You are a helpful assistant."),
     ("user", "What is 17 * 23 + 144 / 12? Show the steps."),
     ("assistant", "17 * 23 = 391. 144 / 12 = 12. 391 + 12 = 403. The answer is 403.")),
    (("system", "You are a helpful assistant."),
     ("user", "Summarise in two sentences: The river had flooded the valley every spring for a century, and the "
              "villagers had learned to build their houses on stilts, to keep boats tied at every door, and to "
              "plant rice where their grandparents had grown wheat."),
     ("assistant", "Spring floods shaped village life for a hundred years. People adapted with stilt houses, "
                   "boats at every door and rice instead of wheat.")),
    (("system", "You are a shopping assistant on a web store."),
     ("user", "Instruction: find a pair of men's running shoes, size 10, under $60.\n[Search] [Back to Search]\n"
              "Results: (1) TrailRunner X2 - $54.99 - sizes 8-12; (2) CloudStep Pro - $89.00; (3) Kids Sprint "
              "- $24.50.\nAdmissible actions: click[TrailRunner X2], click[CloudStep Pro], click[Next >]"),
     ("assistant", "click[TrailRunner X2]")),
    (("system", "You are a helpful assistant."),
     ("user", "List five countries in South America with their capitals, as a Markdown table."),
     ("assistant", "| Country | Capital |\n|---|---|\n| Brazil | Brasilia |\n| Argentina | Buenos Aires |\n"
                   "| Chile | Santiago |\n| Peru | Lima |\n| Colombia | Bogota |")),
    (("system", _SYSTEM),
     ("user", "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
              "a drawer 2, a sinkbasin 1 and a toaster 1.\nYour task is to: put a clean mug in the coffeemachine.\n"
              "Admissible actions: go to cabinet 1, go to countertop 1, open drawer 2, go to sinkbasin 1, look"),
     ("assistant", "go to countertop 1"),
     ("user", "On the countertop 1, you see a mug 1 and a spoon 2."),
     ("assistant", "take mug 1 from countertop 1")),
)
"""The built-in calibration set (about 900 tokens with SmolLM2's template), as ``(role, content)`` turns."""


class LayerMaxima(NamedTuple):
    """Per-input-channel ``max|X|`` of the four inputs of one decoder layer's projections."""

    qkv: torch.Tensor
    """``[hidden]``: the input norm's output (the query, key and value projections' input)."""
    o: torch.Tensor
    """``[heads * head_dim]``: the attention output (the output projection's input)."""
    gate_up: torch.Tensor
    """``[hidden]``: the post-attention norm's output (the gate and up projections' input)."""
    down: torch.Tensor
    """``[intermediate]``: ``act(gate) * up`` (the down projection's input)."""


class W8A8Layer(NamedTuple):
    """One decoder layer's prefill projections: q/k/v share one product, gate/up another. W8A8
    (:class:`W8A8Linear`, ``prefill_dtype="int8"``) or bfloat16 (:class:`BF16Linear`, ``"bfloat16"``): both take a
    float32 input and return float32, with ``splits`` giving each projection's width."""

    qkv: W8A8Linear | BF16Linear
    o: W8A8Linear | BF16Linear
    gate_up: W8A8Linear | BF16Linear
    down: W8A8Linear | BF16Linear


def calibration_token_ids(llm, texts: Sequence | None = None) -> list[list[int]]:
    """Token ids of ``texts`` (None: :data:`CALIBRATION_CONVERSATIONS`).

    Each entry may be a string (encoded as is), a list of token ids, or a conversation: a list of
    ``{"role", "content"}`` dicts or ``(role, content)`` pairs (rendered with the chat template when the tokenizer
    has one).
    """
    out = []
    for t in CALIBRATION_CONVERSATIONS if texts is None else texts:
        if isinstance(t, str):
            ids = llm.encode(t)
        elif len(t) and all(isinstance(v, int) for v in t):
            ids = [int(v) for v in t]
        else:
            msgs = [m if isinstance(m, dict) else {"role": m[0], "content": m[1]} for m in t]
            if getattr(llm.tokenizer, "chat_template", None):
                ids = llm.chat_ids(msgs, add_generation_prompt=False)
            else:
                ids = llm.encode("\n".join(m["content"] for m in msgs))
        if ids:
            out.append(list(ids))
    if not out:
        raise ValueError("calibration needs at least one non-empty text")
    return out


@torch.inference_mode()
def activation_maxima(model: torch.nn.Module, layers: Sequence[int],
                      token_lists: Sequence[Sequence[int]]) -> dict[int, LayerMaxima]:
    """``max|X_j|`` over every token of ``token_lists`` of the projection inputs of ``layers``, from the float32
    HF model's own forward (pre-hooks on the q, o, gate and down projections, found through the model's
    :class:`~echorl_agent.llm.models.base.ModelLayout`)."""
    seen: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []

    def hook_for(key):
        def hook(mod, args):
            a = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            seen[key] = torch.maximum(seen[key], a) if key in seen else a
        return hook

    layout = layout_for(model.config)
    blocks = layout.decoder_layers(model)
    try:
        for i in layers:
            q, _, _, o = layout.attention_projections(blocks[i])
            gate, _, down = layout.mlp_projections(blocks[i])
            for part, mod in (("qkv", q), ("o", o), ("gate_up", gate), ("down", down)):
                hooks.append(mod.register_forward_pre_hook(hook_for((i, part))))
        dev = next(model.parameters()).device
        for ids in token_lists:
            model(torch.tensor([list(ids)], dtype=torch.long, device=dev), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {i: LayerMaxima(*(seen[(i, p)] for p in LayerMaxima._fields)) for i in layers}


def pack_layer_bf16(layout: ModelLayout, layer: torch.nn.Module) -> W8A8Layer:
    """The bfloat16 prefill projections of one decoder layer from its current float weights (no calibration)."""
    q, k, v, o = layout.attention_projections(layer)
    gate, up, down = layout.mlp_projections(layer)
    return W8A8Layer(qkv=pack_bf16([q, k, v]), o=pack_bf16([o]), gate_up=pack_bf16([gate, up]), down=pack_bf16([down]))


def pack_layer(layout: ModelLayout, layer: torch.nn.Module, maxima: LayerMaxima | None,
               alpha: float = DEFAULT_ALPHA) -> W8A8Layer:
    """The W8A8 projections of one decoder layer from its current float weights (None maxima: no smoothing)."""
    q, k, v, o = layout.attention_projections(layer)
    gate, up, down = layout.mlp_projections(layer)
    m = maxima or LayerMaxima(None, None, None, None)
    return W8A8Layer(
        qkv=pack_w8a8([q, k, v], m.qkv, alpha),
        o=pack_w8a8([o], m.o, alpha),
        gate_up=pack_w8a8([gate, up], m.gate_up, alpha),
        down=pack_w8a8([down], m.down, alpha),
    )
