"""One compact summary per study: what its outcome tables and figures need, without checkpoints or raw episode logs.

A study's raw outputs -- ``episodes.jsonl`` (one JSON line per held-out episode, with every action's text),
``benchmarks/gigpo_signal.py``'s rows (episodes, iterations), ``benchmarks/llm_rl_grpo.py``'s ``seed_*.json`` (with
sampled completions) -- are large and stay under ``runs/`` (ignored). Git keeps one summary per study,
``benchmarks/results/<study>.jsonl`` (at most ~200 KB), whose rows are:

* ``{"summary": "run", <label/method>, "seed", ...}``: the keys every raw row of one run (label or method, seed) shares
  (its options, host, train seconds), written once;
* ``{"summary": "episodes", ..., "episode_seed": [...], "won": "0110...", "return": [...], "steps": [...],
  "put_backs": [...], "action_counts": {action: count}}``: one row per run x mode x phase (x held-out options): the
  per-episode values in episode order (``episode_seed0`` instead of the list when the seeds are consecutive;
  ``put_backs`` only when one is not 0), and the actions summed over its episodes;
* ``{"summary": "iterations", "label", "seed", "columns": {field: [value per iteration]}}``: ``gigpo_signal.py``'s
  iteration rows of one run, without the fields no table or figure reads (:data:`ITERATION_DROP`; ``"absent":
  {field: [row index]}`` where a row had no such field),
  and every other raw row as it was (``done`` rows, a run's ``mode: none`` marker);
* ``{"summary": "seed_json", "source": ..., ...}``: one ``seed_*.json`` of ``llm_rl_grpo.py`` without its texts.

Each row names its raw file (``"source"``, relative to the study). :func:`load_rows` reads either form and gives the
raw rows back (without the action texts), so a script's tables are the same from raw files under ``runs/`` and from
a committed summary (``tests/test_summarize_study.py`` checks it); :func:`load_groups` gives the summary rows (the
action tables read these).

Run: ``python benchmarks/summarize_study.py benchmarks/results/llm_rl_alfworld4_s1150`` (a study folder or a
gigpo_signal-style ``.jsonl``; ``--all``: every study under ``benchmarks/results/``). A folder's summary goes beside
it (``<folder>.jsonl``); a ``.jsonl`` of raw rows is replaced by its summary (``--out`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

EPISODE_KEYS = ("episode_seed", "won", "return", "steps")
"""Per-episode values a summary keeps as lists (in episode order)."""
ITERATION_DROP = frozenset(("frac_zero_std", "clip_fraction", "ref_kl", "approx_kl", "optimizer_steps",
                            "stopped_early", "rollout_s", "learner_s", "advantage_mean_raw", "alignment_variants",
                            "probe_n", "seconds"))
"""The fields of a ``gigpo_signal.py`` iteration row a summary leaves out: timings and learner diagnostics that no
outcome table or figure reads (they stay in the raw rows under ``runs/``)."""
RUN_KEYS = ("label", "method", "seed")
"""What names a run within a study's rows."""
SEED_JSON_DROP = ("texts", "samples")
"""The parts of an ``llm_rl_grpo.py`` seed JSON a summary leaves out (completions to read, not measured)."""

_TAKE = re.compile(r"^take (.+) from (.+)$")
_MOVE = re.compile(r"^move (.+) to (.+)$")


def put_backs(actions: list[str]) -> int:
    """How often ``take O from R`` is immediately followed by ``move O to R`` (same object, same receptacle)."""
    n = 0
    for a, b in pairwise(actions):
        take, move = _TAKE.match(a), _MOVE.match(b)
        n += bool(take and move and take.groups() == move.groups())
    return n


def _run(row: dict) -> tuple:
    return tuple(row.get(k) for k in RUN_KEYS)


def _freeze(value):
    return json.dumps(value, sort_keys=True)


