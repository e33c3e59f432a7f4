"""Training episodes on ``echorl serve-env`` servers (``echorl train-llm --env-url URL [--env-url URL ...]``).

Env ``i`` of a run is the served env ``EchoRL/Remote-v0`` on server ``urls[i % len(urls)]``, wrapped exactly as the
in-process one (:func:`~echorl_agent.llm_rl.rollout.make_choice_env`: the same :class:`LLMObservationWrapper`,
history and action slots), so observations, admissible lists and rewards are the same text and numbers and a run with
the same seed gives the same trajectories and the same ``curve.csv`` as in-process.

A server that dies (connection closed or refused) or hangs (no reply within ``step_timeout_s``) is marked dead and the
env moves to the next live server: :class:`FailoverEnv` resets a new session with the seed of the env's last seeded
reset and replays every action taken since (the envs are deterministic given the seed; an unseeded reset, as PPO's
later episodes have, continues the env's RNG, so those resets are replayed too), checking each replayed observation
and reward against a digest of the recorded one, then makes the call that failed. A replay that differs, or no live
server left, raises :class:`EnvServerError` naming the servers: an episode is never dropped or half-counted.

Each server's real env steps, the seconds the client waited on them, replayed steps and failovers are counted
(:class:`EnvServerPool.stats`); ``train-llm`` writes them to ``<out>/servers.json`` with env steps/s per server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

import echorl_envs
from echorl_envs.wrappers.llm import LLMObservationWrapper

__all__ = ["EnvServerError", "ServerStats", "EnvServerPool", "FailoverEnv", "check_env_urls"]

logger = logging.getLogger(__name__)

#: What a dead or hung server looks like to OpenEnv's client: refused/closed sockets and timeouts are OSErrors
#: (ConnectionError, TimeoutError), a dropped WebSocket is a websockets ConnectionClosed.
try:
    from websockets.exceptions import WebSocketException as _WSError
except ImportError:  # pragma: no cover - websockets comes with the openenv extra
    _WSError = OSError
SERVER_FAILURES: tuple[type[BaseException], ...] = (OSError, _WSError)

_FIX = "start one with `echorl serve-env --task {task} --port PORT` (docs/scaling.md), or drop that --env-url"


class EnvServerError(RuntimeError):
    """A training episode cannot go on on any env server (every server dead, or a replay that differs)."""


def check_env_urls(urls: list[str]) -> None:
    """``env_urls`` entries are http(s)/ws(s) URLs, each given once (ValueError naming the flag otherwise)."""
    if not isinstance(urls, (list, tuple)):
        raise ValueError(f"env_urls must be a list of URLs (--env-url URL, repeatable), got env_urls={urls!r}")
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"--env-url must start with http://, https://, ws:// or wss://, got {url!r} "
                             "(e.g. --env-url http://127.0.0.1:8001)")
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise ValueError(f"--env-url {dup[0]} is given more than once; give each server once (env i plays on server "
                         "i mod the number of servers)")


@dataclass
class ServerStats:
    """What one server did for a run."""

    url: str
    env_steps: int = 0
    """Env steps of training episodes played there (replays not counted)."""
    resets: int = 0
    wait_s: float = 0.0
    """Seconds the client waited on this server's resets and steps."""
    replayed_steps: int = 0
    """Steps replayed there after another server failed."""
    failovers: int = 0
    """Envs that left this server because it failed."""
    dead: bool = False
    error: str = ""

    def row(self) -> dict[str, Any]:
        """The stats plus ``env_steps_per_s`` (env steps / seconds waited on this server)."""
        return {**asdict(self), "env_steps_per_s": self.env_steps / self.wait_s if self.wait_s > 0 else 0.0}


class EnvServerPool:
    """The servers of a run, their liveness and their :class:`ServerStats`.

    Args:
        urls: the ``echorl serve-env`` servers (``--env-url``).
        task: the env id they must serve (``--task``).
        step_timeout_s: a reset or step that gets no reply in this time marks its server hung (dead for the run).
        connect_timeout_s: WebSocket connection timeout.
    """

    def __init__(self, urls: list[str], task: str, step_timeout_s: float = 120.0,
                 connect_timeout_s: float = 10.0) -> None:
        check_env_urls(urls)
        if not urls:
            raise ValueError("EnvServerPool needs at least one --env-url")
        self.urls, self.task = list(urls), task
        self.step_timeout_s, self.connect_timeout_s = step_timeout_s, connect_timeout_s
        self.stats = {u: ServerStats(u) for u in self.urls}

    def check(self) -> None:
        """Before training: every server answers and serves ``task`` (ValueError naming the flag, URL and fix)."""
        for url in self.urls:
            try:
                env = self.connect(url)
            except SERVER_FAILURES as e:
                raise ValueError(f"--env-url {url} is unreachable ({type(e).__name__}: {e}); "
                                 + _FIX.format(task=self.task)) from e
            except ValueError as e:  # RemoteTextEnv: the task is not among the served ids
                raise ValueError(f"--env-url {url} does not serve --task {self.task}: {e}; start the server with "
                                 f"`echorl serve-env --task {self.task}`, or pass the --task it serves") from e
            env.close()

    def connect(self, url: str, time_limit: int | None = None) -> gym.Env:
        """A new session on ``url`` playing ``task`` (the server applies ``time_limit``, else the task's limit)."""
        from echorl_envs.service.remote import RemoteTextEnv

        return RemoteTextEnv(base_url=url, task=self.task, time_limit=time_limit,
                             connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.step_timeout_s)

    def live_after(self, url: str) -> list[str]:
        """The live servers, starting with the one after ``url`` in ``urls`` order."""
        i = self.urls.index(url)
        order = self.urls[i + 1:] + self.urls[: i + 1]
        return [u for u in order if not self.stats[u].dead]

    def mark_dead(self, url: str, error: BaseException) -> None:
        s = self.stats[url]
        if not s.dead:
            logger.warning("env server %s failed (%s: %s); its episodes are replayed on the other servers", url,
                           type(error).__name__, error)
        s.dead, s.error = True, s.error or f"{type(error).__name__}: {error}"

    def choice_env(self, i: int, history: int, max_episode_steps: int | None = None) -> LLMObservationWrapper:
        """Env ``i`` of the run on server ``urls[i % len(urls)]``, wrapped as
        :func:`~echorl_agent.llm_rl.rollout.make_choice_env` wraps the in-process env."""
        inner = FailoverEnv(self, self.urls[i % len(self.urls)], max_episode_steps)
        return LLMObservationWrapper(inner, history=history, max_actions=echorl_envs.entry(self.task).max_actions)

    def write(self, out: Path) -> Path:
        """``<out>/servers.json``: one row per server (env steps, seconds waited, env steps/s, failovers, dead)."""
        path = Path(out) / "servers.json"
        path.write_text(json.dumps({"task": self.task, "servers": [s.row() for s in self.stats.values()]}, indent=2))
        return path


