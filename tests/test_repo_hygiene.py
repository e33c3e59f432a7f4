"""Git holds code, docs and compact results only: no checkpoints, weights, model zips or big files are tracked.

Runs write their artefacts under ``runs/`` (ignored); a study keeps one compact summary per study in
``benchmarks/results/<study>.jsonl`` (``benchmarks/summarize_study.py``). The checks read ``git ls-files`` (the
index), so they hold for what a commit would contain; outside a git checkout (an sdist) they are skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAX_FILE = 1_000_000
"""No tracked file may be larger (bytes)."""
MAX_SUMMARY = 200_000
"""A study's committed summary, ``benchmarks/results/<study>.jsonl``, stays below this (bytes)."""
MAX_BENCHMARKS = 20_000_000
"""What ``benchmarks/`` tracks in all (bytes)."""
ARTEFACT = re.compile(r"(\.(pt|pth|safetensors|ckpt|zip|pkl|npz)$|(^|/)replay\.bin$|\.ckpt/|events\.out\.tfevents"
                      r"|^benchmarks/.*/(checkpoint|checkpoint\.old|adapter|tb)/"
                      r"|^benchmarks/results/.*/episodes\.jsonl$|^benchmarks/results/.*/seed_\d+\.json$)")
"""Paths of experiment artefacts: weights, optimizer states, model zips, replay files, pickles, checkpoint /
adapter / tensorboard folders, raw per-episode logs of the studies."""

# Artefacts allowed to stay tracked while they leave git (a submission's diffs are capped at 256 MiB, and deleting a
# binary counts ~1.3x its size). Empty since the last 25 model.zip files left; it may only shrink: a path here that is
# no longer tracked fails the test, and no other artefact may be tracked.
PENDING_UNTRACK: frozenset[str] = frozenset()


def _git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def tracked() -> dict[str, int]:
    """Every tracked path and the size of its blob in the index (bytes)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    entries = [line.split("\t", 1) for line in _git("ls-files", "-s", "-z").split("\0") if line]
    paths = {meta.split()[1]: path for meta, path in entries}  # blob -> a path (sizes are per blob)
    sizes = _git("cat-file", "--batch-check=%(objectname) %(objectsize)", stdin="\n".join(paths) + "\n")
    blob_size = {name: int(size) for name, size in (line.split() for line in sizes.splitlines())}
    return {path: blob_size[meta.split()[1]] for meta, path in entries}


def test_pending_artefacts_are_still_tracked_so_the_list_only_shrinks(tracked):
    gone = sorted(PENDING_UNTRACK - set(tracked))
    assert not gone, f"no longer tracked, remove from PENDING_UNTRACK in {Path(__file__).name}: {gone}"
    assert all(ARTEFACT.search(p) for p in PENDING_UNTRACK)


def test_no_checkpoint_weights_zip_pickle_or_raw_episode_log_is_tracked(tracked):
    bad = sorted(p for p in tracked if ARTEFACT.search(p) and p not in PENDING_UNTRACK)
    assert not bad, f"experiment artefacts are tracked (write them under runs/, `git rm --cached` them): {bad[:20]}"


def test_no_tracked_file_is_over_1_mb(tracked):
    big = {p: s for p, s in tracked.items() if s > MAX_FILE and p not in PENDING_UNTRACK}
    assert not big, f"tracked files over {MAX_FILE:,} bytes: {big}"


def test_study_summaries_are_compact(tracked):
    summaries = {p: s for p, s in tracked.items() if re.fullmatch(r"benchmarks/results/[^/]+\.jsonl", p)}
    assert "benchmarks/results/gigpo_signal_s1200.jsonl" in summaries  # the check sees the summaries
    big = {p: s for p, s in summaries.items() if s > MAX_SUMMARY}
    assert not big, f"study summaries over {MAX_SUMMARY:,} bytes: {big}"


def test_benchmarks_tracks_at_most_20_mb_besides_the_pending_artefacts(tracked):
    total = sum(s for p, s in tracked.items() if p.startswith("benchmarks/"))
    pending = sum(tracked.get(p, 0) for p in PENDING_UNTRACK)
    if pending:
        warnings.warn(f"benchmarks/ tracks {total / 1e6:.1f} MB, {pending / 1e6:.1f} MB of it the "
                      f"{len(PENDING_UNTRACK)} PENDING_UNTRACK files", stacklevel=1)
    assert total - pending <= MAX_BENCHMARKS, (
        f"benchmarks/ tracks {(total - pending) / 1e6:.1f} MB besides the pending artefacts (at most "
        f"{MAX_BENCHMARKS / 1e6:.0f} MB)")


def test_gitignore_hides_no_tracked_file(tracked):
    hidden = set(_git("ls-files", "-ci", "--exclude-standard", "-z").split("\0")) - {""} - PENDING_UNTRACK
    assert not hidden, f".gitignore matches tracked files (a summary or a source would not be added): {sorted(hidden)}"
    for path in ("runs/x/checkpoint/model.zip", "benchmarks/results/s/bc-seed1/adapter/adapter_model.safetensors",
                 "benchmarks/results/s/episodes.jsonl", "benchmarks/results/s/bc-seed1/tb/x", "replay.bin"):
        assert _git("check-ignore", "--no-index", path).strip() == path  # artefacts of a new run stay out
    for path in ("benchmarks/results/s.jsonl", "benchmarks/results/s/bc-seed1/curve.csv",
                 "echorl_agent/llm_rl/checkpoint/__init__.py"):
        assert subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 1, path
