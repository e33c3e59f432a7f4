"""``EchoRL/Remote-v0``: an env served by ``echorl serve-env`` (or any OpenEnv server speaking the same wire
format, see :mod:`echorl_envs.service.server`) as a local Gymnasium text env.

    env = gym.make("EchoRL/Remote-v0", base_url="http://host:8001", task="EchoRL/ALFWorld-v0")

It keeps echorl's text protocol: ``str`` observations and actions in the same ``Text`` spaces, and the same
``info`` keys as ``gym.make(task)`` (``task``, ``admissible_actions``, ``won``, ``invalid_action``, ``step`` and
the family keys; tuples and numpy values arrive as lists and numbers), so the SB3 wrappers, agents and
``echorl bench --env-url`` run on it unchanged. The episode
limit is the server's (the id's registered ``max_episode_steps``, or ``time_limit``); the id registers no limit
of its own. Talks over one OpenEnv WebSocket session, opened on construction: one ``RemoteTextEnv`` holds one of
the server's ``max_sessions`` slots until :meth:`close`.

The client is OpenEnv's ``GenericEnvClient`` driven on an event loop owned by the env and run in the calling
thread. (``GenericEnvClient(...).sync()`` hands every call to a background loop thread and back; skipping those
two thread switches cut the client's CPU per MiniGrid step from 0.60 to 0.40 ms here, see
docs/results/reliability.md.) Hence the env, like any gymnasium env, is called from synchronous code, not from inside
a running event loop. The loop runs only inside ``reset``/``step``, so the session sends no keepalive pings
(``echorl serve-env`` sends none either): an env idle for longer than the server's ``--session-timeout``
(default 300 s) loses its session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from echorl_envs.core.base import MAX_TEXT, text_space

__all__ = ["RemoteTextEnv"]

_RESERVED = ("terminated", "truncated")


class RemoteTextEnv(gym.Env[str, str]):
    """A served echorl env behind the local text-env protocol.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:8001"`` (``echorl serve-env``'s default port; ``ws://`` also
            works).
        task: which served id to play (default: the server's first id).
        time_limit: episode step limit applied by the server (default: the id's registered limit).
        connect_timeout_s: WebSocket connection timeout.
        message_timeout_s: time to wait for one reset/step reply (engines like ALFWorld load games on reset).
        render_mode: None or ``"ansi"`` (returns the last observation).
        sync_client: an OpenEnv client whose calls block (``GenericEnvClient(base_url).sync()``), used instead of
            the env's own client and event loop -- the path ``benchmarks/remote_env_throughput.py --clients``
            compares with the default one; it is connected here and closed by :meth:`close`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, base_url: str | None = None, task: str | None = None, time_limit: int | None = None,
                 connect_timeout_s: float = 10.0, message_timeout_s: float = 300.0,
                 render_mode: str | None = None, sync_client: Any = None) -> None:
        if base_url is None:
            raise ValueError("base_url is required: the address of an `echorl serve-env` server, e.g. "
                             'gym.make("EchoRL/Remote-v0", base_url="http://127.0.0.1:8001"); got base_url=None')
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"base_url must start with http://, https://, ws:// or wss://, got base_url={base_url!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, "
                             f"got render_mode={render_mode!r}")
        if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, int)
                                       or time_limit < 1):
            raise ValueError(f"time_limit must be an int >= 1 or None, got time_limit={time_limit!r}")
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise ImportError(f"EchoRL/Remote-v0 needs the openenv extra: pip install 'echorl[openenv]' ({e})") from e
        self.base_url, self.task, self.time_limit = base_url, task, time_limit
        self.render_mode = render_mode
        self.observation_space = text_space(MAX_TEXT)
        self.action_space = text_space(MAX_TEXT)
        self._loop: asyncio.AbstractEventLoop | None = None  # None: the client's calls block by themselves
        self._client: Any = sync_client
        if sync_client is None:
            self._loop = asyncio.new_event_loop()
            # no keepalive pings: the loop runs only inside reset/step, so it could not answer them between calls
            self._client = GenericEnvClient(base_url=base_url, connect_timeout_s=connect_timeout_s,
                                            message_timeout_s=message_timeout_s, websocket_ping_interval_s=None,
                                            websocket_ping_timeout_s=None)
        self._last_obs = ""
        self._run(self._client.connect)  # claim the session now: a full server fails here, not mid-rollout
        #: the served episode's step limit (the server truncates there): ``time_limit``, else the served id's
        self.max_episode_steps = time_limit or self._served_limit()

    def _served_limit(self) -> int | None:
        """The step limit of ``task`` (or the server's default id) as the server reports it."""
        state = self._run(self._client.state)
        served = list(state.get("served") or [])
        if self.task is not None and served and self.task not in served:
            hint = difflib.get_close_matches(self.task, served, n=1, cutoff=0.4)
            self.close()
            raise ValueError(f"task {self.task!r} is not served at {self.base_url}"
                             + (f"; did you mean {hint[0]!r}?" if hint else "") + f" (served: {', '.join(served)})")
        if self.task is None or (served and self.task == served[0]):
            return state.get("max_episode_steps")
        # the server's ids are registered ids: their limits are the registered ones (gym's registry, which the
        # package filled on import; importing the package root here would close an import cycle with the table)
        return gym.spec(self.task).max_episode_steps

    @property
    def spec(self) -> EnvSpec | None:
        """``gym.make``'s spec, with ``max_episode_steps`` = the served env's limit (applied by the server)."""
        spec = getattr(self, "_spec", None)
        if spec is not None and spec.max_episode_steps is None and self.max_episode_steps is not None:
            return dataclasses.replace(spec, max_episode_steps=self.max_episode_steps)
        return spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self._spec = value

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        fields: dict[str, Any] = {"seed": seed, "options": options}
        if self.task is not None:
            fields["task"] = self.task
        if self.time_limit is not None:
            fields["max_episode_steps"] = self.time_limit
        obs, _, _, _, info = self._unpack(self._run(lambda: self._client.reset(**fields)))
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not isinstance(action, str):  # the wire carries text; the server's env reports the invalid action
            action = str(action)
        return self._unpack(self._run(lambda: self._client.step({"action": action})))

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        client, self._client = getattr(self, "_client", None), None
        loop = getattr(self, "_loop", None)
        if client is not None and loop is None:
            client.close()
        elif client is not None and not loop.is_closed():
            try:
                self._run(client.close, loop=loop)
            finally:
                loop.close()
        super().close()

    def _run(self, call: Callable[[], Awaitable[Any]], loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """Await ``call()`` on this env's own loop, in the calling thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("EchoRL/Remote-v0 is a synchronous gymnasium env; call it outside a running event "
                               "loop (or use openenv's GenericEnvClient directly in async code)")
        if self._client is None and loop is None:
            raise RuntimeError("this EchoRL/Remote-v0 env is closed")
        if (loop or self._loop) is None:  # a blocking client (``sync_client``)
            return call()

        async def go() -> Any:
            return await call()

        return (loop or self._loop).run_until_complete(go())

    def _unpack(self, result: Any) -> tuple[str, float, bool, bool, dict]:
        ob = result.observation
        meta = dict(result.metadata or ob.get("metadata") or {})
        info = {k: v for k, v in meta.items() if k not in _RESERVED}
        info.update(task=ob["task"], admissible_actions=list(ob["admissible_actions"]), won=ob["won"],
                    invalid_action=ob["invalid_action"])
        self._last_obs = ob["text"]
        reward = 0.0 if result.reward is None else float(result.reward)
        return ob["text"], reward, bool(meta.get("terminated", False)), bool(meta.get("truncated", False)), info
