"""Isolated execution of untrusted Python code (CRUXEval judging, and anything else that runs model output).

Public API (stable; used by :mod:`echorl_envs.cruxeval` and other code envs): :func:`run_code`,
:class:`SandboxPool` (``run``/``run_many``), :func:`shared_pool`, :class:`SandboxConfig`,
:class:`SandboxResult` (``status`` in :data:`STATUSES`, ``passed``, ``message``, ``stdout``, ``layers``).

**What a pass means.** ``passed`` only when the code ran to its end and the trusted harness in the child
then wrote one report carrying a per-run random nonce on a pipe that is the child's only fd besides
``/dev/null``; the report must be the only thing on that pipe and the child must exit with status 0.
``SystemExit`` (any code), ``os._exit``, signals, crashes and anything the code writes itself are
``error``; an ``AssertionError`` is ``failed`` (a wrong answer, as in CRUXEval's harness).

**Layers** (each run; a layer the platform refuses is skipped with a one-time ``RuntimeWarning``):

* isolation, set up once per worker (``isolate=True``): fresh PID/network/IPC/UTS/mount namespaces (a user
  namespace when not root); a private root with only read-only ``/usr`` and the Python standard library
  (``ctypes``/test extension modules masked), ``/dev/null`` & co, a ``/proc`` showing only the sandbox's
  processes, and a ``/tmp`` tmpfs of ``disk_mb`` MiB (total disk, not per file); the run switches to
  ``nobody`` (so ``/proc/self/mem`` and the host's files are unreadable even through a bug elsewhere);
* ``setrlimit``: CPU seconds, address space, file size, no core files, 64 open files, processes;
* seccomp-BPF (via ``pyseccomp`` + libseccomp): no fork/exec/sockets/signals to other processes
  (``kill``, ``pidfd_*``), no ptrace/``process_vm_*``, no namespace/mount/uid changes, no signal handlers, no
  writes through foreign directory fds (``openat``/``mkdirat``/... with a dirfd other than the cwd);
* a PEP 578 audit hook (``sandbox/guard.py``): clear messages for refused operations, writes confined to the
  work dir, and no way to the interpreter's own state (frames, ``gc`` walks, tracing, ``marshal``, code
  construction, ``ctypes``), which is what keeps the nonce secret inside the child;
* the host's wall-clock limit kills the run's whole process group; a minimal environment (``python -I -S``,
  a short ``PATH``, none of the host's variables).

Two entry points:

* :func:`run_code` -- one fresh interpreter per run (simple, ~50 ms each with isolation);
* :class:`SandboxPool` -- reusable workers that ``fork()`` a confined child per snippet, so judging 800 items
  does not pay 800 interpreter start-ups (see ``benchmarks/sandbox_throughput.py``).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from echorl_envs.core.lifeline import parent_watch_args
from echorl_envs.sandbox.config import STATUSES, SandboxConfig, SandboxResult
from echorl_envs.sandbox.guard import verify_report

__all__ = ["SandboxConfig", "SandboxResult", "SandboxPool", "run_code", "shared_pool", "STATUSES"]

_CHILD = str(Path(__file__).with_name("child.py"))
_MAX_REPORT = 1 << 20
_PATH = "/usr/local/bin:/usr/bin:/bin"


def _seccomp_path() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _request(code: str, config: SandboxConfig) -> dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    return {
        "code": code,
        "limits": config.limits(),
        "seccomp_path": _seccomp_path() if config.seccomp else None,
        "isolate": bool(config.isolate or config.unshare_network),
        "disk_mb": int(config.disk_mb),
        "audit_hook": bool(config.audit_hook),
        # (pid, started from the main thread): the worker dies with this process (see child._die_with_host)
        "host": list(parent_watch_args()),
    }


#: What each layer guards, for the one-time warning when the platform refuses it.
_LAYER_HELP = {
    "namespaces": "fresh PID/network namespaces (host processes and the network stay reachable)",
    "mount_view": "the private read-only root (host files stay readable by the code)",
    "uid_drop": "running the code as 'nobody' (needs root; the code keeps the host user's uid)",
    "seccomp": "the seccomp syscall filter (needs pyseccomp + libseccomp)",
}
_WARNED: set[str] = set()


def _expected_layers(config: SandboxConfig) -> list[str]:
    layers = ["namespaces", "mount_view", "uid_drop"] if (config.isolate or config.unshare_network) else []
    return layers + (["seccomp"] if config.seccomp else [])


def _warn_missing(config: SandboxConfig, layers: Iterable[str]) -> None:
    """Warn once per process and layer that ``config`` asks for but the platform did not enable."""
    have = set(layers)
    for name in _expected_layers(config):
        if name not in have and name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"echorl sandbox: {_LAYER_HELP[name]} could not be enabled on this platform; "
                          "the other layers remain", RuntimeWarning, stacklevel=3)


def _env(home: str) -> dict[str, str]:
    return {"PATH": _PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home}


def _wait_status(returncode: int | None) -> int | None:
    """A ``waitpid`` status equivalent to a ``Popen.returncode`` (for :func:`verify_report`)."""
    if returncode is None:
        return None
    return (-returncode) & 0x7F if returncode < 0 else (returncode & 0xFF) << 8


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_code(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run ``code`` in a fresh, confined interpreter (one process per run) and report how it ended.

    Args:
        code: Python source, executed as ``__main__`` in an empty temporary directory.
        config: limits (default :class:`SandboxConfig`).
    """
    config = config or SandboxConfig()
    nonce = os.urandom(16).hex()
    request = _request(code, config) | {"nonce": nonce}
    python = config.python or sys.executable
    home = tempfile.gettempdir()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-I", "-S", _CHILD],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        cwd=home, env=_env(home), start_new_session=True,
    )
    try:
        # The child enforces the wall-clock limit itself (killing the run's process group); the margin
        # covers start-up and isolation set-up, after which the host kills it as a backstop.
        out, _ = proc.communicate(json.dumps(request).encode(), timeout=config.wall_seconds + 10.0)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        return SandboxResult("timeout", f"wall-clock limit of {config.wall_seconds:g} s exceeded",
                             time.perf_counter() - start)
    finally:
        _kill_group(proc.pid)
    rc = proc.returncode
    duration = time.perf_counter() - start
    report = verify_report(out[:_MAX_REPORT], nonce, _wait_status(rc))
    if report is not None:
        result = SandboxResult.from_dict(report)
        if "layers" in report:  # a genuine report says which layers were on
            _warn_missing(config, result.layers)
        return result
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGXCPU:
            return SandboxResult("timeout", "CPU time limit exceeded (killed by SIGXCPU)", duration)
        return SandboxResult("error", f"crashed (killed by {sig.name})", duration)
    return SandboxResult("error", f"exited with code {rc} without a result", duration)


