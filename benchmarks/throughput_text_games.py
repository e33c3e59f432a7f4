"""ALFWorld and TextWorld rows of ``benchmarks/env_throughput.py`` (registered there as ``alfworld``/``textworld``).

Two measurements per id, each side by side in one run:

* ``text`` -- our env (``gym.make(id, ...)``) ÷ the raw engine stack it wraps (for ALFWorld: textworld's
  ``PddlEnv`` + alfworld's ``AlfredDemangler``/``AlfredInfos``, as ``AlfredTWEnv`` builds it; for TextWorld:
  ``textworld.start`` on the same compiled game), replaying the same admissible-command sequences on the
  same games. Only ``step`` calls are timed; rewards must agree.
* ``async 2 ÷ 1`` -- ``AsyncVectorEnv`` with 2 workers ÷ with 1 worker, env steps per second (random
  admissible commands, autoreset), i.e. how well the engine scales across processes on this machine.
* ``step_timeout on ÷ off`` -- our env with its default per-step engine timeout (engine calls on a worker thread,
  :class:`echorl_envs.core.EngineCaller`) ÷ the same env with ``step_timeout=None`` (direct calls), same plays,
  alternated; rewards must agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

import echorl_envs


def _record(env: gym.Env, index: int, n: int, seed: int) -> list[str]:
    """A random admissible-command sequence of length <= ``n`` on game ``index`` (one episode)."""
    rng = np.random.default_rng(seed + index)
    _, info = env.reset(options={"index": index})
    out: list[str] = []
    for _ in range(n):
        a = info["admissible_actions"][int(rng.integers(len(info["admissible_actions"])))]
        out.append(a)
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            break
    return out


def _time_ours(env: gym.Env, plays: list[tuple[int, list[str]]]) -> tuple[float, float]:
    busy, total, steps = 0.0, 0.0, 0
    for index, actions in plays:
        env.reset(options={"index": index})
        for a in actions:
            t0 = time.perf_counter()
            _, r, _, _, _ = env.step(a)
            busy += time.perf_counter() - t0
            total += r
            steps += 1
    return steps / busy, total


def _time_raw(make_raw: Callable[[int], Any], plays: list[tuple[int, list[str]]],
              reward: Callable[[Any, Any], float]) -> tuple[float, float]:
    busy, total, steps = 0.0, 0.0, 0
    for index, actions in plays:
        raw = make_raw(index)
        prev = raw.reset()
        for a in actions:
            t0 = time.perf_counter()
            st, _score, _done = raw.step(a)
            busy += time.perf_counter() - t0
            total += reward(prev, st)
            prev = st
            steps += 1
    return steps / busy, total


def _async_ratio(env_id: str, kwargs: dict, steps: int, seed: int) -> tuple[float, float]:
    def run(n_envs: int) -> float:
        venv = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id, **kwargs)] * n_envs, shared_memory=False)
        try:
            rng = np.random.default_rng(seed)
            _, infos = venv.reset(seed=list(range(seed, seed + n_envs)))
            for _ in range(3):  # warm-up: first games may be loaded/generated
                acts = [a[int(rng.integers(len(a)))] if len(a) else "look" for a in infos["admissible_actions"]]
                _, _, _, _, infos = venv.step(tuple(acts))
            t0 = time.perf_counter()
            for _ in range(steps):
                acts = [a[int(rng.integers(len(a)))] if len(a) else "look" for a in infos["admissible_actions"]]
                _, _, _, _, infos = venv.step(tuple(acts))
            return steps * n_envs / (time.perf_counter() - t0)
        finally:
            venv.close()

    return run(2), run(1)


def _bench(family: str, args: Any, make_raw: Callable[[gym.Env, int], Any], reward: Callable[[Any, Any], float],
           kwargs: dict, row_cls: type) -> list:
    rows = []
    steps = max(20, args.steps // 20)
    for env_id in [e for e in (args.envs or echorl_envs.env_ids(family)) if e in echorl_envs.env_ids(family)]:
        games = getattr(args, "games", 3)
        kwargs = {**kwargs, "num_games": games}  # a small pool, generated before any timing
        env = gym.make(env_id, **kwargs)
        plays = [(i, _record(env, i, steps, args.seed)) for i in range(games)]
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):
            for name in ("ours", "raw"):
                if name == "ours":
                    sps, total = _time_ours(env, plays)
                else:
                    sps, total = _time_raw(partial(make_raw, env), plays, reward)
                if name not in best or sps > best[name][0]:
                    best[name] = (sps, total)
        rows.append(row_cls(family, env_id.removeprefix("EchoRL/"), "text, random admissible", best["ours"][0],
                            best["raw"][0], abs(best["ours"][1] - best["raw"][1]) < 1e-9))
        direct = gym.make(env_id, **kwargs, step_timeout=None)
        timed: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):
            for name, e in (("on", env), ("off", direct)):
                sps, total = _time_ours(e, plays)
                if name not in timed or sps > timed[name][0]:
                    timed[name] = (sps, total)
        direct.close()
        rows.append(row_cls(family, env_id.removeprefix("EchoRL/"), "step_timeout on / off (ours/raw cols)",
                            timed["on"][0], timed["off"][0], abs(timed["on"][1] - timed["off"][1]) < 1e-9))
        two, one = _async_ratio(env_id, kwargs, steps, args.seed)
        rows.append(row_cls(family, env_id.removeprefix("EchoRL/"), "async 2 workers / 1 (ours/raw cols)", two, one,
                            True))
        env.close()
    return rows


def bench_alfworld(args: Any, row_cls: type) -> list:
    """ALFWorld ids (expert off on both sides) ÷ alfworld's wrapper stack over textworld's PddlEnv."""
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld import EnvInfos
    from textworld.envs import PddlEnv

    def make_raw(env: gym.Env, index: int) -> Any:
        raw = AlfredInfos(AlfredDemangler(PddlEnv(EnvInfos(admissible_commands=True, won=True,
                                                           extras=["gamefile"])), shuffle=False))
        raw.load(str(env.unwrapped.game_path(index)))
        return raw

    return _bench("alfworld", args, make_raw, lambda prev, st: float(st["won"]), {"expert": False}, row_cls)


def bench_textworld(args: Any, row_cls: type) -> list:
    """TextWorld ids ÷ ``textworld.start`` on the same compiled games (same infos requested)."""
    import textworld

    def make_raw(env: gym.Env, index: int) -> Any:
        infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True,
                                   score=True, max_score=True, objective=True)
        return textworld.start(str(env.unwrapped.game_path(index)), request_infos=infos)

    return _bench("textworld", args, make_raw, lambda prev, st: float(st["score"] - prev["score"]), {}, row_cls)


def register(benchmarks: dict, row_cls: type) -> None:
    """Add the ``alfworld`` and ``textworld`` entries to ``env_throughput.BENCHMARKS``."""
    benchmarks["alfworld"] = lambda args: bench_alfworld(args, row_cls)
    benchmarks["textworld"] = lambda args: bench_textworld(args, row_cls)
