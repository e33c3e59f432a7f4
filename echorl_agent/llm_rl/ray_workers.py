"""GiGPO groups on Ray rollout workers (``echorl train-llm --backend ray --rollout-workers N``).

The learner (this process) keeps the optimizer, the advantages and the update; each :class:`RolloutWorker` is a Ray
actor (one CPU) that holds its own :class:`~echorl_agent.llm_rl.policy.LLMPolicy` -- a rollout engine replica built
from the learner policy's own config -- and its own envs (in-process, or sessions on the run's ``--env-url``
servers). One iteration (:meth:`RayRolloutPool.collect`):

1. weights -- a worker whose weights are older than the learner's gets the policy's trained weights (LoRA adapters,
   value and plan heads: :meth:`LLMPolicy.state_dict`, put once in the object store) with their version (the
   learner engine's ``weight_version``); loading them merges the adapters into the worker's engine;
2. play -- the iteration's group seeds are split into ``N`` contiguous chunks of whole groups, one per worker, each
   played by :func:`~echorl_agent.llm_rl.rollout.collect_groups` with a torch generator state sent along: with one
   worker, the learner's own generator (so ``N=1`` takes the local run's samples, and gives its ``curve.csv`` bit
   for bit with one torch thread), with more, one generator per chunk seeded from the learner's;
3. gather -- the episodes come back in seed order, each stamped with the ``policy_version`` that acted, with the
   records' captured activations (so the learner still runs only its trained layers).

By default the push is synchronous: every episode is played by the learner's current weights (policy lag 0), so the
truncated importance weight ``min(pi_old / pi_rollout, C)`` of :func:`~echorl_agent.llm_rl.learner.update_policy`
corrects the rollout/learner numerics only, as in a local run. With ``max_policy_lag`` K > 0 (``--max-policy-lag``,
prime-rl's ``async_level``, verl's one-step off-policy for K=1) the pool keeps the next K iterations queued on the
workers, sent with the weights of the moment, so the workers play while the learner updates: an iteration's episodes
were played by weights up to K versions old (``policy_lag_max`` in ``gigpo.csv``), and the same truncated
importance weight, with ``pi_rollout`` the old policy, bounds their correction. The frozen layers below the trained
ones never change, so the captured activations stay exact. Each chunk then samples from its own generator (seeded
from the learner's at sending time). A resumed run starts with nothing queued: the queued iterations' seeds were
drawn and are skipped, so only an on-policy run resumes exactly.

A worker that dies (:class:`ray.exceptions.RayActorError`: killed, out of memory, its node lost) is replaced by a
new actor that gets the same weights and replays the chunk from its seeds and generator state: the replayed episodes
are the ones the dead worker would have returned, so none is dropped or counted twice. An exception raised inside
``play`` (an env server with no live replica left, a bug) is not a death: it propagates as the run's error.

With ``--env-url``, worker ``w``'s env ``i`` starts on server ``(w * n + i) mod len(urls)`` and fails over as
:mod:`~echorl_agent.llm_rl.env_servers` describes; each worker's per-server counts are added to the learner's
:class:`~echorl_agent.llm_rl.env_servers.EnvServerPool` (``servers.json``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from echorl_agent.llm_rl.backend import import_ray
from echorl_agent.llm_rl.rollout import Episode, collect_groups, make_choice_env

__all__ = ["WorkerSpec", "RolloutWorker", "RayRolloutPool"]

log = logging.getLogger(__name__)


@dataclass
class WorkerSpec:
    """What a :class:`RolloutWorker` builds its envs and policy from (picklable; no tensors)."""

    env_id: str
    history: int
    group_size: int
    policy_kwargs: dict[str, Any]
    """The learner policy's :class:`~echorl_agent.llm_rl.config.LLMPolicyConfig` fields (``planning`` included)."""
    lm_kwargs: dict[str, Any]
    """The config its :class:`~echorl_agent.llm_rl.lm.TrainableLM` was built with (it may have come loaded)."""
    max_episode_steps: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_urls: list[str] = field(default_factory=list)
    """``--env-url`` servers (empty: in-process envs)."""
    env_step_timeout_s: float = 120.0
    num_threads: int = 1
    """torch threads of the worker (Ray gives each actor one CPU)."""


