"""Where a run's rollouts play: ``backend="local"`` (this process) or ``"ray"`` (``--rollout-workers N`` Ray actors,
:mod:`echorl_agent.llm_rl.ray_workers`), and the checks of those two options.

Kept apart from the Ray workers so that a config can be checked without importing Ray or torch.
"""

from __future__ import annotations

import difflib
import importlib.util
from typing import Any

__all__ = ["BACKENDS", "check_backend", "import_ray"]

BACKENDS = ("local", "ray")
"""``train-llm --backend``: ``local`` plays every group in this process; ``ray`` on ``--rollout-workers`` actors."""

_INSTALL = "pip install 'echorl[ray]' (Ray >= 2.30)"


def import_ray() -> Any:
    """The ``ray`` module, or a ValueError naming ``--backend ray`` and how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ValueError(f"--backend ray needs Ray, which is not installed: {_INSTALL}, or drop --backend ray "
                         "(--backend local plays the groups in this process)") from e
    return ray


def check_backend(backend: Any, rollout_workers: Any, learner: str, groups: int, policy_kwargs: dict[str, Any],
                  max_policy_lag: Any = 0) -> None:
    """ValueError naming the flag and the fix for a backend the run cannot use.

    Args:
        backend: ``--backend``.
        rollout_workers: ``--rollout-workers``.
        learner: the run's learner (registry name); only GiGPO groups play on Ray workers.
        groups: the run's groups per iteration (``n_envs // group_size``); each worker plays whole groups.
        policy_kwargs: the run's policy options (a remote ``rollout_url`` excludes Ray workers).
        max_policy_lag: ``--max-policy-lag``: iterations the workers play ahead of the learner.
    """
    if backend not in BACKENDS:
        close = difflib.get_close_matches(str(backend), BACKENDS, n=1)
        raise ValueError(f"backend must be one of {BACKENDS} (--backend), got backend={backend!r}"
                         + (f"; did you mean --backend {close[0]}?" if close else ""))
    if isinstance(rollout_workers, bool) or not isinstance(rollout_workers, int) or rollout_workers < 1:
        raise ValueError(f"rollout_workers must be an int >= 1 (--rollout-workers N: N Ray actors, each with its own "
                         f"engine, play a share of every iteration's groups), got rollout_workers={rollout_workers!r}; "
                         "use --rollout-workers 1 or more")
    if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 0:
        raise ValueError(f"max_policy_lag must be an int >= 0 (--max-policy-lag K: the workers play up to K iterations "
                         f"ahead of the learner; 0 is on-policy), got max_policy_lag={max_policy_lag!r}")
    if backend == "local":
        if max_policy_lag:
            raise ValueError(f"max_policy_lag={max_policy_lag} needs --backend ray (a local run plays each iteration "
                             "with the learner's current weights); add --backend ray, or drop --max-policy-lag")
        if rollout_workers > 1:
            raise ValueError(f"rollout_workers={rollout_workers} needs --backend ray (the local backend plays every "
                             "group in this process); add --backend ray, or drop --rollout-workers")
        return
    if learner != "gigpo":
        raise ValueError(f"--backend ray plays GiGPO groups on rollout workers (methods gigpo, bc+gigpo, echorl with "
                         f"the gigpo learner); the {learner} learner rolls out in this process: use --backend local")
    if rollout_workers > groups:
        raise ValueError(f"rollout_workers={rollout_workers} exceeds the {groups} group(s) per iteration (n_envs / "
                         f"group_size) and each worker plays whole groups: raise --n-envs to at least "
                         f"{rollout_workers} x --group-size, or use --rollout-workers {groups}")
    if policy_kwargs.get("rollout_url"):
        raise ValueError("--backend ray and policy_kwargs rollout_url both move the rollouts out of this process; "
                         "drop one of them")
    if importlib.util.find_spec("ray") is None:
        import_ray()  # raises the ValueError naming --backend ray
