"""Every echorl id as an OpenEnv service (``echorl serve-env``).

The app is built by OpenEnv's own ``openenv.core.env_server.create_app``: HTTP ``/reset`` ``/step`` ``/state``
``/schema`` ``/health``, the session WebSocket ``/ws`` that ``GenericEnvClient(...).sync()`` (and TRL,
verifiers' ``OpenEnvEnv``, torchforge) speak, and the browser page ``/web``. Each WebSocket session gets its own
:class:`EchoRLEnvironment`, i.e. its own ``gym.make(ID)``; ``max_sessions`` sessions run concurrently (each in
OpenEnv's per-session worker thread), idle sessions are closed after ``session_timeout`` seconds, and the
``max_sessions + 1``-th session is refused with OpenEnv's ``CAPACITY_REACHED`` error.

Wire format (``/schema`` publishes it):

* action: ``{"action": str}`` -- a command of a choice env or the answer of a free-text env;
* observation: ``text`` (the env's observation), ``admissible_actions`` (empty for free-text envs), ``task``,
  ``won``, ``invalid_action``, OpenEnv's ``reward`` (None after reset) and ``done`` (terminated or truncated),
  and ``metadata`` = ``{"terminated", "truncated"}`` plus every other key of the gymnasium ``info`` (``step``,
  ``expert_action``, ``task_id``, family keys), made JSON-safe;
* reset fields: ``seed``, ``options`` (the env's reset options, e.g. ``{"index": 3}``), ``task`` (which
  served id to play; default: the first served id) and ``max_episode_steps`` (default: the id's registered limit).

A server may host several ids; the client picks one per episode with ``reset(task=ID)`` (OpenEnv forwards extra
reset fields to ``Environment.reset``). HTTP ``/reset`` and ``/step`` are OpenEnv's stateless routes (a fresh env
per request): ``/reset`` answers an episode's first observation, ``/step`` answers 409 (no episode in a fresh env);
episodes are played over the WebSocket. No client input gets a 500: bad fields get 422 with the field named.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    from openenv.core.env_server import Action, ConcurrencyConfig, Environment, Observation, State, create_app
    from openenv.core.env_server.types import EnvironmentMetadata
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"echorl serve-env needs the openenv extra: pip install 'echorl[openenv]' ({e})") from e
from pydantic import Field, PrivateAttr, ValidationError, model_validator

import echorl_envs
from echorl_envs.service.errors import (
    PLAY_OVER_WS,
    ClientError,
    InvalidActionMessage,
    NoEpisodeError,
    check_web_step,
    explain_bad_requests,
    explain_validation_error,
)

__all__ = ["EchoRLAction", "EchoRLObservation", "EchoRLState", "EchoRLEnvironment", "build_app", "serve", "public_url",
           "to_wire", "open_envs", "uvicorn_config", "RESERVED_METADATA"]

log = logging.getLogger(__name__)

#: Keys of ``metadata`` that are not ``info`` keys.
RESERVED_METADATA = ("terminated", "truncated")
#: ``info`` keys that are observation fields rather than metadata.
_OBS_KEYS = ("task", "admissible_actions", "won", "invalid_action")
#: Reset fields besides OpenEnv's own ``seed`` and ``episode_id``.
_RESET_FIELDS = ("options", "task", "max_episode_steps")


class EchoRLAction(Action):
    """One text action.

    A message that does not validate still becomes an ``EchoRLAction``, holding why (OpenEnv would answer only
    "Invalid message (code: VALIDATION_ERROR)", and its clients drop the details); ``step`` then raises a
    ValueError naming the field, which every OpenEnv client shows.
    """

    action: str = Field(description="The text action: an admissible command (choice envs) or an answer.")
    _invalid: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _explain_invalid(cls, data: Any, handler: Any) -> EchoRLAction:
        try:
            return handler(data)
        except ValidationError as e:
            bad = cls.model_construct(action="")
            bad._invalid = explain_validation_error(e, ["action", "metadata"])
            return bad


class EchoRLObservation(Observation):
    """What an echorl env returns, in OpenEnv's shape (``reward``, ``done``, ``metadata`` come from the base)."""

    text: str = Field(default="", description="The environment's text observation.")
    admissible_actions: list[str] = Field(default_factory=list, description="Admissible actions (empty: free text).")
    task: str = Field(default="", description="The instruction of the episode.")
    won: bool = Field(default=False, description="Whether the episode has been won.")
    invalid_action: bool = Field(default=False, description="Whether the last action was rejected as invalid.")


