"""The confined side of :mod:`echorl_envs.sandbox` (standard library only; runs as ``python -I -S``).

This file is executed as a script by the host, never imported by the library, so it must not import
``echorl_envs`` (the child runs without ``site``: no site-packages); its two helpers, ``sandbox/guard.py``
(audit hook, report check) and ``sandbox/confine.py`` (namespaces, private root, rlimits, uid drop,
seccomp), are loaded by path and kept out of ``sys.modules``. Two modes, one code path:

* ``python -I -S sandbox/child.py --worker SETTINGS`` -- a reusable worker: sets up isolation once
  (:func:`confine.isolate`: it then runs as init of a fresh PID namespace inside a private root),
  answers a ``{"ready": ..., "layers": [...]}`` line, then for each JSON request line on stdin makes a fresh
  work directory, ``fork()``s a child that confines itself and runs the code, enforces the wall-clock limit by
  killing the child's process group, checks the child's report (:func:`guard.verify_report`),
  removes the directory and answers one JSON line. Forking a warm interpreter costs ~1 ms instead of a full
  start-up, which is what makes judging 800 CRUXEval items in one go cheap;
* ``python -I -S sandbox/child.py`` -- the same for one request read from stdin (``run_code``); the answer
  carries the host's nonce.

The forked child holds exactly one fd besides ``/dev/null``: the write end of its report pipe. See
:func:`_judge_and_report` for why the judged code cannot forge a pass through it.
"""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from json.encoder import encode_basestring_ascii as _encode_str

_DEVNULL = "/dev/null"
_MAX_MESSAGE = 2000
_MAX_REPORT = 1 << 20  # bytes of a report kept by the worker (stdout is bounded far below)
_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_sibling(name: str):  # noqa: ANN202 - a module object
    """Load ``echorl_envs/sandbox/<name>.py`` by path without registering it in ``sys.modules`` (so the judged code
    cannot reach it by name) and without importing the ``echorl_envs`` package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_guard = _load_sibling("guard")
_confinement = _load_sibling("confine")
SandboxViolation = _guard.SandboxViolation
_BLOCKED_MODULES = _guard.BLOCKED_MODULES


class _BoundedText(io.TextIOBase):
    """A write-only text stream keeping the first ``limit`` characters (huge output cannot exhaust memory)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        room = self.limit - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(len(s), room)
        if len(s) > room:
            self.truncated = True
        return len(s)

    def value(self) -> str:
        return "".join(self.parts)


def _confine(request: dict) -> list[str]:
    """Apply the per-run layers to this process (the one that will run the code); returns those active."""
    os.chdir(request["workdir"])
    sc = sys.modules.get("pyseccomp") if request.get("seccomp_path") else None
    _confinement.set_limits(request["limits"], threads=sc is not None)
    layers = []
    if request.get("_drop_privileges"):
        _confinement.drop_privileges()
        layers.append("uid_drop")
    if _confinement.load_seccomp(sc):
        layers.append("seccomp")
    tempfile.tempdir = request["workdir"]
    # Imports compile from source instead of loading .pyc files, so marshal (which builds code objects from
    # raw bytes, a way to read arbitrary memory) can be refused without breaking lazy stdlib imports.
    sys.pycache_prefix, sys.dont_write_bytecode = "/nonexistent-echorl-pycache", True
    for name in list(sys.modules):
        if name.split(".")[0] in _BLOCKED_MODULES or name == "pyseccomp":
            del sys.modules[name]
    if request.get("audit_hook", True):
        import _signal

        _signal.signal = signal.signal = _refuse_signal_handlers  # handlers receive frames (seccomp also denies)
        sys._getframe = _no_frames  # namedtuple/Enum/typing catch ValueError here (the real one is refused)
        _guard.install_audit_hook(request["workdir"])
        layers.append("audit_hook")
    return layers


def _no_frames(depth: int = 0) -> None:
    raise ValueError("call stack frames are not available in the sandbox")


