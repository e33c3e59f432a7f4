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
import logging
import os
from pathlib import Path

from echorl_agent.kernels.cbuild import build_shared_library

__all__ = ["load"]

logger = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("kernels") / "sumtree.c"
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=gnu99")
_lib: ctypes.CDLL | None = None
_tried = False


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