class _Worker:
    """One ``sandbox/child.py --worker`` process and its line protocol."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        home = tempfile.gettempdir()
        settings = json.dumps(_request("", config))
        self.proc = subprocess.Popen(
            [config.python or sys.executable, "-I", "-S", _CHILD, "--worker", settings],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=home, env=_env(home), start_new_session=True,
        )
        self._buf = b""
        self.layers: tuple[str, ...] = ()
        self._checked = False
        ready = self._read_line(time.perf_counter() + 30.0)
        if ready is not None:
            try:
                self.layers = tuple(json.loads(ready).get("layers", ()))
            except (ValueError, AttributeError):
                pass
            _warn_missing(config, [*self.layers, "uid_drop", "seccomp"])  # those two are reported per run

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker, or None if it died or ``deadline`` passed (the worker is then closed)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.perf_counter()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.close()
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.close()
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def run(self, request: dict[str, Any]) -> SandboxResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = time.perf_counter()
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return SandboxResult("error", "sandbox worker died", time.perf_counter() - start)
        # The worker enforces the wall-clock limit itself; the margin covers fork + clean-up.
        line = self._read_line(start + self.config.wall_seconds + 10.0)
        if line is None:
            return SandboxResult("error", "sandbox worker died or did not answer in time", time.perf_counter() - start)
        report = json.loads(line)
        result = SandboxResult.from_dict(report)
        if "layers" in report and not self._checked:  # the per-run layers (uid_drop, seccomp), checked once
            self._checked = True
            _warn_missing(self.config, result.layers)
        return result

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.proc.wait()


class SandboxPool:
    """Reusable sandbox workers: each snippet runs in a freshly forked, confined child of a warm worker.

    Results are the same as :func:`run_code` (same limits, same statuses), at a fraction of the cost per run.
    Thread-safe; :meth:`run_many` keeps ``num_workers`` workers busy. Workers are restarted when they die.

    Example:
        >>> with SandboxPool() as pool:
        ...     pool.run("assert 1 + 1 == 2").status
        'passed'
    """

    def __init__(self, config: SandboxConfig | None = None, num_workers: int = 1) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got num_workers={num_workers!r}")
        self.config = config or SandboxConfig()
        self.num_workers = num_workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._request_base = _request("", self.config)

    def _take(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxPool is closed")
            if len(self._all) < self.num_workers:
                w = _Worker(self.config)
                self._all.append(w)
                return w
        return self._idle.get()

    def run(self, code: str) -> SandboxResult:
        """Run one snippet (see :func:`run_code`)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        w = self._take()
        if not w.alive:  # died between runs (killed from outside): replace it transparently
            with self._lock:
                self._all.remove(w)
                w = _Worker(self.config)
                self._all.append(w)
        try:
            result = w.run(self._request_base | {"code": code})
        finally:
            if not w.alive:
                with self._lock:
                    self._all.remove(w)
            else:
                self._idle.put(w)
        return result

    def run_many(self, codes: Iterable[str]) -> list[SandboxResult]:
        """Run many snippets, in order of the results, on up to ``num_workers`` workers in parallel."""
        codes = list(codes)
        if self.num_workers == 1 or len(codes) <= 1:
            return [self.run(c) for c in codes]
        with ThreadPoolExecutor(self.num_workers) as ex:
            return list(ex.map(self.run, codes))

    def close(self) -> None:
        """Stop all workers."""
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        for w in workers:
            w.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "num_workers": self.num_workers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state["num_workers"])  # type: ignore[misc]


_SHARED: dict[tuple[int, SandboxConfig], SandboxPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(config: SandboxConfig | None = None) -> SandboxPool:
    """A per-process :class:`SandboxPool` for ``config`` (one worker), created on first use.

    Keyed by process id, so a forked process (e.g. an ``AsyncVectorEnv`` sub-process) starts its own
    worker instead of sharing pipes with its parent's. Closed at interpreter exit.
    """
    config = config or SandboxConfig()
    key = (os.getpid(), config)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            pool = _SHARED[key] = SandboxPool(config)
        return pool


@atexit.register
def _close_shared() -> None:
    for (pid, _), pool in list(_SHARED.items()):
        if pid == os.getpid():
            pool.close()
