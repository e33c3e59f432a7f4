"""ExperienceBank: step-level records of past rollouts, retrieved to guide a frozen agent (no weight updates).

Each rollout is stored with its instruction embedding, its outcome (success, length, return) and one record per
step (observation, action, next observation, reward) keyed by the mean–max fused key of the observation
(:mod:`echorl_agent.experience.keys`). Successes and failures are both kept: a failure shows what not to do.

**Retrieve-then-sample** for a query (instruction ``g``, observation ``o``):

1. filter: the ``top_n`` rollouts whose instruction embedding is closest (cosine) to ``g``;
2. retrieve: among their steps, the ``top_k`` whose key is closest to ``key(o)`` (similarity ``s_i``);
3. sample one with ``P(i) ∝ exp((s_i + beta * e_i) / tau)``, where the efficiency prior
   ``e_i = 1[success] * L_min / L_i`` favours shorter successful rollouts (``L_i`` the rollout's length,
   ``L_min`` the shortest successful one among the ``top_n``; failures get ``e_i = 0``).

The bank grows online (:meth:`ExperienceBank.begin_episode` / :meth:`record` / :meth:`end_episode`, or
:meth:`add_rollout`) and persists atomically (:meth:`save` writes a temporary file next to the target, fsyncs it and
``os.replace``-s it in, so a crash never leaves a half-written bank).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from echorl_agent.experience.keys import KeyEncoder, make_key_encoder

__all__ = ["ExperienceConfig", "StepRecord", "RolloutRecord", "Retrieved", "ExperienceBank"]

_FORMAT = "echorl-experience-bank-v1"


@dataclass
class ExperienceConfig:
    """Retrieval knobs of :class:`ExperienceBank` (module docstring)."""

    top_n: int = 16
    """Rollouts kept by the instruction filter."""
    top_k: int = 5
    """Steps kept by key similarity, among which one is sampled."""
    temperature: float = 0.05
    """tau of the softmax over ``s_i + beta * e_i``."""
    efficiency_weight: float = 0.05
    """beta: weight of the efficiency prior."""
    max_rollouts: int | None = None
    """Oldest rollouts are dropped beyond this many (None = unbounded)."""

    def __post_init__(self) -> None:
        for name in ("top_n", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={v!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got temperature={self.temperature}; e.g. temperature=0.05")
        if self.efficiency_weight < 0:
            raise ValueError(f"efficiency_weight must be >= 0, got efficiency_weight={self.efficiency_weight}")
        if self.max_rollouts is not None and self.max_rollouts < 1:
            raise ValueError(f"max_rollouts must be >= 1 or None, got max_rollouts={self.max_rollouts}")


@dataclass
class StepRecord:
    """One stored step."""

    rollout: int
    t: int
    observation: str
    action: str
    next_observation: str
    reward: float


@dataclass
class RolloutRecord:
    """One stored rollout (its steps live in the bank's step table)."""

    id: int
    instruction: str
    success: bool
    length: int
    total_reward: float
    meta: dict[str, Any] = field(default_factory=dict)


class Retrieved(NamedTuple):
    """A retrieved step with its scores (:meth:`ExperienceBank.retrieve`)."""

    step: StepRecord
    rollout: RolloutRecord
    similarity: float
    """Cosine between the query key and the step key."""
    score: float
    """``similarity + beta * efficiency``."""
    probability: float
    """Its probability under the retrieve-then-sample softmax."""


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ExperienceBank:
    """Step-level experience with retrieve-then-sample (module docstring).

    Args:
        encoder: key encoder: ``"hash"`` (default), ``"minilm"`` or a :class:`KeyEncoder`.
        config: retrieval knobs.
        **encoder_kwargs: arguments of a named encoder (e.g. ``dim=128``).

    Example:
        >>> bank = ExperienceBank("hash", dim=64)
        >>> _ = bank.add_rollout("open the door", [("a closed door", "toggle", "the door is open", 1.0)], True)
        >>> hit = bank.retrieve("open the door", "a closed door")[0]
        >>> hit.step.action, round(hit.similarity, 3), hit.probability
        ('toggle', 1.0, 1.0)
    """

    def __init__(self, encoder: str | KeyEncoder = "hash", config: ExperienceConfig | None = None,
                 **encoder_kwargs: Any) -> None:
        self.encoder = make_key_encoder(encoder, **encoder_kwargs)
        self.config = config or ExperienceConfig()
        self.rollouts: list[RolloutRecord] = []
        self.steps: list[StepRecord] = []
        self._instr = np.zeros((0, self.encoder.instruction_dim), dtype=np.float32)  # [R, d_instr]
        self._keys = np.zeros((0, self.encoder.key_dim), dtype=np.float32)  # [S, key_dim]
        self._step_rollout = np.zeros(0, dtype=np.int64)  # [S] row of the rollout in self.rollouts
        self._next_id = 0
        self._open: dict[str, Any] | None = None

    # ------------------------------------------------------------------ size
    @property
    def num_rollouts(self) -> int:
        return len(self.rollouts)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def __len__(self) -> int:
        return len(self.rollouts)

    # ------------------------------------------------------------------ growing
    def add_rollout(self, instruction: str, steps: Sequence[tuple[str, str, str, float]], success: bool,
                    meta: dict[str, Any] | None = None) -> int:
        """Store a finished rollout: ``steps`` are ``(observation, action, next_observation, reward)``; returns
        its id."""
        steps = list(steps)
        if not steps:
            raise ValueError("a rollout needs at least one step, got steps=[]")
        rid = self._next_id
        self._next_id += 1
        row = len(self.rollouts)
        rec = RolloutRecord(rid, str(instruction), bool(success), len(steps),
                            float(sum(float(s[3]) for s in steps)), dict(meta or {}))
        self.rollouts.append(rec)
        self._instr = np.concatenate([self._instr, self.encoder.instruction([rec.instruction])])
        new = [StepRecord(rid, t, str(o), str(a), str(n), float(r)) for t, (o, a, n, r) in enumerate(steps)]
        self.steps.extend(new)
        self._keys = np.concatenate([self._keys, self.encoder.keys([s.observation for s in new])])
        self._step_rollout = np.concatenate([self._step_rollout, np.full(len(new), row, dtype=np.int64)])
        if self.config.max_rollouts is not None and len(self.rollouts) > self.config.max_rollouts:
            self._drop_oldest(len(self.rollouts) - self.config.max_rollouts)
        return rid

    def _drop_oldest(self, n: int) -> None:
        keep = self._step_rollout >= n
        self.rollouts = self.rollouts[n:]
        self._instr = self._instr[n:]
        self.steps = [s for s, k in zip(self.steps, keep, strict=True) if k]
        self._keys = self._keys[keep]
        self._step_rollout = self._step_rollout[keep] - n

    def begin_episode(self, instruction: str, meta: dict[str, Any] | None = None) -> None:
        """Start recording an episode online (discards an unfinished one)."""
        self._open = {"instruction": instruction, "steps": [], "meta": dict(meta or {})}

    def record(self, observation: str, action: str, next_observation: str, reward: float) -> None:
        """Record one step of the open episode."""
        if self._open is None:
            raise ValueError("record() before begin_episode(): call bank.begin_episode(instruction) first")
        self._open["steps"].append((observation, action, next_observation, reward))

    def end_episode(self, success: bool) -> int | None:
        """Store the open episode (None if it had no step)."""
        if self._open is None:
            raise ValueError("end_episode() before begin_episode()")
        ep, self._open = self._open, None
        if not ep["steps"]:
            return None
        return self.add_rollout(ep["instruction"], ep["steps"], success, ep["meta"])

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, instruction: str, observation: str, top_k: int | None = None, top_n: int | None = None,
                 exclude_rollout: int | None = None) -> list[Retrieved]:
        """The top-k steps for the query, best score first, with their sampling probabilities (module
        docstring); empty when the bank is empty. ``exclude_rollout`` leaves one rollout out (by id)."""
        k = top_k or self.config.top_k
        n = top_n or self.config.top_n
        if not self.rollouts:
            return []
        valid_r = np.ones(len(self.rollouts), dtype=bool)
        if exclude_rollout is not None:
            valid_r &= np.array([r.id != exclude_rollout for r in self.rollouts])
            if not valid_r.any():
                return []
        isim = self._instr @ self.encoder.instruction([instruction])[0]  # [R]
        isim = np.where(valid_r, isim, -np.inf)
        n = min(n, int(valid_r.sum()))
        rows = np.argsort(-isim, kind="stable")[:n]
        chosen = np.zeros(len(self.rollouts), dtype=bool)
        chosen[rows] = True
        step_idx = np.nonzero(chosen[self._step_rollout])[0]
        ssim = self._keys[step_idx] @ self.encoder.keys([observation])[0]  # [S']
        order = np.argsort(-ssim, kind="stable")[:k]
        idx, sims = step_idx[order], ssim[order].astype(np.float64)
        succ_len = [self.rollouts[r].length for r in rows if self.rollouts[r].success]
        l_min = min(succ_len) if succ_len else 1
        eff = np.array([l_min / self.rollouts[self._step_rollout[i]].length
                        if self.rollouts[self._step_rollout[i]].success else 0.0 for i in idx])
        scores = sims + self.config.efficiency_weight * eff
        z = scores / self.config.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        return [Retrieved(self.steps[i], self.rollouts[self._step_rollout[i]], float(s), float(sc), float(pi))
                for i, s, sc, pi in zip(idx, sims, scores, p, strict=True)]

    def sample(self, instruction: str, observation: str, rng: np.random.Generator,
               exclude_rollout: int | None = None) -> Retrieved | None:
        """Retrieve-then-sample one step (None when the bank is empty)."""
        cands = self.retrieve(instruction, observation, exclude_rollout=exclude_rollout)
        if not cands:
            return None
        return cands[int(rng.choice(len(cands), p=np.array([c.probability for c in cands])))]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the bank to ``path`` (a ``.npz``) atomically; returns the path."""
        path = Path(path)
        meta = {
            "format": _FORMAT,
            "encoder": self.encoder.config() if hasattr(self.encoder, "config") else {"name": self.encoder.name},
            "config": asdict(self.config),
            "next_id": self._next_id,
            "rollouts": [asdict(r) for r in self.rollouts],
            "steps": [[s.rollout, s.t, s.observation, s.action, s.next_observation, s.reward] for s in self.steps],
        }

        def write(f: Any) -> None:
            np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), instr=self._instr,
                     keys=self._keys, step_rollout=self._step_rollout)

        _atomic_write(path, write)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: str | KeyEncoder | None = None) -> ExperienceBank:
        """Read a bank written by :meth:`save`. The key encoder is rebuilt from the file unless given (it must
        produce keys of the stored sizes)."""
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode()) if "meta" in z.files else {}
            if meta.get("format") != _FORMAT:
                raise ValueError(f"{path} is not an experience bank (format={meta.get('format')!r}, "
                                 f"expected {_FORMAT!r})")
            instr, keys, step_rollout = z["instr"], z["keys"], z["step_rollout"]
        if encoder is None:
            enc_cfg = dict(meta["encoder"])
            encoder = make_key_encoder(enc_cfg.pop("name"), **enc_cfg)
        bank = cls(encoder, ExperienceConfig(**meta["config"]))
        if instr.shape[1] != bank.encoder.instruction_dim or keys.shape[1] != bank.encoder.key_dim:
            raise ValueError(f"encoder {bank.encoder.name!r} makes keys of size {bank.encoder.key_dim}, the file "
                             f"holds {keys.shape[1]}; pass the encoder the bank was built with")
        bank.rollouts = [RolloutRecord(**r) for r in meta["rollouts"]]
        bank.steps = [StepRecord(int(a), int(b), c, d, e, float(f)) for a, b, c, d, e, f in meta["steps"]]
        bank._instr, bank._keys, bank._step_rollout = instr, keys, step_rollout
        bank._next_id = int(meta["next_id"])
        return bank
