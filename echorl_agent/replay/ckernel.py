"""The C loops behind :class:`~echorl_agent.replay.sumtree.SumTree` (``kernels/sumtree.c``), loaded with ctypes.

Profiling ``benchmarks/replay_throughput.py`` (N = 10^6, batch 256) showed the sum tree's numpy code as the
largest single cost of sample + priority update: a descent or an ancestor refresh is one numpy call per tree level
and per step (~100 numpy calls of ~1-2 us each on 256-element arrays). The C file does the same arithmetic one
sample at a time (a few microseconds per batch). It is built once per machine with the system C compiler into
``$ECHORL_CACHE`` (default ``~/.cache/echorl``)/kernels, like the quantized-decode kernel of the LLM engine.
Without a compiler :func:`load` returns ``None`` and the tree uses its numpy code, which gives the same values.
Set ``ECHORL_REPLAY_KERNEL=0`` to force the numpy path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["build_shared_library", "load"]

logger = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("kernels") / "sumtree.c"
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=gnu99")
_lib: ctypes.CDLL | None = None
_tried = False


def build_shared_library(src: Path, flags: tuple[str, ...]) -> Path:
    """Compile ``src`` with ``flags`` into ``$ECHORL_CACHE/kernels/<stem>-<hash>.so`` once per source and flags.

    The library is built in a temporary folder beside the target and renamed into place, so concurrent builds
    (several processes importing at once) are safe. Raises ``OSError`` without a C compiler or on a failed build.
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler found (set CC or install gcc)")
    key = hashlib.sha256(src.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    out = Path(os.environ.get("ECHORL_CACHE", Path.home() / ".cache" / "echorl")) / "kernels" / f"{src.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        res = subprocess.run([cc, *flags, str(src), "-o", str(tmp_so)], capture_output=True, text=True)
        if res.returncode != 0:
            raise OSError(f"{cc} failed: {res.stderr.strip()[-500:]}")
        os.replace(tmp_so, out)
    return out


def load() -> ctypes.CDLL | None:
    """The compiled sum-tree library, or ``None`` when it is switched off or cannot be built (logged once)."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("ECHORL_REPLAY_KERNEL", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(build_shared_library(_SRC, _FLAGS)))
    except OSError as exc:
        logger.warning("replay sum-tree kernel unavailable (%s); using the numpy sum tree (same values)", exc)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.sumtree_find.argtypes, lib.sumtree_find.restype = [p, i64, p, i64, p], None
    lib.sumtree_set.argtypes, lib.sumtree_set.restype = [p, i64, p, p, i64], None
    _lib = lib
    return lib
