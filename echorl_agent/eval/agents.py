"""The agent registry of the evaluation runner: one short name per baseline.

Every agent follows the one protocol of :class:`echorl_agent.agents.Agent`: ``reset`` at the start of an episode, ``act``
once per step, ``stats`` for counters the summary reports (LLM tokens, KV reuse...). A *learned* agent (``AgentSpec.learned``:
PPO, EchoPPO, DQN..., and any policy with a sampling temperature) takes a ``deterministic: bool`` factory option and
exposes a writable ``deterministic`` attribute; the runner sets it per evaluation mode (``--eval-mode``), so one
trained policy is evaluated both greedily and by sampling. Agents that need a part that is not
installed or not built are listed as unavailable with the reason (:func:`availability`), never faked.

One agent can run several times in one table under labels: ``NAME@LABEL`` (e.g. ``react@local`` and
``react@gpt-4o``) is agent ``NAME`` with its own ``agent_options["NAME@LABEL"]`` -- how backbones are compared side
by side (``{"react@gpt-4o": {"base_url": "https://api.openai.com/v1", "model": "gpt-4o"}}``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from echorl_agent.agents.base import Agent
from echorl_agent.agents.basic import ExpertAgent, RandomAgent

__all__ = ["AgentSpec", "AGENTS", "EVAL_MODES", "eval_modes", "availability", "incompatibility", "make_agent", "agent_names",
           "base_name"]


@dataclass(frozen=True)
class AgentSpec:
    """A registry entry: how to build the agent and what it needs."""

    name: str
    description: str
    #: factory(env_id, **options) -> Agent; a dotted "module:callable" string is imported lazily
    factory: str | Callable[..., Agent]
    #: modules that must import for the agent to be available
    requires: tuple[str, ...] = ()
    #: "none", "sb3" (trained for a budget) or "llm"
    kind: str = "none"
    options: dict[str, Any] = field(default_factory=dict)
    #: a learned policy evaluated greedily and/or by sampling: its factory takes ``deterministic: bool`` and the
    #: agent has a writable ``deterministic`` attribute (see the module docstring)
    learned: bool = False
    #: answers free-text envs only (a trained-LLM agent of a free-text method, e.g. ``llm-grpo``)
    free_text: bool = False


EVAL_MODES = ("deterministic", "stochastic", "both")

AGENTS: dict[str, AgentSpec] = {
    s.name: s
    for s in [
        AgentSpec("random", "uniform over admissible actions", lambda env_id: RandomAgent()),
        AgentSpec("expert", "the env's expert/oracle (upper bound)", lambda env_id: ExpertAgent()),
        AgentSpec("ppo", "SB3 PPO (MlpPolicy) on the encoded text env", "echorl_agent.agents.sb3:make_ppo",
                  ("stable_baselines3", "echorl_envs.wrappers"), "sb3", learned=True),
        AgentSpec("maskable-ppo", "sb3-contrib MaskablePPO with admissible-action masks",
                  "echorl_agent.agents.sb3:make_maskable_ppo", ("sb3_contrib", "echorl_envs.wrappers"), "sb3",
                  learned=True),
        AgentSpec("dqn", "SB3 DQN on the encoded text env", "echorl_agent.agents.sb3:make_dqn",
                  ("stable_baselines3", "echorl_envs.wrappers"), "sb3", learned=True),
        AgentSpec("echoppo", "EchoPPO with EchoPolicy (latent planning)", "echorl_agent.agents.sb3:make_echoppo",
                  ("echorl_agent.algorithms", "echorl_envs.wrappers"), "sb3",
                  learned=True),
        AgentSpec("react", "generative ReAct LLM agent (SmolLM2 by default)", "echorl_agent.agents.llm:make_react",
                  ("transformers", "echorl_agent.agents.chat"), "llm"),
        AgentSpec("llm-score", "LLM scoring of admissible actions (shared-prefix KV)",
                  "echorl_agent.agents.llm:make_scoring", ("transformers", "echorl_agent.agents.chat"), "llm"),
        AgentSpec("tot", "tree-of-thought BFS with the LLM (Game24/math)", "echorl_agent.agents.llm:make_tot",
                  ("transformers", "echorl_agent.agents.chat"), "llm"),
        AgentSpec("echorl", "LLM + latent plan + KV-aware engine + experience", "echorl_agent.agents.llm:make_echorl",
                  ("transformers", "echorl_agent.agents.chat"), "llm"),
    ]
}


def _add_llm_rl_agents() -> None:
    """Add the trained-LLM agents (``llm-frozen`` and one per registered LLM-RL method with an agent name, from
    :func:`echorl_agent.agents.llm_rl.agent_entries`) that :data:`AGENTS` lacks: a method registered after import
    gets its agent too."""
    try:
        from echorl_agent.agents.llm_rl import agent_entries

        entries = agent_entries()
    except ImportError:  # pragma: no cover - the LLM-RL part is not installed: its agents are not listed
        return
    for e in entries:
        if e["name"] not in AGENTS:
            AGENTS[e["name"]] = AgentSpec(e["name"], e["description"], e["factory"], e["requires"], e["kind"],
                                          learned=True, free_text=e["free_text"])


_add_llm_rl_agents()


def agent_names() -> list[str]:
    _add_llm_rl_agents()
    return list(AGENTS)


def eval_modes(name: str, eval_mode: str) -> list[str]:
    """The evaluation modes agent ``name`` is run in: ``["-"]`` for agents that are not learned, else
    ``["deterministic"]``, ``["stochastic"]`` or both (``eval_mode="both"``)."""
    if eval_mode not in EVAL_MODES:
        raise ValueError(f"eval_mode must be one of {EVAL_MODES}, got eval_mode={eval_mode!r}")
    if not spec(name).learned:
        return ["-"]
    return ["deterministic", "stochastic"] if eval_mode == "both" else [eval_mode]


def base_name(name: str) -> str:
    """The registry name of ``name`` (``"react@gpt-4o"`` -> ``"react"``); an empty label is a ValueError."""
    base, at, label = name.partition("@")
    if at and not label:
        raise ValueError(f"agent labels look like NAME@LABEL with a non-empty LABEL, got {name!r}")
    return base


def spec(name: str) -> AgentSpec:
    """The spec of ``name`` (or of ``NAME@LABEL``); unknown names raise ``ValueError`` with a close match."""
    name = base_name(name)
    if name not in AGENTS:
        _add_llm_rl_agents()
    if name not in AGENTS:
        hint = difflib.get_close_matches(name, list(AGENTS), n=2, cutoff=0.4)
        raise ValueError(
            f"unknown agent {name!r}" + (f"; did you mean {' or '.join(map(repr, hint))}?" if hint else "")
            + f" (available names: {', '.join(AGENTS)})"
        )
    return AGENTS[name]


def _resolve(factory: str | Callable[..., Agent]) -> Callable[..., Agent]:
    if callable(factory):
        return factory
    mod, _, attr = factory.partition(":")
    return getattr(importlib.import_module(mod), attr)


def availability(name: str) -> str | None:
    """``None`` if the agent can run here, else the reason it cannot."""
    s = spec(name)
    for m in s.requires:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any import failure makes the agent unavailable
            return f"needs {m} ({type(e).__name__}: {e})"
    try:
        _resolve(s.factory)
    except Exception as e:  # noqa: BLE001
        return f"not built yet ({type(e).__name__}: {e})"
    return None


def incompatibility(name: str, env_id: str) -> str | None:
    """Why agent ``name`` cannot play ``env_id`` at all (e.g. SB3 agents need admissible actions), or None."""
    import echorl_envs

    s, e = spec(name), echorl_envs.entry(env_id)
    name = base_name(name)
    if s.free_text:
        return f"{name} answers free-text envs; use llm-ppo for choice envs" if e.action_type == "choice" else None
    if s.kind == "sb3" and e.action_type != "choice":
        return f"{name} picks among admissible actions; {env_id} takes free text"
    if name in ("llm-score", "llm-frozen") and e.action_type != "choice":
        return f"{name} ranks admissible actions; {env_id} takes free text"
    if name == "tot" and e.family != "math":
        return "tot searches over math answers (Game24/GSM8K-style tasks)"
    return None


def make_agent(name: str, env_id: str, **options: Any) -> Agent:
    """Build agent ``name`` for ``env_id``; raises ``ValueError`` if it is unavailable here."""
    reason = availability(name)
    if reason is not None:
        raise ValueError(f"agent {name!r} is unavailable: {reason}")
    s = spec(name)
    return _resolve(s.factory)(env_id, **{**s.options, **options})
