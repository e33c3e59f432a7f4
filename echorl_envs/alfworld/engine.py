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
        from textworld.envs import PddlEnv

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
