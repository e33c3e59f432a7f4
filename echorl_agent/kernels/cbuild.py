"""Build a C source of the package into a shared library once per machine (the engine's and the replay's kernels).

The library goes to ``$ECHORL_CACHE`` (default ``~/.cache/echorl``)``/kernels/<stem>-<hash>.so``, the hash covering
the source and the flags. It is compiled in a temporary folder beside the target and renamed into place, so
concurrent builds (several processes importing at once) are safe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_shared_library", "cache_dir"]


def cache_dir() -> Path:
    """Where compiled kernels live."""
    return Path(os.environ.get("ECHORL_CACHE", Path.home() / ".cache" / "echorl")) / "kernels"


def build_shared_library(src: Path, flags: Sequence[str], libs: Sequence[str] = ()) -> Path:
    """Compile ``src`` with ``flags`` (and link ``libs``, e.g. ``["-lm"]``) unless already built; returns the path.

    Raises:
        OSError: no C compiler (set ``CC`` or install gcc), or the build failed (the compiler's last output).
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler found (set CC or install gcc)")
    key = hashlib.sha256(src.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / f"{src.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        res = subprocess.run([cc, *flags, str(src), "-o", str(tmp_so), *libs], capture_output=True, text=True)
        if res.returncode != 0:
            raise OSError(f"{cc} failed: {res.stderr.strip()[-500:]}")
        os.replace(tmp_so, out)
    return out
