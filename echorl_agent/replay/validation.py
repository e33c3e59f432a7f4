"""Full validation of a replay file against the buffer it is loaded into, before anything is changed.

:func:`stage_load` reads a :class:`~echorl_agent.replay.serialization.ReplayFileReader` into a plain dict of
checked values; :meth:`PersistenceMixin.load` applies that dict only when every check passed, so a failed load
leaves the buffer exactly as it was. Besides the checksums (which catch corruption), the checks tie the header's
numbers to the payload, so a header edited with its checksum recomputed is still refused when it disagrees with
the data: the exact set, shapes and dtypes of the arrays; ``pos``/``full``/``num_added`` against the add counter
stored in every row; the cold ring's position against the number of demotions; ``td_max`` against the stored TD
errors; and every stored sum-tree leaf against ``exp(c_t - 2 beta tau_t . tau_ref - shift)`` (buffer module doc).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from echorl_agent.config import PLAN_SOURCES
from echorl_agent.replay.serialization import ReplayFileError, ReplayFileReader

__all__ = ["COLD_FIELDS", "HOT_FIELDS", "stage_load"]

COLD_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts", "plans", "td", "seq")
HOT_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts", "hot_td", "hot_seq")


def _int(meta: dict[str, Any], key: str, lo: int = 0, hi: float = math.inf) -> int:
    v = meta[key]
    if type(v) is not int or not lo <= v < hi:
        raise ReplayFileError(f"header field {key}={v!r} is not an integer in [{lo}, {hi})")
    return v


def _bool(meta: dict[str, Any], key: str) -> bool:
    v = meta[key]
    if type(v) is not bool:
        raise ReplayFileError(f"header field {key}={v!r} is not a boolean")
    return v


def _hexfloat(meta: dict[str, Any], key: str) -> float:
    v = float.fromhex(meta[key])
    if not math.isfinite(v):
        raise ReplayFileError(f"header field {key}={meta[key]!r} is not finite")
    return v


def _expected_seq(num_added: int, rows: int) -> np.ndarray:
    """Add counter held by each row of a ring of ``rows`` rows after ``num_added`` writes (-1: never written)."""
    seq = np.full(rows, -1, dtype=np.int64)
    last = np.arange(max(0, num_added - rows), num_added, dtype=np.int64)
    seq[last % rows] = last
    return seq


def _expected_arrays(buf: Any, plan_dim: int | None, cold_rows_stored: int | None) -> dict[str, tuple]:
    out = {name: (getattr(buf, name).shape, getattr(buf, name).dtype) for name in HOT_FIELDS}
    nslots = buf.hot_slots + buf.cold_slots
    out["tree_leaves"] = ((nslots,), np.dtype("<f8"))
    out["c"] = ((nslots,), np.dtype("<f8"))
    if plan_dim is not None:
        out["hot_plans"] = ((buf.buffer_size, buf.n_envs, plan_dim), np.dtype("<f4"))
        out["tau_bar"] = ((plan_dim,), np.dtype("<f8"))
    if cold_rows_stored is not None:
        per = {"observations": (buf.obs_shape, buf.observations.dtype),
               "next_observations": (buf.obs_shape, buf.next_observations.dtype),
               "actions": ((buf.action_dim,), buf.actions.dtype), "plans": ((plan_dim,), np.dtype("<f4")),
               "seq": ((), np.dtype("<i8"))}
        for name in COLD_FIELDS:
            shape, dtype = per.get(name, ((), np.dtype("<f4")))
            out[f"cold_{name}"] = ((cold_rows_stored, buf.n_envs, *shape), np.dtype(dtype))
    return out


def stage_load(buf: Any, reader: ReplayFileReader) -> dict[str, Any]:
    """Validate ``reader``'s file for ``buf`` and return the values to apply; raises :class:`ReplayFileError`.

    Any malformed field (a header whose checksum was forged) is reported as :class:`ReplayFileError`, never as a
    ``KeyError``/``TypeError``.
    """
    try:
        return _stage(buf, reader)
    except ReplayFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        raise ReplayFileError(f"{reader.path} has a malformed header ({type(e).__name__}: {e})") from e


def _stage(buf: Any, reader: ReplayFileReader) -> dict[str, Any]:
    path, meta = reader.path, reader.meta
    mine = buf._layout()
    if meta["layout"] != mine:
        diff = {k: (meta["layout"].get(k), v) for k, v in mine.items() if meta["layout"].get(k) != v}
        raise ReplayFileError(
            f"{path} was saved from a buffer with a different layout (saved, this): {diff}; build the buffer "
            "with the same spaces, buffer_size, cold_size and n_envs before load()"
        )
    bs = buf.buffer_size
    s: dict[str, Any] = {
        "pos": _int(meta, "pos", 0, bs), "full": _bool(meta, "full"), "num_added": _int(meta, "num_added"),
        "num_sample_calls": _int(meta, "num_sample_calls"), "shift": _hexfloat(meta, "shift"),
        "plan_norm_max": _hexfloat(meta, "plan_norm_max"), "td_max": _hexfloat(meta, "td_max"),
    }
    if s["pos"] != s["num_added"] % bs or s["full"] != (s["num_added"] >= bs):
        raise ReplayFileError(f"{path}: pos={s['pos']}, full={s['full']} disagree with num_added={s['num_added']} "
                              f"for {bs} hot rows")
    plan_source, plan_dim = meta["plan_source"], meta["plan_dim"]
    if plan_source is not None and plan_source not in PLAN_SOURCES:
        raise ReplayFileError(f"{path}: unknown plan_source={plan_source!r}")
    if plan_dim is not None and (type(plan_dim) is not int or plan_dim < 1):
        raise ReplayFileError(f"{path}: plan_dim={plan_dim!r} is not a positive integer")
    s["plan_source"], s["plan_dim"] = plan_source, plan_dim
    stats = meta["stats"]
    if not isinstance(stats, dict) or set(stats) != set(buf.stats) or any(type(v) is not int for v in stats.values()):
        raise ReplayFileError(f"{path}: malformed stats {stats!r}")
    s["stats"] = dict(stats)
    rng = np.random.Generator(type(buf._rng.bit_generator)())
    rng.bit_generator.state = meta["rng"]
    s["rng"] = rng
    tracker = meta["tracker"]
    if (tracker is None) != (plan_dim is None):
        raise ReplayFileError(f"{path}: tracker state {tracker!r} does not match plan_dim={plan_dim!r}")
    if tracker is not None:
        s["tracker"] = {"initialized": _bool(tracker, "initialized"), "num_updates": _int(tracker, "num_updates")}
    has_cold = plan_dim is not None and buf.cold_rows > 0
    cold_stored = None
    if (meta["cold"] is not None) != has_cold:
        raise ReplayFileError(f"{path}: cold tier state {meta['cold']!r} does not match this buffer's cold_size")
    if has_cold:
        demoted = max(0, s["num_added"] - bs)
        cpos, cfull = _int(meta["cold"], "pos", 0, buf.cold_rows), _bool(meta["cold"], "full")
        if cpos != demoted % buf.cold_rows or cfull != (demoted >= buf.cold_rows):
            raise ReplayFileError(f"{path}: cold pos={cpos}, full={cfull} disagree with {demoted} demoted rows")
        s["cold"] = (cpos, cfull)
        cold_stored = buf.cold_rows if cfull else cpos
    # ---- the arrays: exact set, shapes, dtypes, checksums
    expected = _expected_arrays(buf, plan_dim, cold_stored)
    optional = {"tau_ref": ((plan_dim or 1,), np.dtype("<f8")), "dead": ((buf.hot_slots + buf.cold_slots,), np.dtype("|b1"))}
    names = set(reader.entries)
    if not set(expected) <= names or names - set(expected) - {"tau_ref", "projection", "dead"}:
        raise ReplayFileError(f"{path}: arrays {sorted(names)} do not match the expected {sorted(expected)}")
    for name, e in reader.entries.items():
        if name == "projection":
            ok = len(e["shape"]) == 2 and e["shape"][1] <= buf.config.plan_dim and e["dtype"] == np.dtype("<f4")
        else:
            shape, dtype = expected.get(name) or optional[name]
            ok = e["shape"] == tuple(shape) and e["dtype"] == np.dtype(dtype)
        if not ok:
            raise ReplayFileError(f"{path}: array {name!r} has shape {e['shape']}/{e['dtype']}, expected "
                                  f"{expected.get(name) or optional.get(name)}")
    reader.verify()
    arrays = {name: reader.array(name) for name in reader.entries}
    s["arrays"] = arrays
    _check_consistency(buf, path, s, arrays, float(meta["config"]["beta"]))
    return s


def _check_consistency(buf: Any, path: Any, s: dict[str, Any], arrays: dict[str, np.ndarray], beta: float) -> None:
    """The header's counters and scalars against the payload (see the module docstring)."""
    bs, n = buf.buffer_size, buf.n_envs
    if not np.array_equal(arrays["hot_seq"], _expected_seq(s["num_added"], bs)):
        raise ReplayFileError(f"{path}: the add counters stored in the hot rows disagree with num_added={s['num_added']}")
    td = [np.asarray(arrays["hot_td"])]
    if "cold" in s:
        demoted = max(0, s["num_added"] - bs)
        seq = np.asarray(arrays["cold_seq"])
        want = _expected_seq(demoted, buf.cold_rows)[: len(seq), None]
        if not (seq == want).all():
            raise ReplayFileError(f"{path}: the cold rows' add counters disagree with {demoted} demoted rows")
        td.append(np.asarray(arrays["cold_td"]))
    if max(float(t.max(initial=0.0)) for t in td) > s["td_max"]:
        raise ReplayFileError(f"{path}: td_max={s['td_max']} is below a stored TD error")
    if s["plan_norm_max"] < 0:
        raise ReplayFileError(f"{path}: plan_norm_max={s['plan_norm_max']} is negative")
    leaves, c = np.asarray(arrays["tree_leaves"]), np.asarray(arrays["c"])
    if not (np.isfinite(c).all() and np.isfinite(leaves).all() and (leaves >= 0).all()):
        raise ReplayFileError(f"{path}: sum-tree leaves or logit constants are not finite and non-negative")
    tau_ref = arrays.get("tau_ref")
    if tau_ref is None or s["plan_dim"] is None:
        return
    tau_ref = np.asarray(tau_ref)
    hot_valid = (bs if s["full"] else s["pos"]) * n
    parts = [(0, np.asarray(arrays["hot_plans"]).reshape(-1, s["plan_dim"])[:hot_valid])]
    if "cold" in s:
        parts.append((buf.hot_slots, np.asarray(arrays["cold_plans"]).reshape(-1, s["plan_dim"])))
    dead = np.asarray(arrays["dead"]) if "dead" in arrays else np.zeros(len(c), dtype=bool)
    for base, plans in parts:
        sl = slice(base, base + len(plans))
        want = np.exp(c[sl] - 2.0 * beta * (plans.astype(np.float64) @ tau_ref) - s["shift"])
        want[dead[sl]] = 0.0  # evicted transitions keep their fields but have leaf 0
        if not np.allclose(leaves[sl], want, rtol=1e-9, atol=1e-300):
            raise ReplayFileError(f"{path}: sum-tree leaves disagree with the stored plans, logits, anchor and "
                                  f"shift={s['shift']}")