def summarize_rows(rows: list[dict], source: str = "") -> list[dict]:
    """The summary rows of one raw JSON-lines file (module docstring), in the order their first raw row appears."""
    by_run: dict[tuple, list[dict]] = {}
    for r in rows:
        by_run.setdefault(_run(r), []).append(r)
    common = {}
    for run, rs in by_run.items():
        shared = {k: v for k, v in rs[0].items() if k not in EPISODE_KEYS and k not in ("actions", "kind")
                  and all(k in r and r[k] == v for r in rs[1:])}
        common[run] = {k: v for k, v in shared.items() if k not in RUN_KEYS} if len(rs) > 1 else {}
    src = {"source": source} if source else {}
    out: list[dict] = []
    groups: dict[tuple, dict] = {}
    iterations: dict[tuple, list[dict]] = {}
    runs_seen: set[tuple] = set()
    for r in rows:
        run = _run(r)
        names = {k: v for k, v in zip(RUN_KEYS, run, strict=True) if v is not None}
        if run not in runs_seen and common[run]:
            runs_seen.add(run)
            out.append({"summary": "run", **src, **names, **common[run]})
        own = {k: v for k, v in r.items() if k not in common[run]}
        if "episode_seed" in r:
            key = {k: v for k, v in own.items() if k not in EPISODE_KEYS and k != "actions"}
            gk = (run, _freeze(key))
            if gk not in groups:
                groups[gk] = {"summary": "episodes", **src, **key, **{k: [] for k in EPISODE_KEYS},
                              "put_backs": [], "action_counts": Counter()}
                out.append(groups[gk])
            g = groups[gk]
            for k in EPISODE_KEYS:
                g[k].append(r.get(k))
            g["put_backs"].append(put_backs(r.get("actions") or []))
            g["action_counts"].update(r.get("actions") or [])
        elif r.get("kind") == "iteration":
            if run not in iterations:
                iterations[run] = []
                out.append({"summary": "iterations", **src, **names, "columns": iterations[run]})
            iterations[run].append({k: v for k, v in own.items() if k not in ITERATION_DROP and k not in RUN_KEYS})
        else:
            out.append({**src, **own})
    for g in groups.values():
        _compact_episodes(g)
    for row in out:
        if row.get("summary") == "iterations":
            _columns(row)
    return out


def _compact_episodes(g: dict) -> None:
    """An episode group's compact form (in place): wins as a 0/1 string, consecutive episode seeds as the first one,
    no put-backs when all are 0, the action counts in order of first use (as the raw episodes list them)."""
    g["action_counts"] = dict(g["action_counts"])
    if not any(g["put_backs"]):
        del g["put_backs"]
    if all(isinstance(w, bool) for w in g["won"]):
        g["won"] = "".join("1" if w else "0" for w in g["won"])
    seeds = g["episode_seed"]
    if seeds and all(isinstance(s, int) for s in seeds) and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        g["episode_seed0"] = seeds[0]
        g["steps"] = g.pop("steps")  # after the seed, as the other lists
        del g["episode_seed"]


def _columns(row: dict) -> None:
    """A run's iteration rows as one list per field (in place), with the rows that lacked a field named."""
    its = row["columns"]
    fields = list(dict.fromkeys(k for it in its for k in it if k != "kind"))
    row["columns"] = {k: [it.get(k) for it in its] for k in fields}
    absent = {k: [i for i, it in enumerate(its) if k not in it] for k in fields}
    if any(absent.values()):
        row["absent"] = {k: v for k, v in absent.items() if v}


def expand(rows: list[dict], source: str | None = None) -> list[dict]:
    """The raw rows back from summary rows (of ``source`` only, when given): episode groups become one row per
    episode (without ``actions``), every row gets its run's shared keys again; raw rows pass through unchanged."""
    if not any("summary" in r or "source" in r for r in rows):
        return rows
    common = {}
    out = []
    for r in rows:
        if source is not None and r.get("source", "") != source:
            continue
        r = {k: v for k, v in r.items() if k != "source"}
        kind = r.pop("summary", None)
        if kind == "run":
            common[_run(r)] = {k: v for k, v in r.items() if k not in RUN_KEYS}
            continue
        if kind == "seed_json":
            out.append(r)
            continue
        shared = common.get(_run(r), {})
        if kind == "episodes":
            r = episode_lists(r)
            head = {k: v for k, v in r.items() if k not in EPISODE_KEYS and k not in ("put_backs", "action_counts")}
            for i in range(len(r["won"])):
                out.append({**shared, **head, **{k: r[k][i] for k in EPISODE_KEYS}})
        elif kind == "iterations":
            head = {k: v for k, v in r.items() if k not in ("columns", "absent")}
            cols, absent = r["columns"], {k: set(v) for k, v in r.get("absent", {}).items()}
            for i in range(len(next(iter(cols.values())))):
                it = {k: col[i] for k, col in cols.items() if i not in absent.get(k, ())}
                out.append({**shared, **head, "kind": "iteration", **it})
        else:
            out.append({**shared, **r})
    return out


def episode_lists(group: dict) -> dict:
    """An episode group with its per-episode values as lists again (``won`` as bools, ``episode_seed`` listed,
    ``put_backs`` zeros when left out)."""
    g = dict(group)
    n = len(g["steps"])
    if isinstance(g["won"], str):
        g["won"] = [c == "1" for c in g["won"]]
    if "episode_seed0" in g:
        g["episode_seed"] = list(range(g["episode_seed0"], g.pop("episode_seed0") + n))
    g.setdefault("put_backs", [0] * n)
    return g


def _read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary_of(path: str | Path) -> tuple[Path, str] | None:
    """Where the committed summary of a raw path lies: ``(<study>.jsonl, the path relative to the study)``, or None."""
    path = Path(path).resolve()
    for study in [path, *path.parents]:
        if study == RESULTS or RESULTS not in study.parents:
            break
        summary = study.with_name(study.name + ".jsonl")
        if study.suffix != ".jsonl" and summary.is_file():
            return summary, str(path.relative_to(study)) if path != study else ""
    return None


