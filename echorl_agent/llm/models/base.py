"""The layout of a decoder-only causal LM: where its modules live and the facts of its architecture.

nano-vllm writes one ``models/<family>.py`` per architecture; echorl does not reimplement the model -- the engine
runner, the W8A8 calibration, the quantized linears, the fused decode and the learner's forward all run the HF
model's own modules -- so a family's file holds its *layout* instead: the names of the decoder layers, of each
layer's attention and MLP projections and norms, of the embeddings, final norm, rotary embedding and LM head, and the
facts read from its config (head counts, norm epsilon, activation, RoPE, biases, tied embeddings, sliding window).
Code outside :mod:`echorl_agent.llm.models` reaches a module only through :class:`ModelLayout`, so supporting a new
family is one more file here (see :mod:`~echorl_agent.llm.models.registry`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ModuleNames", "ModelLayout", "PROJECTIONS", "ATTENTION_PROJECTIONS", "MLP_PROJECTIONS"]

ATTENTION_PROJECTIONS = ("q", "k", "v", "o")
"""The attention projections of a decoder layer, by role: query, key, value, output."""
MLP_PROJECTIONS = ("gate", "up", "down")
"""The gated MLP's projections, by role: ``down(act(gate(x)) * up(x))``."""
PROJECTIONS = ATTENTION_PROJECTIONS + MLP_PROJECTIONS
"""Every linear of a decoder layer, by role, in the order the engine packs them (q, k, v, o, gate, up, down)."""


def _submodule(module: torch.nn.Module, path: str) -> Any:
    """The submodule at dotted ``path``, by ``_modules`` dict lookups: what ``get_submodule`` returns, without its
    checks or ``nn.Module.__getattr__``'s Python fallback (the runner calls these several times per layer and step)."""
    if "." not in path:
        return module._modules[path]
    for name in path.split("."):
        module = module._modules[name]
    return module


@dataclass(frozen=True)
class ModuleNames:
    """Where a family keeps its modules, as ``torch.nn.Module.get_submodule`` paths.

    The first six are paths from the ``*ForCausalLM`` model; ``attention``, ``mlp`` and the two norms are paths from
    one decoder layer; each projection is a path from its attention or MLP module.
    """

    layers: str
    """The ``ModuleList`` of decoder layers."""
    embedding: str
    """The token embedding."""
    final_norm: str
    """The norm after the last decoder layer."""
    rotary: str
    """The rotary embedding module: ``rotary(x, position_ids [1, N]) -> (cos, sin)``, each ``[1, N, head_dim]``."""
    lm_head: str
    """The output projection to the vocabulary."""
    attention: str
    """A layer's attention module."""
    mlp: str
    """A layer's MLP module."""
    input_norm: str
    """The norm before attention (pre-norm)."""
    post_attention_norm: str
    """The norm before the MLP."""
    q: str
    k: str
    v: str
    o: str
    gate: str
    up: str
    down: str
    activation: str
    """The MLP's activation module (an attribute of :attr:`mlp`)."""
    norm_eps: str
    """The attribute of a norm module holding its epsilon."""
    rope_function: str
    """Name of the function ``(q, k, cos, sin, unsqueeze_dim) -> (q, k)`` in the attention module's own modeling
    module (so a family's RoPE variant is the one its attention uses)."""

    @property
    def projection_leaves(self) -> tuple[str, ...]:
        """The projections' own names (``"q_proj"``, ...) in :data:`PROJECTIONS` order, as peft's
        ``target_modules`` takes them."""
        return tuple(getattr(self, r) for r in PROJECTIONS)