def _digest(obs: str, reward: float, terminated: bool, truncated: bool) -> bytes:
    return hashlib.blake2b(repr((obs, float(reward), terminated, truncated)).encode(), digest_size=8).digest()


class FailoverEnv(gym.Env[str, str]):
    """A served text env that survives its server: on a server failure it replays, on the next live server, every
    reset and action since the last seeded reset, checks the replayed observations, and goes on.

    Args:
        pool: the run's servers.
        url: the server this env starts on.
        max_episode_steps: step limit applied by the server (None: the task's registered limit).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, pool: EnvServerPool, url: str, max_episode_steps: int | None = None) -> None:
        self.pool, self.url, self.time_limit = pool, url, max_episode_steps
        self.observation_space = self.action_space = None  # set from the first session below
        self._log: list[tuple[str, Any, bytes]] = []  # ("reset", (seed, options), digest) / ("step", action, digest)
        self._env: gym.Env | None = None
        self._open(first=True)
        self.observation_space, self.action_space = self._env.observation_space, self._env.action_space
        spec = gym.spec(pool.task)
        self.spec = dataclasses.replace(spec, max_episode_steps=max_episode_steps) if max_episode_steps else spec

    def _open(self, first: bool = False) -> None:
        """A session on ``self.url``, or on the next live server when it fails (then the log is replayed)."""
        candidates = [self.url] if first and not self.pool.stats[self.url].dead else []
        candidates += [u for u in self.pool.live_after(self.url) if u not in candidates]
        errors = []
        for url in candidates:
            try:
                env = self.pool.connect(url, self.time_limit)
                self._replay(env, url)
            except SERVER_FAILURES as e:
                self.pool.mark_dead(url, e)
                errors.append(f"{url} ({type(e).__name__}: {e})")
                continue
            if url != self.url:
                self.pool.stats[self.url].failovers += 1
                logger.info("env moved from %s to %s (%d calls replayed)", self.url, url, len(self._log))
            self._env, self.url = env, url
            return
        dead = ", ".join(s.url + (f" ({s.error})" if s.error else "") for s in self.pool.stats.values() if s.dead)
        raise EnvServerError(f"no live env server left for this episode (dead: {dead or ', '.join(errors)}); restart "
                             f"the server(s) with `echorl serve-env --task {self.pool.task}` and resume the run "
                             "(--resume)")

    def _replay(self, env: gym.Env, url: str) -> None:
        """Replay the log on ``env``; a result that differs from the recorded one is an :class:`EnvServerError`."""
        stats = self.pool.stats[url]
        for n, (kind, arg, digest) in enumerate(self._log):
            if kind == "reset":
                obs, _ = env.reset(seed=arg[0], options=arg[1])
                got = _digest(obs, 0.0, False, False)
            else:
                obs, r, term, trunc, _ = env.step(arg)
                got = _digest(obs, r, term, trunc)
                stats.replayed_steps += 1
            if got != digest:
                with contextlib.suppress(*SERVER_FAILURES):
                    env.close()
                raise EnvServerError(f"replaying this env's episode on {url} after {self.url} failed gave a different "
                                     f"observation at call {n} ({kind} {arg!r}); the servers do not run the same env "
                                     f"(check that every --env-url serves {self.pool.task} from the same echorl "
                                     "version)")

    def _call(self, kind: str, arg: Any) -> tuple:
        while True:
            env, url = self._env, self.url
            t0 = time.perf_counter()
            try:
                if kind == "reset":
                    out = env.reset(seed=arg[0], options=arg[1])
                else:
                    out = env.step(arg)
            except SERVER_FAILURES as e:
                self.pool.mark_dead(url, e)
                with contextlib.suppress(Exception):
                    env.close()
                self._open()  # raises EnvServerError when no server is left
                continue
            stats = self.pool.stats[url]
            stats.wait_s += time.perf_counter() - t0
            if kind == "reset":
                stats.resets += 1
            else:
                stats.env_steps += 1
            return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._log.clear()  # everything before a seeded reset no longer matters for what comes next
        obs, info = self._call("reset", (seed, options))
        self._log.append(("reset", (seed, options), _digest(obs, 0.0, False, False)))
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, r, term, trunc, info = self._call("step", action)
        self._log.append(("step", action, _digest(obs, r, term, trunc)))
        return obs, r, term, trunc, info

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            with contextlib.suppress(Exception):
                env.close()
        super().close()
