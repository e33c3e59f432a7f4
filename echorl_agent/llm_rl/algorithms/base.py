"""The one protocol every LLM-RL method's trainer follows (:class:`MethodTrainer`), and the parts they share.

:func:`~echorl_agent.llm_rl.train.train_llm` drives every method the same way::

    trainer = Trainer.build(run, method, lm, progress, heldout)  # envs + policy from the run's env and policy config
    trainer.load(checkpoint)                    # resume ...
    trainer.start(warm)                         # ... or start: held-out "before", the warm start (BC, oracle answers)
    trainer.train(run.train_steps)              # learn, checkpoint every run.checkpoint_every, write the outputs
    trainer.close()
    return trainer.model                        # LLMPPO, GiGPOTrainer, GRPOTrainer, ...

A trainer also evaluates (``evaluate``), saves a checkpoint on demand (``save``) and reports one metrics row per
iteration (``metrics``), so a bench or a held-out evaluation can treat every method alike.
"""

from __future__ import annotations

import csv
import warnings
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from echorl_agent.llm_rl.curve import write_curve

if TYPE_CHECKING:
    from echorl_agent.llm_rl.algorithms.registry import Method

__all__ = ["EpisodeCurve", "MethodTrainer", "open_tensorboard", "warn_finished", "write_metrics"]


@runtime_checkable
class MethodTrainer(Protocol):
    """What a method's trainer offers :func:`~echorl_agent.llm_rl.train.train_llm` (see the module docstring).

    ``run`` is the :class:`~echorl_agent.llm_rl.train.LLMTrainConfig` of the run (env, seed, budget, output folder,
    ``policy_kwargs`` and the method's options); ``method`` its registry entry.
    """

    model: Any
    """What ``train_llm`` returns: the trained model (its ``policy`` acts; e.g. :class:`LLMPPO`, a GiGPO trainer)."""

    @classmethod
    def build(cls, run: Any, method: Method, lm: Any = None, progress: Any = None,
              heldout: Any = None) -> MethodTrainer:
        """Envs and policy from the run's env and policy config (``lm``: an already loaded
        :class:`~echorl_agent.llm_rl.lm.TrainableLM` to train instead of loading the run's model; ``progress``: the
        run's :class:`~echorl_agent.llm_rl.progress.RunProgress`; ``heldout``: its
        :class:`~echorl_agent.llm_rl.heldout.HeldOutEval`, None without held-out evaluation). A trainer whose
        episodes can run on env servers also takes ``servers`` (an
        :class:`~echorl_agent.llm_rl.env_servers.EnvServerPool`, passed only with ``--env-url``)."""
        ...

    @property
    def num_timesteps(self) -> int:
        """Env steps (GRPO: sampled completions) trained so far, counting a resumed run's earlier ones."""
        ...

    def finished(self) -> bool:
        """Whether nothing is left to train for ``run.train_steps`` (a resumed, finished run)."""
        ...

    def start(self, warm: bool, resume: bool = False) -> None:
        """A fresh run's first stage: the held-out "before" point, then with ``warm`` the method's warm start
        (``Method.warm_start``) and the "after_bc" point. ``resume``: the run was cut during its warm start, which
        goes on from its stage checkpoint (``<out>/bc_stage/``; a "before" point already played is not played
        again)."""
        ...

    def warm_start(self, resume: bool = False) -> None:
        """The method's warm-start stage before RL (BC on the expert, oracle answers); ``resume``: from its stage
        checkpoint where there is one."""
        ...

    def train(self, env_steps: int) -> None:
        """Train until ``env_steps`` since the run's start; checkpoint every ``run.checkpoint_every`` iterations and
        at the end, write the run's outputs (``curve.csv``, the adapter, the method's own files) and play the
        held-out "after" point."""
        ...

    def evaluate(self, seeds: Sequence[int], deterministic: bool = True) -> list[float]:
        """One episode (or answer) per seed, no learning: the success of each, in seed order."""
        ...

    def save(self) -> Path:
        """Write ``<run.out>/checkpoint/`` (:mod:`echorl_agent.llm_rl.checkpoint`) and return its path."""
        ...

    def load(self, checkpoint: tuple[Path, dict[str, Any]]) -> None:
        """Continue from a verified checkpoint (:func:`~echorl_agent.llm_rl.checkpoint.open_checkpoint`)."""
        ...

    def metrics(self) -> list[dict[str, float]]:
        """One row per iteration (loss, success, timing...), the run's own since its start."""
        ...

    def close(self) -> None:
        """Release envs and writers."""
        ...


def warn_finished(run: Any, timesteps: int, stacklevel: int = 3) -> None:
    """Warn (at ``train_llm``'s caller) that a resumed run has nothing left to do."""
    warnings.warn(f"nothing to resume: the checkpoint in {run.out} is at {timesteps} env steps, train_steps="
                  f"{run.train_steps} (raise train_steps to train on)", stacklevel=stacklevel)


class EpisodeCurve:
    """SB3 callback collecting (env steps, rolling success over 20 episodes, return) at every finished episode, and
    the held-out points; ``write`` gives ``curve.csv`` (:mod:`echorl_agent.llm_rl.curve`)."""

    def __init__(self, path: Path | None) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self
        self.path, self.rows, self.recent = path, [], deque(maxlen=20)
        self.heldout: list[dict] = []

        class CB(BaseCallback):
            def _on_step(self) -> bool:
                for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                    if done:
                        outer.recent.append(float(info.get("won", False)))
                        ret = float(info.get("episode", {}).get("r", np.nan))
                        outer.rows.append((self.num_timesteps, float(np.mean(outer.recent)), ret))
                        self.logger.record("rollout/success_rate_20", float(np.mean(outer.recent)))
                return True

        self.callback = CB()

    def write(self) -> None:
        if self.path is not None:
            write_curve(self.path, self.rows, self.heldout)


def write_metrics(path: Path, rows: Sequence[dict[str, float]]) -> None:
    """One CSV row per iteration, every key of every row in first-seen order (a run resumed from an older
    checkpoint gains new columns)."""
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for h in rows for k in h)))
        w.writeheader()
        w.writerows(rows)


def open_tensorboard(out: Path | None, purge_step: int | None = None) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``<out>/tb`` (None without ``out`` or without tensorboard);
    ``purge_step`` hides what an interrupted run logged after its checkpoint."""
    if out is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # pragma: no cover - tensorboard is an SB3 extra
        return None
    return SummaryWriter(str(out / "tb"), purge_step=purge_step)