@dataclass(frozen=True)
class ModelLayout:
    """One model's layout: its family's :class:`ModuleNames` plus the facts of its config.

    Build it with :func:`~echorl_agent.llm.models.layout_for` (which picks the family by ``config.model_type``), not
    by hand. The accessors take the HF ``*ForCausalLM`` (not a peft wrapper: pass ``get_base_model()``) or one of its
    decoder layers and look the module up on every call, so a module replaced after the layout was made (a LoRA
    wrapper) is the one returned.
    """

    model_type: str
    """The family's ``config.model_type`` (``"llama"``, ``"qwen2"``, ``"mistral"``)."""
    names: ModuleNames
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention: ``num_heads // num_kv_heads`` query heads share one)."""
    head_dim: int
    norm_eps: float
    """Epsilon of the RMSNorms."""
    hidden_act: str
    """The MLP's activation (``"silu"`` for all three families)."""
    rope_theta: float
    """RoPE base frequency."""
    rope_scaling: dict[str, Any] | None
    """RoPE scaling parameters (``rope_type`` other than ``"default"``), or None. The rotary module applies them."""
    tie_word_embeddings: bool
    """The LM head shares the token embedding's weight."""
    bias_projections: tuple[str, ...]
    """Roles (:data:`PROJECTIONS`) whose linear carries a bias (Qwen2: q, k, v)."""
    sliding_window: int | None
    """Tokens each query attends back to when the model uses sliding-window attention, else None."""

    # ------------------------------------------------------------------ qualified names
    def layer_prefix(self, i: int) -> str:
        """``"model.layers.3."``: the qualified-name prefix of decoder layer ``i``."""
        return f"{self.names.layers}.{i}."

    def projection_path(self, role: str) -> str:
        """Path of a projection from its decoder layer (``"self_attn.q_proj"`` for role ``"q"``)."""
        parent = self.names.attention if role in ATTENTION_PROJECTIONS else self.names.mlp
        return f"{parent}.{getattr(self.names, role)}"

    @property
    def projection_paths(self) -> tuple[str, ...]:
        """Every projection's path from its decoder layer, in :data:`PROJECTIONS` order."""
        return tuple(self.projection_path(r) for r in PROJECTIONS)

    def projection_name(self, i: int, role: str) -> str:
        """Qualified name of layer ``i``'s projection ``role`` (``"model.layers.0.self_attn.q_proj"``)."""
        return self.layer_prefix(i) + self.projection_path(role)

    def projection_names(self, i: int) -> list[str]:
        """Qualified names of layer ``i``'s seven projections, in :data:`PROJECTIONS` order."""
        return [self.projection_name(i, r) for r in PROJECTIONS]

    def linear_names(self, layers: range | None = None) -> list[str]:
        """Qualified names of the projections of ``layers`` (default: all), then the LM head's: the linears the
        engine quantizes."""
        layers = range(self.num_layers) if layers is None else layers
        return [n for i in layers for n in self.projection_names(i)] + [self.names.lm_head]

    def layer_of(self, name: str) -> int | None:
        """The decoder layer a parameter or module name belongs to (``"model.layers.3.mlp.up_proj.weight"`` -> 3),
        or None for a name outside the layers."""
        prefix = self.names.layers + "."
        if not name.startswith(prefix):
            return None
        head = name[len(prefix):].split(".", 1)[0]
        return int(head) if head.isdigit() else None

    @property
    def embedding_weight_name(self) -> str:
        """The token embedding's parameter name (its update also updates a tied LM head)."""
        return f"{self.names.embedding}.weight"

    # ------------------------------------------------------------------ modules of the model
    def decoder_layers(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(_submodule(model, self.names.layers))

    def embedding(self, model: torch.nn.Module) -> torch.nn.Module:
        return _submodule(model, self.names.embedding)

    def final_norm(self, model: torch.nn.Module) -> torch.nn.Module:
        return _submodule(model, self.names.final_norm)

    def rotary(self, model: torch.nn.Module) -> torch.nn.Module:
        return _submodule(model, self.names.rotary)

    def lm_head(self, model: torch.nn.Module) -> torch.nn.Module:
        return _submodule(model, self.names.lm_head)

    def tied(self, model: torch.nn.Module) -> bool:
        """True when the LM head's weight *is* the embedding's (checked on the modules, not the config)."""
        return self.lm_head(model).weight is self.embedding(model).weight

    # ------------------------------------------------------------------ modules of one decoder layer
    def attention(self, layer: torch.nn.Module) -> torch.nn.Module:
        return _submodule(layer, self.names.attention)

    def mlp(self, layer: torch.nn.Module) -> torch.nn.Module:
        return _submodule(layer, self.names.mlp)

    def input_norm(self, layer: torch.nn.Module) -> torch.nn.Module:
        return _submodule(layer, self.names.input_norm)

    def post_attention_norm(self, layer: torch.nn.Module) -> torch.nn.Module:
        return _submodule(layer, self.names.post_attention_norm)

    def attention_projections(self, layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
        """``(q, k, v, o)`` of one layer."""
        attn, n = _submodule(layer, self.names.attention), self.names
        return _submodule(attn, n.q), _submodule(attn, n.k), _submodule(attn, n.v), _submodule(attn, n.o)

    def mlp_projections(self, layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
        """``(gate, up, down)`` of one layer."""
        mlp, n = _submodule(layer, self.names.mlp), self.names
        return _submodule(mlp, n.gate), _submodule(mlp, n.up), _submodule(mlp, n.down)

    def projections(self, layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
        """All seven projections of one layer, in :data:`PROJECTIONS` order."""
        return self.attention_projections(layer) + self.mlp_projections(layer)

    def projection_slots(self, layer: torch.nn.Module) -> list[tuple[dict[str, torch.nn.Module], str]]:
        """For each projection (:data:`PROJECTIONS` order): its parent's ``_modules`` dict and its key there.

        A plain dict lookup is ~30x cheaper than ``nn.Module.__getattr__``; the fused decode checks the projections
        on every decode step this way (``slots[j][0][slots[j][1]] is module``).
        """
        attn, mlp = self.attention(layer), self.mlp(layer)
        return [((attn if r in ATTENTION_PROJECTIONS else mlp)._modules, getattr(self.names, r)) for r in PROJECTIONS]

    def activation(self, layer: torch.nn.Module) -> torch.nn.Module:
        """The MLP's activation module of one layer."""
        return _submodule(self.mlp(layer), self.names.activation)

    def norm_eps_of(self, norm: torch.nn.Module) -> float | None:
        """A norm module's epsilon (None if it keeps none where the family keeps it)."""
        eps = getattr(norm, self.names.norm_eps, None)
        return None if eps is None else float(eps)

    def rope_function(self, model: torch.nn.Module) -> Callable:
        """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) -> (q, k)`` from the attention's modeling module."""
        attn = self.attention(self.decoder_layers(model)[0])
        return getattr(importlib.import_module(type(attn).__module__), self.names.rope_function)

    def mlp_forward(self, layer: torch.nn.Module, x: torch.Tensor,
                    linear: Callable[[torch.Tensor, torch.nn.Module], torch.Tensor]) -> torch.Tensor:
        """The gated MLP ``down(act(gate(x)) * up(x))`` of one layer with each product run by ``linear(x, module)``
        (the engine's sliced or quantized products); the same arithmetic as HF's ``LlamaMLP.forward``."""
        gate, up, down = self.mlp_projections(layer)
        return linear(self.activation(layer)(linear(x, gate)) * linear(x, up), down)


def rope_facts(config: Any) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` of an HF config: transformers 5 keeps both in ``rope_parameters``, earlier
    versions in ``rope_theta`` and ``rope_scaling``. Scaling is None for the plain (``"default"``) RoPE."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(getattr(config, "rope_theta", 10000.0))
        scaling = dict(getattr(config, "rope_scaling", None) or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return theta, (scaling if kind != "default" else None)


def layout_from_config(config: Any, names: ModuleNames, bias_projections: tuple[str, ...],
                       sliding_window: int | None) -> ModelLayout:
    """A :class:`ModelLayout` of ``config`` with the facts every Llama-like HF config spells the same way; the family
    file supplies its names, its biases and its sliding-window rule."""
    heads = int(config.num_attention_heads)
    theta, scaling = rope_facts(config)
    return ModelLayout(
        model_type=str(config.model_type),
        names=names,
        num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        vocab_size=int(config.vocab_size),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        norm_eps=float(config.rms_norm_eps),
        hidden_act=str(config.hidden_act),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        bias_projections=tuple(r for r in PROJECTIONS if r in bias_projections),
        sliding_window=None if not sliding_window else int(sliding_window),
    )
