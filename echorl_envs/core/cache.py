"""Where the envs keep what they build once and reuse (generated games, search indexes, repair items)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


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
