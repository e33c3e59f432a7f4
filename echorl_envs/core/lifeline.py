"""Worker processes that die with their parent: no pool worker, vector-env worker or engine process outlives it.

A parent killed by SIGKILL (a caller's timeout, the OOM killer) runs no cleanup, so its children are reparented to
init and go on computing, then sit idle holding their memory (an ``echorl bench`` with LLM agents left two
process-pool workers of ~1.4 GB each for 90 minutes). Two guards, both installed in the child by
:func:`watch_parent`:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the child the moment its parent dies. The signal
  follows the parent *thread* that started the child, so it is only armed when that thread was the parent's main
  thread (a worker started from a short-lived thread would otherwise die with the thread, not the process).
* everywhere: a daemon thread that polls ``os.getppid()`` every ``interval`` seconds and kills this process once
  the parent is gone (the child was reparented), which also covers macOS and children started from other threads.

Programs we cannot change that start children of their own (chromedriver and Chromium) get a reaper process
instead (:func:`reap_group_with_this_process`), which kills their process group when this process dies.

Call :func:`parent_watch_args` in the parent when starting a child and :func:`watch_parent` first thing in the
child (e.g. ``ProcessPoolExecutor(initializer=watch_parent, initargs=parent_watch_args())``). A spawned child runs
its initializer after its start-up imports; if the parent died during them, :func:`watch_parent` sees another
parent and kills the child at once, so an orphan lives at most as long as its start-up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["watch_parent", "parent_watch_args", "reap_group_with_this_process", "PR_SET_PDEATHSIG"]

#: ``<linux/prctl.h>``: the signal this process gets when its parent (thread) dies.
PR_SET_PDEATHSIG = 1
#: Seconds between two ``os.getppid()`` polls of the fallback thread.
POLL_INTERVAL = 0.5


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: libc's prctl, looked up once (a forked child must not load libraries between fork and exec).
_prctl = _load_prctl()


def parent_watch_args() -> tuple[int, bool]:
    """``(parent pid, started from the main thread)``: the arguments of :func:`watch_parent`, taken in the parent."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _set_pdeathsig() -> bool:
    """Arm ``PR_SET_PDEATHSIG`` = SIGKILL for this process; False where prctl is unavailable."""
    return _prctl is not None and _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def watch_parent(parent: int, from_main_thread: bool = True, interval: float = POLL_INTERVAL) -> bool:
    """Make this process die (SIGKILL) when process ``parent`` dies. Call it in the child, first thing.

    Args:
        parent: the parent's pid, taken in the parent (:func:`parent_watch_args`); if this process's parent is
            already another one, the parent died before the call and this process dies at once.
        from_main_thread: whether the parent started this process from its main thread (arms PR_SET_PDEATHSIG).
        interval: seconds between two polls of the fallback thread.

    Returns:
        Whether the kernel guard (PR_SET_PDEATHSIG) is armed; the polling thread runs in any case.
    """
    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, got interval={interval!r}")
    armed = from_main_thread and _set_pdeathsig()
    if os.getppid() != parent:  # the parent died before the guard was armed
        _die()

    def poll() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                _die()

    threading.Thread(target=poll, name="echorl-parent-watch", daemon=True).start()
    return armed


#: The reaper of :func:`reap_group_with_this_process` (standard library only, run with ``python -S``): it kills the
#: process group when its parent dies (SIGTERM from PR_SET_PDEATHSIG, or a changed ``getppid()``) and exits by
#: itself once the group is gone.
_REAPER = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
def reap(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
while True:
    if os.getppid() != parent:
        reap()
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        os._exit(0)
    time.sleep(0.5)
"""


def reap_group_with_this_process(pgid: int, thread_outlives_group: bool | None = None) -> Any:
    """Start a small reaper process that SIGKILLs process group ``pgid`` when this process dies (even by SIGKILL).

    For programs that start children of their own which we cannot change (chromedriver starts Chromium, which does
    not watch its parent): start the program in a new session (``start_new_session=True``, so its group is its
    pid) and call this with its pid. The reaper exits by itself once the group is gone; the returned
    ``subprocess.Popen`` may be waited for after closing the program.

    Args:
        pgid: the process group to guard.
        thread_outlives_group: whether the calling thread lives at least as long as the group should; then the
            reaper also gets PR_SET_PDEATHSIG (immediate), which fires when this *thread* ends. Default: only from
            the main thread. Otherwise the reaper polls ``getppid()`` (within 0.5 s).
    """
    import subprocess

    armed = thread_outlives_group if thread_outlives_group is not None else (
        threading.current_thread() is threading.main_thread())

    def arm() -> None:  # SIGTERM (not SIGKILL): the reaper's handler kills the group first
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return subprocess.Popen([sys.executable, "-S", "-c", _REAPER, str(os.getpid()), str(pgid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=arm if armed and _prctl is not None else None)
