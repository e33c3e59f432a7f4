"""The text-environment protocol every echorl environment follows.

Observation and action are ``str``. ``info`` always carries the keys in :data:`INFO_KEYS`; family modules
document their extra keys. An invalid action never raises: the observation explains what went wrong and
what is allowed, ``info["invalid_action"]`` is True, the reward is 0 and the step still counts.

Subclasses implement four hooks:

* ``_reset_episode(options) -> Transition`` -- start an episode (use ``self.np_random`` for randomness);
* ``_apply(action) -> Transition`` -- apply an action already matched to the admissible list (or, for
  free-text envs, the raw text);
* ``_admissible() -> list[str]`` -- admissible actions now (empty for free-text envs);
* ``_task() -> str`` -- the instruction of the current episode;

and may override ``_expert() -> str | None`` (the expert/oracle's next action), ``_aliases`` and
``_match_parametric`` (actions with a free argument, e.g. the text of MiniWoB's ``type``).
"""

from __future__ import annotations

import abc
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from echorl_envs.core.actions import PRINTABLE, describe_text, match_action, to_printable

__all__ = ["TextEnv", "DatasetTextEnv", "Transition", "InvalidAction", "INFO_KEYS", "text_space", "MAX_TEXT"]

#: Keys present in every ``info`` dict.
INFO_KEYS = ("task", "admissible_actions", "won", "invalid_action", "step")

#: Generous maximum length of observations and actions (characters).
MAX_TEXT = 1 << 17


