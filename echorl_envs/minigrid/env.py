"""``MiniGridTextEnv``: any MiniGrid/BabyAI environment of the real ``minigrid`` package, played in words."""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
from typing import Any, ClassVar

import gymnasium as gym
import minigrid  # noqa: F401  (registers MiniGrid-*/BabyAI-* ids with gymnasium)
from minigrid.core.actions import Actions
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel

from echorl_envs.core import MAX_TEXT, TextEnv, Transition
from echorl_envs.minigrid.describe import describe_view, with_article
from echorl_envs.minigrid.planner import BabyAIExpert, GoalPlanner, ViewPlanner

__all__ = ["MiniGridTextEnv", "ACTION_WORDS"]

logger = logging.getLogger(__name__)

#: Admissible actions, index = minigrid ``Actions`` value (left, right, forward, pickup, drop, toggle, done).
ACTION_WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
_WORD_TO_ACTION = {w: i for i, w in enumerate(ACTION_WORDS)}
_ALIASES: dict[str, tuple[str, ...]] = {
    "turn left": ("left", "rotate left"),
    "turn right": ("right", "rotate right"),
    "go forward": ("forward", "move forward", "go ahead", "move ahead"),
    "pick up": ("pickup", "pick"),
    "drop": ("put down",),
    "toggle": ("open", "unlock", "use"),
    "done": ("finish",),
}


def _noun(obj: Any) -> str | None:
    """``WorldObj`` -> ``"a red key"`` (``None`` for an empty cell)."""
    if obj is None:
        return None
    if obj.type == "door":
        state = "open" if obj.is_open else ("locked" if obj.is_locked else "closed")
        return with_article(f"{state} {obj.color} door")
    if obj.type in ("wall", "lava"):
        return "a wall" if obj.type == "wall" else "lava"
    if obj.type == "goal":
        return with_article(f"{obj.color} goal square")
    return with_article(f"{obj.color} {obj.type}")


