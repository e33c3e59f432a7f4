"""Where the envs keep what they build once and reuse (generated games, search indexes, repair items)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_once", "cache_root"]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$ECHORL_CACHE_DIR``, else the user cache dir (platformdirs).

    Each family caches under its own sub-folder (``alfworld/``, ``textworld/``, ``webshop/``,
    ``cruxeval_repair/``).
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ECHORL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("echorl"))


def build_once(folder: Path, build: Callable[[Path], object], marker: str) -> Path:
    """``folder / marker``, after building ``folder`` if the marker is not there yet.

    ``build(tmp)`` fills a temporary sibling of ``folder`` that is then renamed to ``folder``: the rename is atomic,
    so parallel workers may race on the same folder safely (the first rename wins, a loser's copy is dropped) and
    no reader ever sees a half-built folder. Whatever ``build`` raises propagates; the temporary folder is removed.
    """
    target = folder / marker
    if target.exists():
        return target
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