def _compact(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` without the rest of a larger storage it may view (pickling a view sends the whole storage)."""
    if t is None or t.untyped_storage().nbytes() <= t.numel() * t.element_size():
        return t
    return t.clone()


class RolloutWorker:
    """One rollout worker (a Ray actor when made by :class:`RayRolloutPool`; a plain object works the same).

    Args:
        spec: envs and policy to build.
        index: the worker's place in the pool (spreads its envs over the env servers).
        n_workers: the pool's size.
    """

    def __init__(self, spec: WorkerSpec, index: int = 0, n_workers: int = 1) -> None:
        from stable_baselines3.common.utils import ConstantSchedule

        from echorl_agent.llm_rl.config import LLMPolicyConfig
        from echorl_agent.llm_rl.lm import TrainableLM
        from echorl_agent.llm_rl.policy import LLMPolicy

        torch.set_num_threads(spec.num_threads)
        self.spec, self.index, self.n_workers = spec, index, n_workers
        self.servers = None
        if spec.env_urls:
            from echorl_agent.llm_rl.env_servers import EnvServerPool

            self.servers = EnvServerPool(spec.env_urls, spec.env_id, spec.env_step_timeout_s)
        probe = make_choice_env(spec.env_id, spec.history, spec.max_episode_steps, spec.env_kwargs)
        lm = TrainableLM(LLMPolicyConfig.from_kwargs(**spec.lm_kwargs))
        self.policy = LLMPolicy(probe.observation_space, probe.action_space, ConstantSchedule(1.0), lm=lm,
                                **spec.policy_kwargs)
        probe.close()
        self.envs: list[Any] = []
        self.version: int | None = None

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Load the learner policy's trained weights (merged into this worker's engine); returns ``version``."""
        self.policy.load_state_dict(state)
        self.version = int(version)
        return self.version

    def _envs(self, n: int) -> list[Any]:
        spec = self.spec
        while len(self.envs) < n:
            i = len(self.envs)
            if self.servers is not None:
                env = self.servers.choice_env(self.index * n + i, spec.history, spec.max_episode_steps)
            else:
                env = make_choice_env(spec.env_id, spec.history, spec.max_episode_steps, spec.env_kwargs, encode=False)
            self.envs.append(env)
        return self.envs[:n]

    def play(self, seeds: list[int], generator_state: torch.Tensor, version: int) -> dict[str, Any]:
        """Play ``group_size`` episodes from each seed with weights ``version``.

        Returns:
            ``episodes`` (groups numbered from 0 in ``seeds`` order, each with ``policy_version``), ``generator``
            (the generator's state after the samples) and ``servers`` (per-server counts of this call, with
            ``--env-url``).
        """
        if version != self.version:
            raise RuntimeError(f"worker {self.index} holds weights version {self.version}, asked to play version "
                               f"{version} (set_weights first)")
        gen = torch.Generator()
        gen.set_state(generator_state)
        before = self._server_counts()
        episodes = collect_groups(self.policy, self._envs(len(seeds) * self.spec.group_size), seeds,
                                  self.spec.group_size, gen)
        for e in episodes:
            e.policy_version = self.version
            for s in e.steps:
                r = s.record
                r.context_states = _compact(r.context_states)
                if r.cand_states is not None:
                    r.cand_states = [_compact(c) for c in r.cand_states]
        after = self._server_counts()
        servers = {u: {k: v - before[u][k] for k, v in c.items()} | {"dead": self.servers.stats[u].dead,
                                                                        "error": self.servers.stats[u].error}
                   for u, c in after.items()}
        return {"episodes": episodes, "generator": gen.get_state(), "servers": servers}

    def _server_counts(self) -> dict[str, dict[str, float]]:
        if self.servers is None:
            return {}
        keys = ("env_steps", "resets", "wait_s", "replayed_steps", "failovers")
        return {u: {k: getattr(s, k) for k in keys} for u, s in self.servers.stats.items()}


@dataclass
class _Job:
    """One worker's chunk of one iteration: what to play, with which weights and generator, and the pending call."""

    worker: int
    seeds: list[int]
    generator: torch.Tensor
    version: int
    ref: Any = None


class RayRolloutPool:
    """``n_workers`` :class:`RolloutWorker` actors playing a trainer's groups (see the module docstring).

    Args:
        spec: what each worker builds.
        n_workers: ``--rollout-workers``.
        servers: the learner's :class:`~echorl_agent.llm_rl.env_servers.EnvServerPool` (``--env-url``): the
            workers' per-server counts are added to it.
        max_policy_lag: iterations played ahead of the learner (0: on-policy, every episode played by the learner's
            current weights).
        max_restarts: replacements of dead workers allowed per chunk before the run fails.
    """

    def __init__(self, spec: WorkerSpec, n_workers: int, servers: Any = None, max_policy_lag: int = 0,
                 max_restarts: int = 3) -> None:
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"rollout_workers must be an int >= 1 (--rollout-workers), got {n_workers!r}")
        if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be an int >= 0 (--max-policy-lag), got {max_policy_lag!r}")
        self.spec, self.n_workers, self.servers = spec, n_workers, servers
        self.max_policy_lag, self.max_restarts = max_policy_lag, max_restarts
        self.restarts = 0
        """Dead workers replaced so far."""
        self.last_lag = 0
        """The latest iteration's largest lag: learner weights version minus the version that played an episode."""
        self._ray: Any = None
        self._started_ray = False
        self._actor: Any = None
        self.workers: list[Any] = []
        self._held: list[int | None] = []  # the weights version each worker holds once its queued calls ran
        self._weights: dict[int, Any] = {}  # version -> object ref of the policy state (versions still queued)
        self._ahead: deque[list[_Job]] = deque()  # iterations sent ahead of the learner (max_policy_lag > 0)

    # ------------------------------------------------------------------ workers
    def start(self) -> None:
        """Start Ray (a local cluster of ``n_workers`` CPUs unless one is already initialized) and the actors."""
        if self.workers:
            return
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            # as `echorl bench --backend ray`: no dashboard, one thread per worker, workers at normal priority
            threads = str(self.spec.num_threads)
            ray.init(num_cpus=self.n_workers, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}},
                     _system_config={"worker_niceness": 0})
            self._started_ray = True
        self._actor = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.workers = [self._new_worker(i) for i in range(self.n_workers)]
        self._held = [None] * self.n_workers
        log.info("%d Ray rollout workers started", self.n_workers)

    def _new_worker(self, i: int) -> Any:
        return self._actor.remote(self.spec, i, self.n_workers)

    def _restart(self, i: int, error: BaseException, pending: list[_Job]) -> None:
        """Replace dead worker ``i`` and send it again, in order, every job it had not returned."""
        log.warning("rollout worker %d died (%s: %s); a new one replays its groups", i, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "")
        try:
            self._ray.kill(self.workers[i])
        except Exception:  # noqa: BLE001 - the actor is already gone
            pass
        self.workers[i] = self._new_worker(i)
        self._held[i] = None
        self.restarts += 1
        for job in pending:
            self._send(job)

    def close(self) -> None:
        """Stop the actors (and the local Ray cluster this pool started); iterations sent ahead are dropped."""
        ray = self._ray
        if ray is None:
            return
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.workers, self._weights, self._ahead = [], {}, deque()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    # ------------------------------------------------------------------ one iteration
    def _send(self, job: _Job) -> None:
        """Queue ``job`` on its worker, after the weights of its version when the worker will hold others."""
        i = job.worker
        if self._held[i] != job.version:
            self.workers[i].set_weights.remote(self._weights[job.version], job.version)
            self._held[i] = job.version
        job.ref = self.workers[i].play.remote(job.seeds, job.generator, job.version)

    def _dispatch(self, trainer: Any, version: int, own_generator: bool) -> list[_Job]:
        """Send the next iteration's groups (``trainer.next_seeds()``) to the workers with weights ``version``."""
        seeds = trainer.next_seeds()
        chunks = [c.tolist() for c in np.array_split(np.asarray(seeds, dtype=np.int64), self.n_workers) if len(c)]
        if own_generator:  # one worker, on-policy: it samples from the learner's generator, as a local run
            states = [trainer.generator.get_state()]
        else:  # one stream per chunk, drawn from the learner's generator (a replayed chunk draws the same samples)
            draws = torch.randint(0, 2**62, (len(chunks),), generator=trainer.generator).tolist()
            states = [torch.Generator().manual_seed(int(d)).get_state() for d in draws]
        jobs = [_Job(i, chunk, states[i], version) for i, chunk in enumerate(chunks)]
        for job in jobs:
            self._send(job)
        return jobs

    def collect(self, trainer: Any) -> list[Episode]:
        """The next iteration's episodes (``trainer.next_seeds()``, ``trainer.cfg.group_size`` per seed, in seed
        order), played on the workers; ``trainer.generator`` advances as the samples drew from it.

        On-policy (``max_policy_lag`` 0) they play ``trainer.policy``'s current weights. Otherwise the iterations up
        to ``max_policy_lag`` ahead are sent now, with the current weights, before this one is gathered; this one was
        sent ``max_policy_lag`` iterations ago (lag <= ``max_policy_lag``, corrected by the learner's truncated
        importance weights)."""
        self.start()
        version = int(trainer.policy.lm.engine.weight_version)
        if version not in self._weights:
            state = {k: v.detach().cpu() for k, v in trainer.policy.state_dict().items()}
            self._weights[version] = self._ray.put(state)
        own = self.max_policy_lag == 0 and min(self.n_workers, trainer.cfg.groups) == 1
        jobs = self._ahead.popleft() if self._ahead else self._dispatch(trainer, version, own)
        while len(self._ahead) < self.max_policy_lag:
            self._ahead.append(self._dispatch(trainer, version, False))
        results = [self._gather(job) for job in jobs]
        if own:
            trainer.generator.set_state(results[0]["generator"])
        keep = {j.version for it in self._ahead for j in it}
        self._weights = {v: r for v, r in self._weights.items() if v in keep or v == version}
        episodes: list[Episode] = []
        offset = 0
        for job, res in zip(jobs, results, strict=True):
            for e in res["episodes"]:
                e.group += offset
            episodes += res["episodes"]
            offset += len(job.seeds)
            self._add_server_counts(res["servers"])
        self.last_lag = max(version - e.policy_version for e in episodes)
        return episodes

    def _gather(self, job: _Job) -> dict:
        """``job``'s result; a dead worker is replaced and its jobs replayed (same seeds, generator and weights)."""
        from ray.exceptions import RayActorError

        for attempt in range(self.max_restarts + 1):
            try:
                return self._ray.get(job.ref)
            except RayActorError as e:
                if attempt == self.max_restarts:
                    raise RuntimeError(f"rollout worker {job.worker} died {attempt + 1} times on the groups of seeds "
                                       f"{job.seeds} (last: {e}); check the workers' memory (each holds an engine "
                                       "replica) or run with fewer --rollout-workers") from e
                pending = [job] + [j for it in self._ahead for j in it if j.worker == job.worker]
                self._restart(job.worker, e, pending)
        raise AssertionError("unreachable")

    def _add_server_counts(self, counts: dict[str, dict[str, Any]]) -> None:
        if self.servers is None:
            return
        for url, c in counts.items():
            s = self.servers.stats[url]
            for k in ("env_steps", "resets", "wait_s", "replayed_steps", "failovers"):
                setattr(s, k, getattr(s, k) + c[k])
            if c["dead"] and not s.dead:
                s.dead, s.error = True, c["error"]

    def stats(self) -> dict[str, float]:
        """Per-iteration columns of ``gigpo.csv``: workers, dead workers replaced so far, the iteration's largest
        policy lag."""
        return {"rollout_workers": float(self.n_workers), "worker_restarts": float(self.restarts),
                "policy_lag_max": float(self.last_lag)}


def worker_spec(run: Any, policy: Any) -> WorkerSpec:
    """The :class:`WorkerSpec` of a train-llm run (an :class:`~echorl_agent.llm_rl.train.LLMTrainConfig`) whose
    learner policy is ``policy`` (the workers copy its config, so they score as its engine does)."""
    def kwargs(cfg: Any) -> dict[str, Any]:
        return {**dataclasses.asdict(cfg), "planning": cfg.planning}

    return WorkerSpec(env_id=run.env_id, history=run.history, group_size=run.group_size,
                      policy_kwargs=kwargs(policy.cfg), lm_kwargs=kwargs(policy.lm.cfg),
                      max_episode_steps=run.max_episode_steps, env_kwargs=dict(run.env_kwargs),
                      env_urls=list(run.env_urls), env_step_timeout_s=run.env_step_timeout_s,
                      num_threads=1)