class EchoRLState(State):
    """Episode bookkeeping (``episode_id`` and ``step_count`` come from OpenEnv's ``State``)."""

    env_id: str | None = Field(default=None, description="The served id this session is playing.")
    seed: int | None = Field(default=None, description="The seed of the last reset.")
    served: list[str] = Field(default_factory=list, description="The ids this server hosts; the first is the "
                              "default of reset().")
    max_episode_steps: int | None = Field(default=None, description="The step limit of the session's episode "
                                          "(before the first reset: the default id's registered limit).")


def to_wire(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, tuples and sets turned into JSON types (dict keys become str)."""
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_wire(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


#: Every open session env of this process (for shutdown and for leak checks in tests).
_OPEN: weakref.WeakSet[EchoRLEnvironment] = weakref.WeakSet()


def open_envs() -> int:
    """How many session envs of this process hold an open gymnasium env."""
    return sum(1 for e in list(_OPEN) if e.is_open)


class EchoRLEnvironment(Environment[EchoRLAction, EchoRLObservation, EchoRLState]):
    """One session: a ``gym.make(ID)`` built at the first ``reset`` and rebuilt when ``reset(task=...)`` changes id.

    Args:
        tasks: the ids this server hosts (the first one is the default).
        make_kwargs: extra ``gym.make`` keyword arguments per id (e.g. a data path).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, tasks: Sequence[str], make_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__()
        if not tasks:
            raise ValueError("tasks must name at least one env id, got tasks=[]")
        self.tasks = list(tasks)
        self.make_kwargs = {k: dict(v) for k, v in (make_kwargs or {}).items()}
        self._env: Any = None
        self._key: tuple[str, int | None] | None = None
        default_limit = echorl_envs.entry(self.tasks[0]).max_episode_steps
        self._state = EchoRLState(served=self.tasks, max_episode_steps=default_limit)
        self._lock = threading.Lock()
        self._closed = False
        _OPEN.add(self)

    @property
    def is_open(self) -> bool:
        return self._env is not None

    # ------------------------------------------------------------------ OpenEnv API
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoRLObservation:
        unknown = sorted(set(kwargs) - set(_RESET_FIELDS))
        if unknown:
            hint = difflib.get_close_matches(unknown[0], [*_RESET_FIELDS, "seed", "episode_id"], n=1)
            raise ClientError(f"unknown reset field {unknown[0]!r:.80}"
                              + (f"; did you mean {hint[0]!r}?" if hint else "")
                              + f" (accepted: seed, episode_id, {', '.join(_RESET_FIELDS)})")
        task = kwargs.get("task") or self.tasks[0]
        if not isinstance(task, str) or task not in self.tasks:
            hint = difflib.get_close_matches(str(task), self.tasks, n=1, cutoff=0.4)
            raise ClientError(f"task {task!r:.80} is not served here"
                              + (f"; did you mean {hint[0]!r}?" if hint else "") + f" (served: {', '.join(self.tasks)})")
        limit = kwargs.get("max_episode_steps")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ClientError(f"max_episode_steps must be an int >= 1 or null, got max_episode_steps={limit!r:.80}")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > 255):
            raise ClientError(f"episode_id must be a string of at most 255 characters or null, got "
                              f"episode_id={episode_id!r:.80}")
        options = kwargs.get("options")
        if options is not None and not isinstance(options, dict):
            raise ClientError(f"options must be an object (dict) or null, got options={options!r:.80}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
            raise ClientError(f"seed must be an int in [0, 2**64) or null, got seed={seed!r:.80}")
        with self._lock:
            self._check_open()
            if self._key != (task, limit):
                self._close_env()
                extra = {"max_episode_steps": limit} if limit is not None else {}
                self._env = echorl_envs.make(task, **self.make_kwargs.get(task, {}), **extra)
                self._key = (task, limit)
            try:
                obs, info = self._env.reset(seed=seed, options=options)
            except (ValueError, TypeError, KeyError, IndexError) as e:
                if not options:  # not the client's doing: a server fault (HTTP 500), with the env's traceback
                    raise
                raise ClientError(f"the env refused reset(options={options!r:.200}): {type(e).__name__}: {e}") from e
        self._state = EchoRLState(episode_id=episode_id, step_count=0, env_id=task, seed=seed, served=self.tasks,
                                  max_episode_steps=limit or echorl_envs.entry(task).max_episode_steps)
        return self._observation(obs, None, False, False, info)

    def step(self, action: EchoRLAction, timeout_s: float | None = None, **kwargs: Any) -> EchoRLObservation:
        if action._invalid is not None:
            raise InvalidActionMessage(action._invalid)
        with self._lock:
            self._check_open()
            if self._env is None:
                raise NoEpisodeError("call reset() before step(): this session has no episode yet. Plain HTTP "
                                     "/reset and /step are OpenEnv's stateless routes (a fresh env per request, so "
                                     f"no episode carries over from /reset); {PLAY_OVER_WS}")
            obs, reward, terminated, truncated, info = self._env.step(action.action)
        self._state.step_count += 1
        return self._observation(obs, float(reward), bool(terminated), bool(truncated), info)

    @property
    def state(self) -> EchoRLState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="echorl", version=echorl_envs.__version__,
            description="echorl text environments: " + ", ".join(self.tasks)
            + ". Type an action (or pick an admissible one); reset(task=ID) picks the id.",
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_env()

    # ------------------------------------------------------------------ /web page
    def render_web(self, observation: dict[str, Any]) -> str | None:
        """The task, the observation text and the admissible actions, as HTML."""
        import html

        if not observation.get("text"):
            return None
        adm = observation.get("admissible_actions") or []
        flags = " · ".join(f for f, on in (("won", observation.get("won")), ("invalid action",
                           observation.get("invalid_action")), ("done", observation.get("done"))) if on)
        return (f'<div class="echorl-obs"><p><b>Task:</b> {html.escape(str(observation.get("task", "")))}</p>'
                f'<pre class="echorl-text">{html.escape(observation["text"])}</pre>'
                + (f"<p><b>{html.escape(flags)}</b></p>" if flags else "")
                + (f'<p>Admissible actions ({len(adm)}): ' + ", ".join(f"<code>{html.escape(a)}</code>" for a in adm)
                   + "</p>" if adm else "")
                + "</div>")

    def web_actions(self, observation: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """One click per admissible action."""
        return [(a, {"action": a}) for a in (observation.get("admissible_actions") or [])[:64]]

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this session was closed (idle timeout or server shutdown); open a new session")

    def _close_env(self) -> None:
        if self._env is not None:
            key = self._key
            try:
                self._env.close()
            finally:
                self._env, self._key = None, None
            log.info("closed session env %s", key[0] if key else "?")

    @staticmethod
    def _observation(obs: str, reward: float | None, terminated: bool, truncated: bool,
                     info: Mapping[str, Any]) -> EchoRLObservation:
        meta = {"terminated": terminated, "truncated": truncated}
        meta.update(to_wire({k: v for k, v in info.items() if k not in _OBS_KEYS}))
        return EchoRLObservation(
            text=obs, admissible_actions=list(info.get("admissible_actions", [])), task=str(info.get("task", "")),
            won=bool(info.get("won", False)), invalid_action=bool(info.get("invalid_action", False)),
            reward=reward, done=terminated or truncated, metadata=meta,
        )


def public_url(host: str, port: int) -> str:
    """The address clients use for a server bound to ``host:port`` (a wildcard host: this machine's name)."""
    import socket

    shown = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def _web_page(tasks: Sequence[str], url: str | None) -> Any:
    """A ``gradio_builder`` for ``create_app``: OpenEnv's own playground, headed by the served ids and the
    server's real address, with a "Same call in Python" box for this server (OpenEnv's default names no id and
    always says ``http://localhost:8000``)."""
    from openenv.core.env_server.gradio_ui import build_gradio_app

    where = f" at {url}" if url else ""
    others = f"; clients pick among {', '.join(tasks)} with reset(task=ID)" if len(tasks) > 1 else ""
    description = f"echorl serve-env{where}. Reset plays {tasks[0]}{others}. Type an action or click one."
    base = url or "http://HOST:PORT"
    quick_start = "\n".join([
        f"The server is at `{base}` and serves " + ", ".join(f"`{t}`" for t in tasks) + ".", "",
        "```python",
        "import gymnasium as gym",
        "import echorl_envs  # registers EchoRL/Remote-v0", "",
        f'env = gym.make("EchoRL/Remote-v0", base_url="{base}", task="{tasks[0]}")',
        "obs, info = env.reset(seed=0)",
        "obs, reward, terminated, truncated, info = env.step("
        + ('info["admissible_actions"][0])' if echorl_envs.entry(tasks[0]).action_type == "choice"
           else '"your answer")'),
        "```", "",
        f'OpenEnv\'s client works too: `GenericEnvClient(base_url="{base}").sync()`, then '
        f'`reset(task="{tasks[0]}")` and `step({{"action": "..."}})`.',
    ])

    def builder(web_manager: Any, action_fields: list, metadata: Any, is_chat_env: bool, title: str,
                quick_start_md: str) -> Any:
        ours = EnvironmentMetadata(name="echorl", version=echorl_envs.__version__, description=description)
        return build_gradio_app(web_manager, action_fields, ours, is_chat_env, title, quick_start)

    return builder


def build_app(tasks: Sequence[str], max_sessions: int = 8, session_timeout: float | None = 300.0,
              web: bool = True, make_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
              url: str | None = None) -> Any:
    """The FastAPI app of ``create_app`` serving ``tasks`` (see the module docstring).

    Args:
        tasks: registered echorl ids; ``reset(task=ID)`` picks one, the first is the default (and the /web one).
        max_sessions: concurrent WebSocket sessions (each its own env); one more gets ``CAPACITY_REACHED``.
        session_timeout: seconds after which an idle session is closed (None: never).
        web: serve OpenEnv's browser page at ``/web``.
        make_kwargs: extra ``gym.make`` keyword arguments per id.
        url: the address clients reach the server at, shown on the ``/web`` page (:func:`serve` passes it).
    """
    if not tasks:
        raise ValueError("tasks must name at least one env id, got tasks=[]")
    for t in tasks:
        echorl_envs.entry(t)  # ValueError with the close match
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got max_sessions={max_sessions!r}")
    if session_timeout is not None and session_timeout <= 0:
        raise ValueError(f"session_timeout must be > 0 seconds or None, got session_timeout={session_timeout!r}")
    factory = functools.partial(EchoRLEnvironment, list(tasks), make_kwargs)
    # create_app reads ENABLE_WEB_INTERFACE at call time to decide whether to mount the Gradio page at /web.
    saved = os.environ.get("ENABLE_WEB_INTERFACE")
    os.environ["ENABLE_WEB_INTERFACE"] = "true" if web else "false"
    try:
        page = dict(gradio_builder=_web_page(tasks, url), show_default_tab=False,
                    title_override=f"echorl serve-env: {', '.join(tasks)}") if web else {}
        app = create_app(factory, EchoRLAction, EchoRLObservation, env_name="echorl", state_cls=EchoRLState,
                         concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                              session_timeout=session_timeout), **page)
    finally:
        if saved is None:
            os.environ.pop("ENABLE_WEB_INTERFACE", None)
        else:
            os.environ["ENABLE_WEB_INTERFACE"] = saved

    def _close_all() -> None:  # after uvicorn closed the sockets: no env outlives the server
        log.info("shutting down: closing %d open session env(s)", open_envs())
        for env in list(_OPEN):
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - best effort at shutdown, reported
                log.warning("closing a session env at shutdown failed: %r", e)

    app.router.on_shutdown.append(_close_all)
    explain_bad_requests(app)
    check_web_step(app)
    return app


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 8001, log_level: str = "info") -> Any:
    """uvicorn's config for ``app``: no server-side WebSocket pings, 5 s graceful shutdown.

    ``EchoRL/Remote-v0`` runs its client loop only inside ``reset``/``step`` (the fast path), so it cannot answer
    pings while the learner is busy between steps; a pinging server would drop such a session after ~40 s.
    Dead clients are still found: a closed socket ends the session at once, a vanished host when the idle
    ``session_timeout`` reaps it.
    """
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_ping_interval=None,
                          timeout_graceful_shutdown=5)


def serve(tasks: Sequence[str], host: str = "127.0.0.1", port: int = 8001, max_sessions: int = 8,
          session_timeout: float | None = 300.0, web: bool = True,
          make_kwargs: Mapping[str, Mapping[str, Any]] | None = None, log_level: str = "info") -> None:
    """Run the server until SIGINT/SIGTERM (uvicorn closes the sockets, then every session env is closed)."""
    import uvicorn

    app = build_app(tasks, max_sessions=max_sessions, session_timeout=session_timeout, web=web,
                    make_kwargs=make_kwargs, url=public_url(host, port))
    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()
