"""MiniWoB++ tasks in a real headless Chromium, behind echorl's text protocol."""

from __future__ import annotations

import difflib
import functools
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from echorl_envs.core import InvalidAction, TextEnv, Transition
from echorl_envs.miniwob.browser import MiniWoBBrowser
from echorl_envs.miniwob.experts import expert_action
from echorl_envs.miniwob.page import KEYS, CommandError, Element, admissible, flatten, parse_command, render

__all__ = ["MiniWoBEnv", "miniwob_tasks"]

_OPTIONS_JS = (
    "return arguments[0].map(function (r) { var el = core.previousDOMInfo[r];"
    " return Array.from(el.options).map(function (o) { return [o.text, o.selected]; }); });"
)


@functools.lru_cache(maxsize=1)
def miniwob_tasks() -> tuple[str, ...]:
    """Names of the MiniWoB++ tasks shipped in the installed ``miniwob`` wheel (empty when not installed)."""
    try:
        import miniwob
    except ImportError:
        return ()
    html = Path(miniwob.__file__).parent / "html" / "miniwob"
    return tuple(sorted(p.stem for p in html.glob("*.html")))


class MiniWoBEnv(TextEnv):
    """One MiniWoB++ task (Liu et al., 2018; Farama's ``miniwob`` 1.1.0) in a real headless Chromium.

    **Description.** The task page, its random instance generator (seeded through MiniWoB's
    ``Math.seedrandom``) and its reward function are MiniWoB's own; Selenium drives Chromium exactly as
    ``miniwob.MiniWoBEnvironment`` does (that env runs underneath). One browser per env instance, started at
    the first ``reset`` and closed by ``close()`` or at interpreter exit; a crashed browser is restarted on the
    next ``reset`` with a ``RuntimeWarning``.

    **Observation.** ``Task: <utterance>`` then one line per visible element (see
    :mod:`echorl_envs.miniwob.page`): ``[ref] tag #id .classes "text" value="..." (focused)``.

    **Actions.** ``click <ref>``, ``type <ref> "<text>"`` (MiniWoB's focus-element-and-type: it appends to
    the field), ``select <ref> "<option>"``, ``press <key>``. The admissible list holds every click, the
    ``type`` of each task field value into each text field (MiniWoB's type-field actions), every ``<select>``
    option and four keys; any other text for ``type`` and any MiniWoB key for ``press`` are accepted too.
    Anything else is invalid (feedback, ``info["invalid_action"]``).

    **Rewards.** MiniWoB's raw task reward in [-1, 1] when the episode ends (0 before): 1 for success, -1
    for failure or MiniWoB's episode timeout, partial credit where the task defines it. MiniWoB's *official*
    reward also decays with wall-clock time; it is reported as ``info["miniwob_env_reward"]`` but not used
    as the reward, so that a seeded episode is reproducible whatever the agent's speed.

    **Termination.** When MiniWoB ends the episode (the task's own success/failure, or its timer:
    ``episode_seconds``, MiniWoB's 10 s by default). Truncation: the registered ``max_episode_steps``, or a
    browser that stopped responding mid-episode (``info["browser_error"]``).

    ``info``: ``miniwob_task``, ``episode_seed``, ``miniwob_env_reward`` (at the end) and ``expert_action`` on
    tasks with an expert (:data:`echorl_envs.miniwob.experts.EXPERTS`; other tasks have none).

    **Registered ids.** ``EchoRL/MiniWoB-<task>-v0`` for the tasks in :data:`echorl_envs.miniwob.TASKS`.
    """

    reset_options: ClassVar[frozenset[str]] = frozenset()
    step_info_keys: ClassVar[tuple[str, ...]] = ("miniwob_env_reward",)

    def __init__(self, task: str = "click-button", episode_seconds: float = 10.0, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        known = miniwob_tasks()
        if known and task not in known:
            hint = difflib.get_close_matches(task, known, n=1)
            raise ValueError(f"task must be a MiniWoB++ task name, got task={task!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if isinstance(episode_seconds, bool) or not isinstance(episode_seconds, (int, float)) or episode_seconds <= 0:
            raise ValueError(f"episode_seconds must be a positive number, got episode_seconds={episode_seconds!r}")
        self.task = task
        self.episode_seconds = float(episode_seconds)
        self._ctor = {"task": task, "episode_seconds": episode_seconds, "render_mode": render_mode}
        self.browser = MiniWoBBrowser(task, episode_ms=int(self.episode_seconds * 1000))
        self._utterance = ""
        self._fields: list[tuple[str, str]] = []
        self._elements: list[Element] = []
        self._admissible_cache: list[str] = []
        self._seed: int | None = None
        self._forced_seed: int | None = None
        self._history: list[Any] = []

    # ----------------------------------------------------------------- browser
    def _ensure_browser(self) -> None:
        if self.browser.started and not self.browser.alive():
            warnings.warn(f"the Chromium of MiniWoB task {self.task!r} stopped responding; starting a new one",
                          RuntimeWarning, stacklevel=3)
            self.browser.close()
        if not self.browser.started:
            self.browser.start()

    def close(self) -> None:
        self.browser.close()
        super().close()

    # ----------------------------------------------------------------- observation
    def _observe(self, obs: dict[str, Any], info: dict[str, Any]) -> None:
        self._utterance = str(obs.get("utterance", ""))
        self._fields = [(str(k), str(v)) for k, v in obs.get("fields", ())]
        root = info.get("root_dom")
        options: dict[int, tuple[tuple[str, bool], ...]] = {}
        if root is not None:
            selects = [int(e.ref) for e in root.subtree_elements if e.tag.lower() == "select"]
            if selects:
                got = self.browser.env.instance.driver.execute_script(_OPTIONS_JS, selects)
                options = {r: tuple((str(t), bool(s)) for t, s in opts) for r, opts in zip(selects, got, strict=False)}
        self._elements = flatten(root, options) if root is not None else []
        self._admissible_cache = admissible(self._elements, self._fields)

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._ensure_browser()
        seed = self._forced_seed if self._forced_seed is not None else int(self.np_random.integers(2**31 - 1))
        self._seed, self._history = seed, []
        obs, info = self.browser.env.reset(seed=seed)
        self._observe(obs, info)
        return Transition(render(self._utterance, self._elements))

    # ----------------------------------------------------------------- actions
    def step(self, action: str):
        out = super().step(action)
        self._history.append(action)
        return out

    def _match_parametric(self, action: str) -> str | None:
        try:
            cmd = parse_command(action, self._elements)
        except CommandError as e:
            raise InvalidAction(f"Invalid action: {e}.") from None
        return None if cmd is None else str(cmd)

    def _miniwob_action(self, kind: str, **values: Any) -> dict[str, Any]:
        cfg = self.browser.env.action_space_config
        return {"action_type": cfg.action_types.index(kind), **values}

    def _apply(self, action: str) -> Transition:
        cmd = parse_command(action, self._elements)
        assert cmd is not None, action  # matched against the admissible list or _match_parametric
        env = self.browser.env
        try:
            if cmd.kind == "click":
                act = self._miniwob_action("CLICK_ELEMENT", ref=cmd.ref)
            elif cmd.kind == "type":
                act = self._miniwob_action("FOCUS_ELEMENT_AND_TYPE_TEXT", ref=cmd.ref, text=cmd.text)
            elif cmd.kind == "press":
                key = KEYS.get(cmd.text, cmd.text)
                act = self._miniwob_action("PRESS_KEY", key=env.action_space_config.allowed_keys.index(key))
            else:  # select: Selenium's own <select> helper on the element MiniWoB gave this ref
                from selenium.webdriver.support.select import Select

                el = env.instance.driver.execute_script(f"return core.previousDOMInfo[{int(cmd.ref)}];")
                Select(el).select_by_visible_text(cmd.text)
                act = self._miniwob_action("NONE")
            obs, reward, terminated, _, info = env.step(act)
        except Exception as e:  # the browser crashed or was killed: end the episode, restart on reset()
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._elements, self._admissible_cache = [], []
            return Transition(f"The browser stopped responding ({msg[:200]}); call reset().", 0.0, False, True,
                              info={"browser_error": msg[:200]})
        if terminated:
            self._admissible_cache = []
            reason = info.get("reason")
            text = f"Episode over: MiniWoB reward {reward:+.2f}" + (f" ({reason})." if reason else ".")
            return Transition(text, float(reward), True, won=reward > 0,
                              info={"miniwob_env_reward": float(info.get("env_reward", 0.0))})
        self._observe(obs, info)
        return Transition(render(self._utterance, self._elements))

    # ----------------------------------------------------------------- protocol hooks
    def _admissible(self) -> list[str]:
        return self._admissible_cache

    def _task(self) -> str:
        return self._utterance or f"MiniWoB++ task {self.task}"

    def _expert(self) -> str | None:
        return expert_action(self.task, self._fields, self._elements) if self._elements else None

    def _extra_info(self) -> dict[str, Any]:
        return {"miniwob_task": self.task, "episode_seed": self._seed}

    # ----------------------------------------------------------------- pickling: replay in a new browser
    def __getstate__(self) -> dict[str, Any]:
        rng = self._np_random.bit_generator.state if self._np_random is not None else None
        return {"ctor": self._ctor, "seed": self._seed if self._started else None,
                "history": list(self._history), "rng": rng}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["ctor"])  # type: ignore[misc]
        if state["seed"] is not None:
            self._forced_seed = state["seed"]
            try:
                self.reset()
            finally:
                self._forced_seed = None
            for a in state["history"]:
                self.step(a)
        if state["rng"] is not None:
            self._np_random = np.random.Generator(np.random.PCG64())
            self._np_random.bit_generator.state = state["rng"]