class MiniGridTextEnv(TextEnv):
    """A MiniGrid or BabyAI level of the real ``minigrid`` package with text observations and word actions.

    Description:
        The wrapped engine is ``gymnasium.make(env_id).unwrapped`` from ``minigrid`` (grid generation,
        dynamics, rewards and missions are minigrid's own). Each step applies exactly one minigrid action,
        so the same seed and action sequence give the same trajectory and rewards as the raw env.

    Observation:
        Text: the mission; the compass heading and carried object; every visible door (open/closed/
        locked), key, ball, box, goal square and lava of the agent's 7x7 egocentric view with its relative
        position ("a red key 2 steps ahead and 1 to the left"), nearest first; then what lies straight
        ahead, to the left and to the right ("Ahead: 2 steps free, then a wall."). After a step, a first
        line says what the action did ("You picked up a yellow key.", "You cannot move forward: a wall is
        in the way.").

    Actions:
        ``turn left``, ``turn right``, ``go forward``, ``pick up``, ``drop``, ``toggle``, ``done`` (minigrid's
        ``Actions`` 0..6; always all admissible; aliases such as ``forward``, ``left``, ``pickup``, ``open``).

    Rewards:
        minigrid's sparse reward: ``1 - 0.9 * step_count / max_steps`` on success, else 0.

    Termination:
        As minigrid: terminated on reaching the goal / completing the BabyAI instruction (or stepping into
        lava, failing an instruction); truncated after the level's ``max_steps``, which is also the
        registered ``max_episode_steps``.

    Info keys (besides the protocol's):
        ``mission`` (str), ``direction`` (int, minigrid ``agent_dir``: 0 east, 1 south, 2 west, 3 north),
        ``agent_pos`` (tuple[int, int], absolute grid cell), ``carrying`` (str | None, e.g. ``"a red key"``),
        ``expert_action`` (when ``expert=True`` and the expert has a move: minigrid's ``BabyAIBot`` on BabyAI
        levels, a BFS planner over the true grid on goal-square levels).

    Registered ids:
        ``EchoRL/MiniGrid-Empty-5x5-v0``, ``EchoRL/MiniGrid-DoorKey-5x5-v0``, ``EchoRL/MiniGrid-FourRooms-v0``,
        ``EchoRL/MiniGrid-MultiRoom-N2-S4-v0``, ``EchoRL/BabyAI-GoToLocal-v0``, ``EchoRL/BabyAI-PickupLoc-v0``,
        ``EchoRL/BabyAI-OpenDoor-v0``, ``EchoRL/BabyAI-BossLevel-v0``.

    Args:
        env_id: a minigrid-registered id (``"MiniGrid-DoorKey-5x5-v0"``, ``"BabyAI-GoToLocal-v0"``...).
        expert: compute ``info["expert_action"]`` every step (the BabyAI bot costs ~ms per step).
        env_kwargs: extra keyword arguments for ``gymnasium.make(env_id, ...)``.
        render_mode: ``None`` or ``"ansi"`` (returns the last observation).
        max_text_length: maximum observation/action length.
        goal_line: add a line naming where the mission's object is (``Target: the blue key, 2 steps ahead and
            3 to the left.`` or ``Target: the blue key is not in view.``), for BabyAI levels whose mission names
            one object (go to / pick up / open). Off by default: the plain observation leaves finding the object
            to the agent.
        expert_kind: who gives ``info["expert_action"]`` on BabyAI levels: ``"bot"`` (minigrid's ``BabyAIBot``,
            which acts on its memory of the room) or ``"view"`` (:class:`~echorl_envs.minigrid.planner.ViewPlanner`:
            a shortest path planned on the current view alone, picking up an object in its way, so a policy that
            sees only the current observation can imitate it; missions naming one object).
    """

    reset_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        env_id: str = "MiniGrid-Empty-5x5-v0",
        expert: bool = True,
        env_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
        max_text_length: int = MAX_TEXT,
        goal_line: bool = False,
        expert_kind: str = "bot",
    ) -> None:
        super().__init__(render_mode=render_mode, max_text_length=max_text_length)
        known = [k for k in gym.registry if k.startswith(("MiniGrid-", "BabyAI-"))]
        if env_id not in known:
            hint = difflib.get_close_matches(env_id, known, n=2, cutoff=0.5)
            raise ValueError(
                f"env_id must be a minigrid id such as 'MiniGrid-DoorKey-5x5-v0', got env_id={env_id!r}"
                + (f"; did you mean {' or '.join(map(repr, hint))}?" if hint else "")
            )
        self.env_id = env_id
        self.expert = bool(expert)
        self.env_kwargs = dict(env_kwargs or {})
        self.raw = gym.make(env_id, disable_env_checker=True, **self.env_kwargs).unwrapped
        # BabyAI levels (RoomGridLevel subclasses) carry verifiable instructions the bot can parse.
        self._is_babyai = isinstance(self.raw, RoomGridLevel)
        self.goal_line = bool(goal_line)
        if expert_kind not in ("bot", "view"):
            raise ValueError(f"expert_kind must be 'bot' or 'view', got expert_kind={expert_kind!r}")
        if expert_kind == "view" and not self._is_babyai:
            raise ValueError(f"expert_kind='view' needs a BabyAI level whose mission names one object, got "
                             f"env_id={env_id!r}")
        self.expert_kind = expert_kind
        if self.goal_line and not self._is_babyai:
            raise ValueError(f"goal_line=True needs a BabyAI level whose mission names one object, got env_id={env_id!r}")
        self._target: tuple[str | None, str | None] | None = None
        self._raw_seeded = False
        self._pending_seed: int | None = None
        self._expert_impl: GoalPlanner | BabyAIExpert | ViewPlanner | None = None
        self._image: Any = None

    # ----------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Reset; ``seed`` seeds minigrid exactly as ``raw_env.reset(seed=seed)`` would."""
        self._pending_seed = seed
        return super().reset(seed=seed, options=options)

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        seed = self._pending_seed
        if seed is None and not self._raw_seeded:
            seed = int(self.np_random.integers(2**31 - 1))
        # BabyAI level generation print()s its rejected samples; keep them out of the agent's stdout.
        with contextlib.redirect_stdout(io.StringIO()) as chatter:
            obs, _ = self.raw.reset(seed=seed)
        if chatter.getvalue():
            logger.debug("minigrid reset output: %s", chatter.getvalue().strip())
        self._raw_seeded = True
        self._image = obs["image"]
        self._expert_impl = None
        if self.goal_line:
            desc = getattr(self.raw.instrs, "desc", None)
            if desc is None:
                raise ValueError(f"goal_line=True needs a mission naming one object (go to / pick up / open), got "
                                 f"env_id={self.env_id!r} with mission {self.raw.mission!r}")
            self._target = (desc.type, desc.color)
        if self.expert:
            if not self._is_babyai:
                self._expert_impl = GoalPlanner(self.raw)
            elif self.expert_kind == "view":
                self._expert_impl = ViewPlanner(self.raw)
            else:
                self._expert_impl = BabyAIExpert(self.raw)
        return Transition(self._describe())

    def _apply(self, action: str) -> Transition:
        raw = self.raw
        act = _WORD_TO_ACTION[action]
        pos_before = tuple(int(v) for v in raw.agent_pos)
        held_before = raw.carrying
        front_before = raw.grid.get(*raw.front_pos)
        front_noun = _noun(front_before)
        obs, reward, terminated, truncated, _ = raw.step(act)
        self._image = obs["image"]
        if self._expert_impl is not None and not (terminated or truncated):
            changed = act in (Actions.pickup, Actions.drop, Actions.toggle) and (
                raw.carrying is not held_before or _noun(raw.grid.get(*raw.front_pos)) != front_noun
            )
            self._expert_impl.observe(act, grid_changed=changed)
        won = bool(terminated and reward > 0)
        lines = [self._feedback(act, pos_before, held_before, front_before, front_noun)]
        if won:
            lines.append(f"Mission complete! Reward {float(reward):.3f}.")
        elif terminated:
            lines.append("The episode is over: the mission failed.")
        elif truncated:
            lines.append(f"Time is up: the step limit of {raw.max_steps} is reached.")
        lines.append(self._describe())
        return Transition("\n".join(lines), float(reward), bool(terminated), bool(truncated), won)

    def _admissible(self) -> list[str]:
        return list(ACTION_WORDS)

    def _aliases(self, normalized_action: str) -> tuple[str, ...]:
        return _ALIASES.get(normalized_action, ())

    def _task(self) -> str:
        return str(self.raw.mission)

    def _expert(self) -> str | None:
        if self._expert_impl is None:
            return None
        a = self._expert_impl.next_action()
        return None if a is None else ACTION_WORDS[a]

    # ----------------------------------------------------------------- helpers
    def _describe(self) -> str:
        return describe_view(
            self._image, int(self.raw.agent_dir), _noun(self.raw.carrying), str(self.raw.mission), self._target
        )

    def _extra_info(self) -> dict[str, Any]:
        """Family info keys, on every step (invalid ones included)."""
        raw = self.raw
        return {
            "mission": str(raw.mission),
            "direction": int(raw.agent_dir),
            "agent_pos": (int(raw.agent_pos[0]), int(raw.agent_pos[1])),
            "carrying": _noun(raw.carrying),
        }

    def _feedback(
        self, act: int, pos_before: tuple, held_before: Any, front_before: Any, front_noun: str | None
    ) -> str:
        """One sentence on what ``act`` did, from the engine state before and after (minigrid semantics)."""
        raw = self.raw
        if act == Actions.left:
            return "You turned left."
        if act == Actions.right:
            return "You turned right."
        if act == Actions.forward:
            if tuple(int(v) for v in raw.agent_pos) != pos_before:
                return "You moved forward."
            return f"You cannot move forward: {front_noun} is in the way."
        if act == Actions.pickup:
            if held_before is None and raw.carrying is not None:
                return f"You picked up {_noun(raw.carrying)}."
            if held_before is not None:
                return f"You cannot pick up anything: you are already carrying {_noun(held_before)}."
            if front_noun is None:
                return "There is nothing in front of you to pick up."
            return f"You cannot pick up {front_noun}."
        if act == Actions.drop:
            if held_before is not None and raw.carrying is None:
                return f"You dropped {_noun(held_before)}."
            if held_before is None:
                return "You are not carrying anything to drop."
            return f"You cannot drop {_noun(held_before)} here: {front_noun} is in front of you."
        if act == Actions.toggle:
            front_after = raw.grid.get(*raw.front_pos)
            if front_before is not None and front_before.type == "door":
                if front_noun != _noun(front_after):
                    verb = (
                        "closed"
                        if not front_after.is_open
                        else ("unlocked and opened" if "locked" in front_noun else "opened")
                    )
                    return f"You {verb} the {front_before.color} door."
                if front_before.is_locked:
                    return f"The {front_before.color} door is locked: you need a {front_before.color} key to open it."
            if front_before is not None and front_before.type == "box" and front_after is not front_before:
                inside = _noun(front_after)
                return "You opened the box" + (f": it held {inside}." if inside else "; it was empty.")
            return "Nothing happened."
        return "You declared the mission done."
