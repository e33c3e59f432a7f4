"""alfworld's real TextWorld/PDDL engine, wrapped as alfworld's ``AlfredTWEnv`` does, plus its handcoded expert.

The wrapper stack is the one ``AlfredTWEnv.init_env`` builds: ``textworld.envs.PddlEnv`` (the Fast Downward
backed PDDL simulator) -> ``AlfredDemangler`` (ALFRED ids such as ``Sink_bar_..._bar_SinkBasin`` become
``sinkbasin 1``) -> ``AlfredInfos``. The expert is alfworld's ``HandCodedTWAgent`` driven the way
``AlfredExpert._gather_infos`` drives it, with two fixes:

* alfworld 0.4.2's grammar spells placing as ``move X to Y`` but the expert's state tracker still looks for
  the older ``put X in/on Y`` (ALFWorld issue #78's two spellings): the expert is told the legacy spelling,
  otherwise it never empties its inventory and fails every pick_two_obj_and_place game;
* the expert breaks loops with the global ``random`` module; we seed it per (game, step) and restore the
  caller's random state, so ``info["expert_action"]`` is deterministic.
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path
from typing import Any

__all__ = ["AlfredEngine", "EngineState", "legacy_put"]

log = logging.getLogger(__name__)

_MOVE = re.compile(r"^move (.+) to (.+)$")


def legacy_put(command: str) -> str:
    """``move X to Y`` -> ``put X in/on Y`` (the spelling alfworld's expert tracker understands)."""
    m = _MOVE.match(command)
    return f"put {m.group(1)} in/on {m.group(2)}" if m else command


_TASK_RHS = re.compile(r'"rhs": "Your task is to: (.*?)"')
_LOGIC_CACHE: dict[str, Any] = {}


def _game_logic(domain: str, grammar: str) -> Any:
    """textworld's ``GameLogic`` for a game, parsing the shared grammar only once per process.

    alfworld games differ only in the ``task`` rule of the grammar (``alfworld-generate`` substitutes the goal
    text for ``UNKNOWN GOAL``), and TatSu parsing of the whole grammar costs ~0.5 s per ``load``. We parse the
    grammar once with the placeholder and give each game a copy whose ``task`` rule is parsed from its own
    text, which yields the same production rules as ``GameLogic(domain, grammar)``.
    """
    from textworld.envs.pddl.logic import GameLogic
    from textworld.envs.pddl.textgen import ContextSensitiveGrammar

    m = _TASK_RHS.search(grammar)
    if m is None:
        return GameLogic(domain=domain, grammar=grammar)
    template = grammar[: m.start(1)] + "UNKNOWN GOAL." + grammar[m.end(1) :]
    key = domain + "\0" + template
    base = _LOGIC_CACHE.get(key)
    if base is None:
        base = _LOGIC_CACHE[key] = GameLogic(domain=domain, grammar=template)
    task = ContextSensitiveGrammar.parse(json.dumps({"task": [{"rhs": "Your task is to: " + m.group(1)}]}))
    logic = object.__new__(GameLogic)
    logic.__dict__.update(base.__dict__)
    logic.grammar = ContextSensitiveGrammar()
    logic.grammar._rules.update({k: list(v) for k, v in base.grammar._rules.items()})
    logic.grammar._rules["task"] = list(task._rules["task"])
    return logic


def _pddl_env_class() -> type:
    from textworld.envs import PddlEnv
    from textworld.envs.pddl import logic as pddl_logic

    class CachedLogicPddlEnv(PddlEnv):
        """``PddlEnv`` whose ``load`` reuses the parsed grammar (see :func:`_game_logic`); otherwise identical."""

        def load(self, filename_or_data: Any) -> None:
            with open(filename_or_data) as f:
                data = json.load(f)
            self._game_file = filename_or_data
            self._game_data = data
            self.walkthrough = data.get("walkthrough", None)
            self._logic = _game_logic(data["pddl_domain"], data["grammar"])
            self._pddl_state = pddl_logic.PddlState(self.downward_lib, data["pddl_problem"], self._logic)
            self._entity_infos = self._get_entity_infos()

    return CachedLogicPddlEnv


class EngineState(dict):
    """A plain-dict copy of the fields we read from textworld's ``GameState``."""


class AlfredEngine:
    """One alfworld PDDL game: ``load(path)``, ``reset()``, ``step(command)``; expert plan on every state.

    Args:
        expert: compute alfworld's handcoded expert action on every state (costs ~the same as a step).
    """

    def __init__(self, expert: bool = True) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        PddlEnv = _pddl_env_class()

        self.expert_enabled = expert
        infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=expert, extras=["gamefile"])
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self._expert: Any = None
        self._gamefile: str | None = None
        self._prev_command = ""
        self._step = 0
        self.state: Any = None

    # ------------------------------------------------------------------ engine
    def load(self, gamefile: str | Path) -> None:
        self._gamefile = str(gamefile)
        self._env.load(self._gamefile)

    def reset(self) -> EngineState:
        if self._gamefile is None:
            raise RuntimeError("AlfredEngine.reset() called before load()")
        self.state = self._env.reset()
        self._prev_command = ""
        self._step = 0
        if self.expert_enabled:
            from alfworld.agents.expert import HandCodedTWAgent

            self._expert = HandCodedTWAgent(max_steps=200)
            self._expert.reset(self._gamefile)
        return self._export()

    def step(self, command: str) -> EngineState:
        self.state, _score, _done = self._env.step(command)
        self._prev_command = command
        self._step += 1
        return self._export()

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()
        self.state = None

    # ------------------------------------------------------------------ expert
    def _expert_action(self) -> str:
        """alfworld's ``AlfredExpert._gather_infos``: the expert's action, or ``look`` if not admissible."""
        from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

        saved = random.getstate()
        random.seed(f"{self._gamefile}:{self._step}")
        try:
            if not self._prev_command:
                self._expert.observe(self.state["feedback"])
                return "look"
            action = self._expert.act(self.state, 0, self.state["won"], legacy_put(self._prev_command))
        except (HandCodedAgentTimeout, HandCodedAgentFailed, IndexError, KeyError) as e:
            log.debug("alfworld expert gave up on %s: %r", self._gamefile, e)
            return "look"
        finally:
            random.setstate(saved)
        return action if action in self.state["admissible_commands"] else "look"

    def _export(self) -> EngineState:
        st = self.state
        out = EngineState(
            feedback=str(st["feedback"]),
            admissible_commands=list(st["admissible_commands"]),
            won=bool(st["won"]),
        )
        if self.expert_enabled and not out["won"]:
            out["expert_action"] = self._expert_action()
        return out