def _refuse_signal_handlers(*args: object) -> None:
    raise SandboxViolation("signal.signal is not allowed in the sandbox")


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` for an exception raised by the code (its ``__str__`` may itself be hostile)."""
    try:
        name = type.__dict__["__name__"].__get__(type(exc))
    except BaseException:  # noqa: BLE001
        name = "Exception"
    try:
        text = str(exc)
        message = f"{name}: {text}" if type(text) is str and text else name
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = name
    return message if type(message) is str else "Exception"


def _judge_and_report(request: dict, nonce: str, report_fd: int) -> None:
    """Confine this process, run the code, write ONE report carrying ``nonce`` to ``report_fd``, and exit.

    Why the judged code cannot fake a pass: the status is fixed by which branch of ``try/except/else`` the
    ``exec`` left through -- ``passed`` only when the code ran to its end -- before any code the judged code
    could have planted (an exception's ``__str__``, a patched stream) runs again. The report is written with
    references captured before the code ran, and the host accepts it only if it carries ``nonce``, is the
    only thing written on the pipe and the process then exits with status 0. The nonce lives only in this
    frame: the audit hook refuses every way Python code reaches frames or walks objects (see
    ``guard``), the uid drop makes ``/proc/self/mem`` unreadable, and all other fds are closed.
    ``SystemExit``, ``os._exit``, signals and crashes therefore end without a valid report: an ``error``.
    """
    write, exit_, encode, perf = os.write, os._exit, _encode_str, time.perf_counter
    type_, str_, float_, bool_, isinstance_ = type, str, float, bool, isinstance
    assertion_error, violation, system_exit = AssertionError, SandboxViolation, SystemExit
    max_message = _MAX_MESSAGE
    out = _BoundedText(int(request["limits"]["output_chars"]))
    code = request.pop("code")
    status, exc = "error", None
    layers: list[str] = []
    start = perf()
    try:
        layers = _confine(request)
        sys.stdout = sys.stderr = out
        sys.modules["__main__"] = main = type_(sys)("__main__")
        exec(compile(code, "<sandbox>", "exec"), main.__dict__)  # noqa: S102 - confined, the point
    except BaseException as e:  # noqa: BLE001 - the untrusted code may raise anything
        exc = e
        status = "failed" if isinstance_(e, assertion_error) and not isinstance_(e, violation) else "error"
    else:
        status = "passed"
    duration = perf() - start
    # From here on, code planted by the judged code may run (exception __str__, patched stream class):
    # ``status``, ``nonce`` and the captured functions are already fixed.
    message, stdout, truncated = "", "", False
    try:
        if exc is not None:
            message = _describe(exc)
            if isinstance_(exc, system_exit):
                message = message if message != "SystemExit" else "SystemExit: None"
                message = message.replace("SystemExit", "SystemExit (exiting is not a pass)", 1)
        stdout, truncated = out.value(), bool_(out.truncated)
    except BaseException:  # noqa: BLE001
        pass
    message = message[:max_message] if type_(message) is str_ else ""
    stdout = stdout if type_(stdout) is str_ else ""
    seccomp = "seccomp" in layers
    layer_list = ", ".join('"' + name + '"' for name in [*request.get("_layers", ()), *layers])
    report = (
        '{"nonce": "' + nonce + '", "status": "' + status + '", "message": ' + encode(message)
        + ', "duration": ' + float_.__repr__(float_(duration)) + ', "stdout": ' + encode(stdout)
        + ', "output_truncated": ' + ("true" if truncated is True else "false")
        + ', "seccomp": ' + ("true" if seccomp is True else "false") + ', "layers": [' + layer_list + "]}"
    ).encode()
    try:
        while report:
            report = report[write(report_fd, report):]
    finally:
        exit_(0)


def _close_fds_except(keep: int) -> None:
    """Point fds 0/1/2 at /dev/null and close every other fd but ``keep``: nothing of the host stays reachable."""
    null = os.open(_DEVNULL, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != keep:
            os.dup2(null, fd)
    if null not in (0, 1, 2, keep):
        os.close(null)
    if keep > 3:
        os.closerange(3, keep)
    os.closerange(max(3, keep + 1), 1 << 20)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _signal_result(wait_status: int, wall: float, timed_out: bool) -> dict:
    if timed_out:
        return {"status": "timeout", "message": f"wall-clock limit of {wall:g} s exceeded", "duration": wall}
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig == signal.SIGXCPU:
            return {"status": "timeout", "message": "CPU time limit exceeded (killed by SIGXCPU)"}
        return {"status": "error", "message": f"crashed (killed by {signal.Signals(sig).name})"}
    return {"status": "error", "message": f"exited with code {os.WEXITSTATUS(wait_status)} without a result"}


def _die_with_host(settings: dict) -> bool:
    """Be killed when the host process dies, as :mod:`echorl_envs.core.lifeline` does for the library's workers
    (this file cannot import it). PR_SET_PDEATHSIG follows the host *thread* that started this process, so it is
    armed only when that was the host's main thread; otherwise the worker ends at the EOF of its stdin, after the
    run in progress (bounded by its wall-clock limit). Returns whether the kernel guard is armed."""
    host = settings.get("host")
    if not host:
        return False
    pid, from_main_thread = int(host[0]), bool(host[1])
    armed = from_main_thread and _confinement.die_with_parent()
    if os.getppid() != pid:  # the host died before the guard was armed
        os._exit(1)
    return armed


class _Runner:
    """The trusted side of a worker: sets up isolation once, then runs each request in a forked child."""

    def __init__(self, settings: dict, preload: bool = True) -> None:
        armed = _die_with_host(settings)
        _confinement.import_seccomp(settings.get("seccomp_path"))  # before the private root hides it
        for name in _PRELOAD if preload else ():  # common stdlib modules: forked children need not compile
            try:                                  # them again (no .pyc is loaded in the child)
                __import__(name)
            except ImportError:
                pass
        self.layers: list[str] = []
        if settings.get("isolate", True):
            self.layers = _confinement.isolate(int(settings.get("disk_mb", 64)), relay_dies_with_parent=armed)
        self.tmp_root = "/tmp" if "mount_view" in self.layers else None
        self.drop = bool(settings.get("isolate", True)) and _confinement.can_drop_privileges()

    def run(self, request: dict) -> dict:
        """Run one request in a forked child with its own temp dir and process group; a verified result."""
        wall = float(request["limits"]["wall_seconds"])
        workdir = tempfile.mkdtemp(prefix="echorl-sandbox-", dir=self.tmp_root)
        if self.drop:
            os.chown(workdir, _confinement.NOBODY, _confinement.NOBODY)
        request = dict(request, workdir=workdir, _layers=self.layers, _drop_privileges=self.drop)
        nonce = os.urandom(16).hex()
        r_fd, w_fd = os.pipe()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # ---- child
            try:
                os.setpgid(0, 0)
                _close_fds_except(w_fd)
                _judge_and_report(request, nonce, w_fd)
            finally:
                os._exit(1)
        # ---- worker
        del request["code"]
        os.close(w_fd)
        data, timed_out = _read_bounded(r_fd, start + wall)
        if timed_out:
            _kill_group(pid)
        os.close(r_fd)
        _, wait_status = os.waitpid(pid, 0)
        _kill_group(pid)  # anything the code left behind in its group
        shutil.rmtree(workdir, ignore_errors=True)
        result = None if timed_out else _guard.verify_report(data, nonce, wait_status)
        if result is None:
            result = _signal_result(wait_status, wall, timed_out)  # no "layers": nothing was reported
        result.setdefault("duration", time.perf_counter() - start)
        return result


_PRELOAD = ("re", "string", "math", "cmath", "itertools", "functools", "collections", "operator", "copy",
            "heapq", "bisect", "random", "datetime", "decimal", "fractions", "statistics", "textwrap",
            "unicodedata", "typing", "dataclasses", "enum", "array", "struct", "numbers", "hashlib", "calendar",
            "json", "encodings.idna", "encodings.utf_16", "encodings.utf_32", "encodings.latin_1",
            "encodings.ascii", "encodings.cp1252", "fnmatch", "difflib", "pprint", "keyword", "locale")


def _read_bounded(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Read ``fd`` until EOF or ``deadline``; keeps at most ``_MAX_REPORT`` bytes. Returns (data, timed_out)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size <= _MAX_REPORT:
            chunks.append(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _worker() -> None:
    """Serve requests (one JSON object per line on stdin) until EOF; settings come as argv[2] (JSON)."""
    out = os.dup(1)
    null = os.open(_DEVNULL, os.O_RDWR)
    os.dup2(null, 1)
    os.close(null)
    runner = _Runner(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    _write_all(out, (json.dumps({"ready": True, "layers": runner.layers}) + "\n").encode())
    for line in sys.stdin:
        if line.strip():
            _write_all(out, (json.dumps(runner.run(json.loads(line))) + "\n").encode())


def _single() -> None:
    """One-process-per-run mode: the same isolation and forked run as a worker, for a single request read
    from stdin; the result goes to the original stdout with the host's nonce (checked by the host)."""
    request = json.loads(sys.stdin.read())
    nonce = request.pop("nonce")
    report_fd = os.dup(1)
    _close_fds_except(report_fd)
    result = _Runner(request, preload=False).run(request)
    result["nonce"] = nonce
    _write_all(report_fd, json.dumps(result).encode())
    os._exit(0)


if __name__ == "__main__":
    _worker() if "--worker" in sys.argv[1:] else _single()
