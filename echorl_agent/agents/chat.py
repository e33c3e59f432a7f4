"""Frozen LLM agents for echorl text envs, built on :class:`~echorl_agent.llm.engine.LLMEngine`.

* :class:`ReActAgent` -- generative: the model writes ``Thought: ...`` then ``Action: ...``; the action is matched
  to the admissible list with :func:`echorl_envs.core.match_action` (fuzzy fallback with rapidfuzz). On a
  free-text env (no admissible list) the action line is the answer itself.
* :class:`ScoringAgent` -- pi(a|s) proportional to exp(log-likelihood of each admissible action / temperature);
  all candidates share the prompt's KV (one prefix, N short suffixes, one batched forward).
* :class:`ChatReActAgent` -- the ReAct agent over any OpenAI-compatible chat endpoint.

All follow the :class:`~echorl_agent.agents.Agent` protocol (the bench runner drives them directly) and count every
LLM request in a :class:`~echorl_agent.llm.engine.usage.TokenMeter` (``stats()``: prompt / cached / generated tokens,
effective bandwidth, eta_bw). The local ones keep the dialogue as an append-only list of token ids (the chat
template's turn markers are encoded once and appended, never re-rendered), so turn t+1's prompt starts with exactly
turn t's prompt + answer and the prefix cache serves all of it (EchoRL KV_frozen; generated tokens included).

Per episode: ``agent.reset(env_id, obs, info, seed)``, then repeat ``a = agent.act(obs, info)``,
``obs, r, term, trunc, info = env.step(a)``, ``agent.observe(a, obs, r, term or trunc, info)``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from echorl_agent.agents.base import Agent
from echorl_agent.llm import LLMEngine, SamplingParams
from echorl_agent.llm.engine.usage import TokenMeter
from echorl_envs.core import match_action

__all__ = ["ReActAgent", "ScoringAgent", "ChatReActAgent", "MeteredAgent", "AgentStep", "parse_react", "is_free_text",
           "FREE_TEXT_SYSTEM"]

REACT_SYSTEM = (
    "You are an agent in a text game. Each turn, read the observation and reply with exactly two lines:\n"
    "Thought: <one short sentence of reasoning>\n"
    "Action: <one action copied from the list of admissible actions>\n"
    "Example reply:\n"
    "Thought: The key is ahead of me, so I should move towards it.\n"
    "Action: go forward"
)
SCORING_SYSTEM = "You are an agent in a text game. Reply with the single best action from the admissible actions."
#: the ReAct system prompt on free-text envs (math, CRUXEval, ARC): the action line is the answer
FREE_TEXT_SYSTEM = (
    "You are solving a problem. Reply with exactly two lines:\n"
    "Thought: <one short sentence of reasoning>\n"
    "Action: <your final answer only, in the form the problem asks for>"
)

_ACTION_RE = re.compile(r"action\s*:\s*(.+)", re.IGNORECASE)
_THOUGHT_RE = re.compile(r"thought\s*:\s*(.+)", re.IGNORECASE)


def parse_react(text: str) -> tuple[str, str]:
    """Split a ReAct reply into ``(thought, action)``; without an ``Action:`` line the last non-empty line is the
    action."""
    m = _ACTION_RE.search(text)
    thought_m = _THOUGHT_RE.search(text)
    if thought_m:
        thought = thought_m.group(1).strip()
    else:  # the reply was primed with "Thought:", so the thought is everything before the action line
        thought = text[: m.start()].strip() if m else text.strip()
    if m:
        action = m.group(1).strip().splitlines()[0].strip()
    else:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        action = lines[-1] if lines else ""
    return thought, action


def _user_turn(obs: str, info: dict[str, Any]) -> str:
    adm = info.get("admissible_actions") or []
    text = obs.strip()
    if adm:
        text += "\nAdmissible actions: " + ", ".join(adm)
    return text


@dataclass
class AgentStep:
    """What the agent did on its last turn."""

    action: str
    text: str = ""
    thought: str = ""
    matched: bool = False
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    distribution: dict[str, float] = field(default_factory=dict)


def _require_act(last: AgentStep | None) -> None:
    if last is None:
        raise ValueError("observe() before act(): call reset(env_id, obs, info, seed) then act(obs, info) first")


def is_free_text(info: dict[str, Any]) -> bool:
    """True when ``info`` offers no admissible actions (math, CRUXEval, ARC: the action is the answer)."""
    return not info.get("admissible_actions")


class MeteredAgent(Agent):
    """An agent that counts its LLM requests in a :class:`TokenMeter` (its own unless one is passed in).

    An agent that shares another agent's meter (``meter=``, e.g. the ``echorl`` agent's inner chat agent) only adds
    its requests; the owner opens episodes and books rewards, so the two are counted as one agent.
    """

    def __init__(self, meter: TokenMeter | None = None, bandwidth_scale: float = 1e-6) -> None:
        self._owns_meter = meter is None
        self.meter = TokenMeter(bandwidth_scale) if meter is None else meter
        self.turns = 0

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        if self._owns_meter:
            self.meter.start_episode()
        self.turns = 0

    def observe(self, action: str, obs: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        if self._owns_meter:
            self.meter.reward(reward, done)
        if not done:
            self._next_turn(obs, info)

    def _next_turn(self, obs: str, info: dict[str, Any]) -> None:
        """Show the agent the observation of a step that did not end the episode (agents with a dialogue)."""

    def stats(self) -> dict[str, float]:
        return self.meter.stats()

    def _charge(self, step: AgentStep) -> None:
        self.meter.add(step.num_cached_tokens, step.num_computed_tokens, step.num_generated_tokens)
        self.turns += 1


class _ChatAgent(MeteredAgent):
    """Append-only chat history in token ids (ChatML-style turn markers from the model's chat template).

    Args:
        engine: the shared engine.
        system_prompt: the system turn (None: the class default).
        seed: seed of the agent's sampling; None takes each episode's ``reset`` seed.
        meter: count requests in this meter (another agent's) instead of an own one.
        bandwidth_scale: ``scale`` of the own meter's bandwidth ``b(s_{1:t})``.
    """

    system_prompt = REACT_SYSTEM
    #: text the assistant turn starts with (part of the prompt), e.g. "Thought:" to steer the ReAct format
    response_prefix = ""

    def __init__(self, engine: LLMEngine, system_prompt: str | None = None, seed: int | None = None,
                 meter: TokenMeter | None = None, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(meter, bandwidth_scale)
        self.engine = engine
        self.llm = engine.llm
        self._custom_system = system_prompt is not None
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.seed = seed
        self.tokens: list[int] = []
        self.last: AgentStep | None = None
        self._reply_ids: list[int] = []
        # split the template's rendering of a user turn into "before content" and "after content"
        marker, sys_marker = "\x00CONTENT\x00", "\x00SYSTEM\x00"
        rendered = self.llm.tokenizer.apply_chat_template(
            [{"role": "system", "content": sys_marker}, {"role": "user", "content": marker}],
            tokenize=False,
            add_generation_prompt=True,
        )
        head, after_sys = rendered.split(sys_marker, 1)
        self._sys_head = head
        self._sys_tail_user_head, self._user_tail = after_sys.split(marker)
        self._user_tail += self.response_prefix
        eos = self.llm.eos_token_ids
        self._turn_end = self.llm.decode([eos[0]], skip_special_tokens=False) if eos else ""

    def _system_for(self, info: dict[str, Any]) -> str:
        """The system turn of an episode starting with ``info``."""
        return self.system_prompt

    def _reseed(self, seed: int) -> None:
        """Seed the sampling for an episode (only called when the agent was built with ``seed=None``)."""

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        """Start a new dialogue with the system prompt and the first observation."""
        super().reset(env_id, obs, info, seed)
        if self.seed is None:
            self._reseed(seed)
        text = (self._sys_head + self._system_for(info) + self._sys_tail_user_head + _user_turn(obs, info)
                + self._user_tail)
        self.tokens = self.llm.encode(text)
        self.last = None

    def _append_reply_and_observation(self, reply_ids: list[int], obs: str, info: dict[str, Any]) -> None:
        self.tokens.extend(reply_ids)
        eos = set(self.llm.eos_token_ids)
        closing = "" if reply_ids and reply_ids[-1] in eos else self._turn_end
        # the template's text between an assistant turn's end token and the next user content
        between = self._sys_tail_user_head.split(self._turn_end, 1)[-1] if self._turn_end else ""
        self.tokens.extend(self.llm.encode(closing + between + _user_turn(obs, info) + self._user_tail))

    def _next_turn(self, obs: str, info: dict[str, Any]) -> None:
        """Append the reply of the last turn and the new observation."""
        _require_act(self.last)
        self._append_reply_and_observation(self._reply_ids, obs, info)

    @staticmethod
    def _match(action: str, admissible: list[str]) -> tuple[str, bool]:
        if not admissible:
            return action, False
        m = match_action(action, admissible)
        if m.ok:
            return m.action, True
        from rapidfuzz import fuzz, process

        best = process.extractOne(action, admissible, scorer=fuzz.WRatio, score_cutoff=80)
        if best is not None:
            return best[0], True
        return action, False


class ReActAgent(_ChatAgent):
    """Generative ReAct agent (thought + action), batched with other actors through the shared engine.

    Without a ``system_prompt`` the system turn is :data:`REACT_SYSTEM` on choice envs and :data:`FREE_TEXT_SYSTEM`
    when the episode's first ``info`` has no admissible actions (free text: the action line is taken as is).

    Args:
        engine: the shared engine (start it for concurrent actors).
        max_tokens: generation budget per turn.
        temperature: 0 = greedy.
        seed: sampling seed; None takes each episode's ``reset`` seed.
        priority: this actor's scheduler priority r_i (EchoRL Eq. 5).
        system_prompt: a fixed system turn for every episode.
        meter, bandwidth_scale: see :class:`_ChatAgent`.
    """

    name = "react"
    system_prompt = REACT_SYSTEM
    response_prefix = "Thought:"

    def __init__(
        self,
        engine: LLMEngine,
        max_tokens: int = 48,
        temperature: float = 0.0,
        seed: int | None = None,
        priority: float = 1.0,
        system_prompt: str | None = None,
        meter: TokenMeter | None = None,
        bandwidth_scale: float = 1e-6,
    ) -> None:
        super().__init__(engine, system_prompt, seed, meter, bandwidth_scale)
        # stop after the action line: "\n" once an "Action:" line has started is handled by parse_react; a blank
        # line or a new observation header ends the reply early
        self.params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed, stop=("\n\n", "Observation:", "\nAdmissible", "\nThought:")
        )
        self.priority = priority

    def _system_for(self, info: dict[str, Any]) -> str:
        return FREE_TEXT_SYSTEM if is_free_text(info) and not self._custom_system else self.system_prompt

    def _reseed(self, seed: int) -> None:
        self.params = dataclasses.replace(self.params, seed=seed)

    def act(self, obs: str, info: dict[str, Any]) -> str:
        """Generate a thought and an action for the current prompt (``obs`` is already in it: ``reset`` and
        ``observe`` append each observation); returns the (matched) action."""
        res = self.engine.wait(self.engine.submit(self.tokens, self.params, self.priority))
        self._reply_ids = list(res.token_ids)
        thought, raw = parse_react(res.text)
        action, ok = self._match(raw, list(info.get("admissible_actions") or []))
        self.last = AgentStep(action, res.text, thought, ok, res.num_cached_tokens, res.num_computed_tokens,
                              len(res.token_ids))
        self._charge(self.last)
        return action


class ScoringAgent(_ChatAgent):
    """pi(a|s) proportional to exp(log-likelihood(a | prompt) / temperature) over the admissible actions.

    Each candidate is scored as the full assistant reply ``action<end-of-turn>``, so a prefix of a longer action
    ("go" vs "go forward") is not favoured. All candidates share the prompt's KV.

    Args:
        engine: the shared engine.
        temperature: softmax temperature of pi; 0 = argmax.
        seed: seed of the action sampler (seeded once, at construction); None reseeds it with each episode's
            ``reset`` seed.
        system_prompt: the system turn (default :data:`SCORING_SYSTEM`).
        meter, bandwidth_scale: see :class:`_ChatAgent`.
    """

    name = "llm-score"
    system_prompt = SCORING_SYSTEM

    def __init__(self, engine: LLMEngine, temperature: float = 1.0, seed: int | None = None,
                 system_prompt: str | None = None, meter: TokenMeter | None = None,
                 bandwidth_scale: float = 1e-6) -> None:
        super().__init__(engine, system_prompt, seed, meter, bandwidth_scale)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got temperature={temperature}")
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)

    def _reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def policy(self, admissible: list[str]) -> tuple[np.ndarray, Any]:
        """pi over ``admissible`` at the current prompt, and the engine's ScoreResult."""
        if not admissible:
            raise ValueError("ScoringAgent needs info['admissible_actions'] (a choice env), got an empty list")
        eos = self.llm.eos_token_ids[:1]
        cands = [self.llm.encode(a) + eos for a in admissible]
        res = self.engine.score(self.tokens, cands)
        ll = np.asarray(res.logprobs, dtype=np.float64)
        if self.temperature == 0:
            probs = (ll == ll.max()).astype(np.float64)
        else:
            z = ll / self.temperature
            probs = np.exp(z - z.max())
        return probs / probs.sum(), res

    def act(self, obs: str, info: dict[str, Any]) -> str:
        """Pick among ``info["admissible_actions"]`` by pi (``obs`` is already in the dialogue)."""
        admissible = list(info.get("admissible_actions") or [])
        probs, res = self.policy(admissible)
        i = int(np.argmax(probs)) if self.temperature == 0 else int(self.rng.choice(len(admissible), p=probs))
        action = admissible[i]
        self._reply_ids = self.llm.encode(action) + self.llm.eos_token_ids[:1]
        self.last = AgentStep(
            action, action, "", True, res.num_cached_tokens, res.num_computed_tokens, 0,
            dict(zip(admissible, probs.tolist(), strict=True)),
        )
        self._charge(self.last)
        return action


class ChatReActAgent(MeteredAgent):
    """The ReAct agent over any OpenAI-compatible chat endpoint (vLLM, SGLang, hosted APIs, ``echorl serve``).

    The dialogue is a list of messages (append-only), so servers with prefix caching reuse earlier turns; the
    reply's thought/action are parsed and matched exactly as in :class:`ReActAgent`.

    Args:
        backend: an :class:`~echorl_agent.llm.serving.openai_backend.OpenAICompatibleBackend`.
        max_tokens: generation budget per turn.
        temperature: sampling temperature (0 = greedy where the server supports it).
        system_prompt: a fixed system turn; None = :data:`REACT_SYSTEM` on choice envs and :data:`FREE_TEXT_SYSTEM`
            when the episode's first ``info`` has no admissible actions (as :class:`ReActAgent`).
        bandwidth_scale: ``scale`` of the meter's bandwidth ``b(s_{1:t})``.
    """

    name = "chat-react"

    def __init__(self, backend: Any, max_tokens: int = 48, temperature: float = 0.0,
                 system_prompt: str | None = None, bandwidth_scale: float = 1e-6) -> None:
        super().__init__(None, bandwidth_scale)
        self.backend = backend
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._custom_system = system_prompt is not None
        self.system_prompt = REACT_SYSTEM if system_prompt is None else system_prompt
        self.messages: list[dict[str, str]] = []
        self.last: AgentStep | None = None

    def reset(self, env_id: str, obs: str, info: dict[str, Any], seed: int) -> None:
        super().reset(env_id, obs, info, seed)
        system = FREE_TEXT_SYSTEM if is_free_text(info) and not self._custom_system else self.system_prompt
        self.messages = [{"role": "system", "content": system},
                         {"role": "user", "content": _user_turn(obs, info)}]
        self.last = None

    def act(self, obs: str, info: dict[str, Any]) -> str:
        c = self.backend.chat(self.messages, max_tokens=self.max_tokens, temperature=self.temperature,
                              stop=["\n\n", "Observation:", "\nAdmissible"])
        self.messages.append({"role": "assistant", "content": c.text})
        thought, raw = parse_react(c.text)
        action, ok = _ChatAgent._match(raw, list(info.get("admissible_actions") or []))
        self.last = AgentStep(action, c.text, thought, ok, c.cached_tokens, max(c.prompt_tokens - c.cached_tokens, 0),
                              c.completion_tokens)
        self._charge(self.last)
        return action

    def _next_turn(self, obs: str, info: dict[str, Any]) -> None:
        _require_act(self.last)
        self.messages.append({"role": "user", "content": _user_turn(obs, info)})