def text_space(max_length: int = MAX_TEXT) -> spaces.Text:
    """A ``Text`` space over printable ASCII (with newline and tab) that accepts the empty string."""
    return spaces.Text(max_length=max_length, min_length=0, charset=frozenset(PRINTABLE))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Transition:
    """What a family hook returns; the base class turns it into gymnasium's 5-tuple."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    won: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class InvalidAction(Exception):
    """Raised by ``_apply`` to reject an action; the base class turns it into feedback (never escapes)."""


class TextEnv(gym.Env[str, str], abc.ABC):
    """Base class of all echorl text environments (see the module docstring for the protocol)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: Options accepted by ``reset(options=...)`` (unknown ones raise ``ValueError`` with a suggestion).
    reset_options: ClassVar[frozenset[str]] = frozenset()
    #: Family keys that report what one step did (a judge's verdict, a reward breakdown): present in every
    #: ``info``, None on the reset and on steps that produced none, so every ``info`` of an id has the same keys.
    step_info_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, render_mode: str | None = None, max_text_length: int = MAX_TEXT) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got render_mode={render_mode!r}"
            )
        self.render_mode = render_mode
        self.observation_space = text_space(max_text_length)
        self.action_space = text_space(max_text_length)
        self._max_text = max_text_length
        self._step_count = 0
        self._done = False
        self._won = False
        self._last_obs = ""
        self._started = False

    # ----------------------------------------------------------------- hooks for families
    @abc.abstractmethod
    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        """Start an episode; ``options`` holds only keys from ``reset_options``."""

    @abc.abstractmethod
    def _apply(self, action: str) -> Transition:
        """Apply an action (already matched to the admissible spelling, or free text)."""

    def _admissible(self) -> list[str]:
        return []

    @abc.abstractmethod
    def _task(self) -> str:
        """The instruction of the current episode."""

    def _expert(self) -> str | None:
        return None

    def _extra_info(self) -> dict[str, Any]:
        """Family keys present in every ``info`` of the episode, invalid steps included (e.g. ``task_id``); with
        :attr:`step_info_keys` and :data:`INFO_KEYS`, every ``info`` of an id carries the same keys, except
        ``expert_action``, which is there only while the episode runs and the env has an expert move."""
        return {}

    def _match_parametric(self, action: str) -> str | None:
        """For actions with a free argument the admissible list can only sample (MiniWoB's ``type <ref>
        "<text>"``): the action's canonical spelling when ``action`` is one such, ``None`` when it is not
        (the usual invalid-action feedback follows); raise ``InvalidAction`` to explain a malformed one.
        Called only for string actions that match no admissible action (default: none are accepted)."""
        return None

    def _aliases(self, normalized_action: str) -> Sequence[str]:
        """Extra normalised spellings that select ``normalized_action`` (default: none)."""
        return ()

    # ----------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._check_options(options)
        unknown = sorted(set(options) - set(self.reset_options))
        if unknown:
            hint = difflib.get_close_matches(unknown[0], sorted(self.reset_options), n=1)
            raise ValueError(
                f"unknown reset option {unknown[0]!r} for {type(self).__name__}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
                + f" (accepted: {sorted(self.reset_options) or 'none'})"
            )
        self._step_count = 0
        self._done = False
        self._won = False
        self._started = True
        tr = self._reset_episode(options)
        self._won = bool(tr.won)
        obs = self._clip(tr.observation)
        self._last_obs = obs
        return obs, self._info(invalid=False, extra=tr.info)

    def _check_options(self, options: object) -> dict[str, Any]:
        """``options`` as a dict, or a ValueError naming the field (``None`` and ``{}`` mean no options)."""
        if options is None:
            return {}
        if not isinstance(options, Mapping):
            raise ValueError(
                f"reset options must be a dict mapping option names to values, got options={options!r:.80} "
                f"({type(options).__name__}); accepted names for {type(self).__name__}: "
                f"{sorted(self.reset_options) or 'none'}"
            )
        bad = [k for k in options if not isinstance(k, str)]
        if bad:
            raise ValueError(
                f"reset option names must be strings, got {bad[0]!r:.80} ({type(bad[0]).__name__}) in "
                f"options; accepted names for {type(self).__name__}: {sorted(self.reset_options) or 'none'}"
            )
        return dict(options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self._started:
            # Gymnasium's contract requires reset() first; be helpful rather than crash deep in an engine.
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        self._step_count += 1
        if self._done:
            return self._invalid("The episode is over; call reset() to start a new one.")
        admissible = self._admissible()
        if admissible:
            m = match_action(action, admissible, self._aliases)
            if m.ok:
                action = m.action
            else:
                try:
                    free = (self._match_parametric(action)
                            if isinstance(action, str) and len(action) <= self._max_text else None)
                except InvalidAction as e:
                    return self._invalid(str(e))
                if free is None:
                    return self._invalid(self._invalid_message(m.reason, admissible))
                action = free
        elif not isinstance(action, str):
            return self._invalid(f"The action must be a string, got {type(action).__name__}.")
        elif len(action) > self._max_text:
            return self._invalid(f"The action is too long ({len(action)} > {self._max_text} characters).")
        elif not _encodable(action):
            return self._invalid("The action holds characters that are not valid text (unpaired surrogates).")
        try:
            tr = self._apply(action)
        except InvalidAction as e:
            return self._invalid(str(e))
        except (RecursionError, MemoryError) as e:  # a parser fed "[[" * 600 or similar: the input's fault
            return self._invalid(f"The action could not be processed ({type(e).__name__}: it is nested too "
                                 "deeply or too large).")
        self._won = self._won or bool(tr.won)
        self._done = bool(tr.terminated or tr.truncated)
        obs = self._clip(tr.observation)
        self._last_obs = obs
        info = self._info(invalid=False, extra=tr.info)
        return obs, float(tr.reward), bool(tr.terminated), bool(tr.truncated), info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    # ----------------------------------------------------------------- helpers
    def _invalid_message(self, reason: str, admissible: Sequence[str]) -> str:
        shown = list(admissible[:40])
        more = f" (and {len(admissible) - 40} more)" if len(admissible) > 40 else ""
        return f"Invalid action: {reason}. Admissible actions: " + ", ".join(shown) + more + "."

    def _invalid(self, message: str) -> tuple[str, float, bool, bool, dict]:
        obs = self._clip(message)
        self._last_obs = obs
        return obs, 0.0, False, False, self._info(invalid=True, extra={})

    def _clip(self, text: str) -> str:
        text = to_printable(text)
        if len(text) > self._max_text:
            text = text[: self._max_text - 20] + "\n[... truncated]"
        return text

    def _info(self, invalid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = self._extra_info() if self._started else {}
        info.update(dict.fromkeys(self.step_info_keys), **extra)
        info["task"] = self._task()
        info["admissible_actions"] = [] if self._done else list(self._admissible())
        info["won"] = self._won
        info["invalid_action"] = invalid
        info["step"] = self._step_count
        if not self._done:
            expert = self._expert()
            if expert is not None:
                info["expert_action"] = expert
        return info

    @staticmethod
    def describe(action: object) -> str:
        """Printable, quoted rendering of an action for feedback (shared by families)."""
        return describe_text(action)


class DatasetTextEnv(TextEnv):
    """A text env over a finite list of items (GSM8K, CRUXEval, ARC, WebShop instructions...).

    ``reset(options={"index": i})`` selects item ``i``; without an index the item is drawn from
    ``self.np_random`` (deterministic given the seed). ``info["task_id"]`` names the item and
    ``num_tasks`` counts them.
    """

    reset_options: ClassVar[frozenset[str]] = frozenset({"index"})

    @property
    @abc.abstractmethod
    def num_tasks(self) -> int:
        """Number of items this env can play."""

    def _select_index(self, options: dict[str, Any]) -> int:
        n = self.num_tasks
        if n <= 0:
            raise ValueError(f"{type(self).__name__} has no tasks to play (num_tasks=0)")
        if "index" in options and options["index"] is not None:
            idx = options["index"]
            if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
                raise ValueError(f"options['index'] must be an int, got index={idx!r}")
            if not 0 <= int(idx) < n:
                raise ValueError(f"options['index'] must be in [0, {n}), got index={idx}")
            return int(idx)
        return int(self.np_random.integers(n))