def load_rows(path: str | Path) -> list[dict]:
    """The raw rows of a JSON-lines results file (or a folder's ``episodes.jsonl``): read from the file when it is
    there, else from its study's committed summary (expanded: :func:`expand`); [] when neither exists."""
    path = Path(path)
    if path.is_dir() or (not path.exists() and not path.suffix):
        path = path / "episodes.jsonl"
    if path.is_file():
        return expand(_read_jsonl(path))
    found = summary_of(path)
    return [] if found is None else expand(_read_jsonl(found[0]), found[1])


def load_groups(path: str | Path) -> list[dict]:
    """The summary rows (episode groups with their run's shared keys) of a raw file or a committed summary."""
    path = Path(path)
    if path.is_dir() or (not path.exists() and not path.suffix):
        path = path / "episodes.jsonl"
    if path.is_file():
        rows, source = _read_jsonl(path), None
        if not any("summary" in r for r in rows):
            rows = summarize_rows(rows)
    else:
        found = summary_of(path)
        if found is None:
            return []
        rows, source = _read_jsonl(found[0]), found[1]
    common = {_run(r): r for r in rows if r.get("summary") == "run"}
    return [episode_lists({**{k: v for k, v in common.get(_run(r), {}).items() if k not in ("summary", "source")},
                           **r}) for r in rows
            if r.get("summary") == "episodes" and (source is None or r.get("source", "") == source)]


def load_seed_jsons(folder: str | Path) -> list[dict]:
    """``llm_rl_grpo.py``'s per-seed results in ``folder`` (sorted by file name), from ``seed_*.json`` when there,
    else from the study's committed summary (without texts and samples)."""
    folder = Path(folder)
    files = sorted(folder.glob("seed_*.json"))
    if files:
        return [json.loads(p.read_text()) for p in files]
    found = summary_of(folder)
    if found is None:
        return []
    prefix = f"{found[1]}/" if found[1] else ""
    rows = [r for r in _read_jsonl(found[0]) if r.get("summary") == "seed_json"
            and r["source"].startswith(prefix) and "/" not in r["source"][len(prefix):]]
    return [{k: v for k, v in r.items() if k not in ("summary", "source")}
            for r in sorted(rows, key=lambda r: r["source"])]


def summarize_study(path: Path) -> list[dict]:
    """The summary rows of a study: a folder (every ``episodes.jsonl`` and ``seed_*.json`` in it, tagged with its
    path in the folder) or one JSON-lines file of raw rows."""
    if path.is_file():
        return summarize_rows(_read_jsonl(path))
    rows = []
    for f in sorted(path.rglob("*")):
        source = str(f.relative_to(path))
        if f.name == "episodes.jsonl" and "checkpoint" not in f.parts:
            rows += summarize_rows(_read_jsonl(f), source)
        elif re.fullmatch(r"seed_\d+\.json", f.name):
            d = json.loads(f.read_text())
            rows.append({"summary": "seed_json", "source": source,
                         **{k: v for k, v in d.items() if k not in SEED_JSON_DROP}})
    return rows


def write_summary(path: Path, out: Path | None = None) -> Path | None:
    """Write the summary of the study at ``path`` (module docstring); None when it holds no raw rows to summarize
    (e.g. a ``.jsonl`` that is already a summary, or a folder of curves only)."""
    if path.is_file() and any("summary" in r or "source" in r for r in _read_jsonl(path)):
        return None
    rows = summarize_study(path)
    if not rows:
        return None
    out = out or (path if path.is_file() else path.with_name(path.name + ".jsonl"))
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    out.write_text(text)
    return out


def studies(results: Path = RESULTS) -> list[Path]:
    """Every study under ``results`` with raw rows: folders, and ``.jsonl`` files of gigpo_signal-style rows."""
    out = []
    for p in sorted(results.iterdir()):
        if p.is_dir() and not p.name.endswith(".ckpt"):
            out.append(p)
        elif p.suffix == ".jsonl" and not p.with_suffix("").is_dir():
            rows = _read_jsonl(p)  # gigpo_signal-style rows with held-out episodes (not timing-only files)
            if any(r.get("kind") == "episode" and "label" in r for r in rows):
                out.append(p)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, help="study folders or raw .jsonl files")
    ap.add_argument("--all", action="store_true", help="every study under benchmarks/results/")
    ap.add_argument("--out", type=Path, help="write the (one) summary here instead")
    args = ap.parse_args(argv)
    paths = studies() if args.all else args.paths
    if args.out is not None and len(paths) != 1:
        raise ValueError(f"--out needs exactly one study, got {len(paths)}")
    for p in paths:
        got = write_summary(p, args.out)
        print(f"{p}: {'nothing to summarize' if got is None else f'{got} ({got.stat().st_size:,} bytes)'}")


if __name__ == "__main__":
    sys.exit(main())
