"""The confined side of :mod:`echorl_envs.sandbox` (standard library only; runs as ``python -I -S``).

This file is executed as a script by the host, never imported by the library, so it must not import
``echorl_envs`` (the child runs without ``site``: no site-packages). Two modes:

* ``python -I -S _sandbox_child.py`` -- read one JSON request from stdin, confine *this* process, run the
  code, write one JSON result to the original stdout (the one-process-per-run path);
* ``python -I -S _sandbox_child.py --worker`` -- a reusable worker: for each JSON request line on stdin it
  makes a fresh temporary directory, ``fork()``s a child that confines itself and runs the code, enforces the
  wall-clock limit by killing the child's process group, removes the directory and answers one JSON line on
  stdout. Forking an already-started interpreter costs ~1 ms instead of a full interpreter start-up, which
  is what makes judging 800 CRUXEval items in one go cheap.

Layers of confinement applied in the child, in order (each documented at its function):
``setrlimit`` (CPU, address space, file size, no core files, open files, processes), an optional network
namespace, a seccomp-BPF syscall filter (via ``pyseccomp`` when the host passes its location; blocks
fork/exec/socket/kill/ptrace/rlimit changes at the kernel level, which also holds when running as root, where
``RLIMIT_NPROC`` is ignored), and a ``sys.addaudithook`` hook that turns the same operations -- plus writes
outside the working directory -- into a clear ``SandboxViolation`` message.
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time

_DEVNULL = "/dev/null"
_MAX_MESSAGE = 2000

# Audit events (https://docs.python.org/3/library/audit_events.html) that are refused outright.
_BLOCKED_EVENTS = frozenset(
    {
        "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.startfile",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
        "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "os.setreuid", "os.setregid",
        "os.setresuid", "os.setresgid", "os.setgroups", "os.chroot",
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg", "socket.socketpair",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.cdata", "ctypes.call_function",
        "mmap.__new__", "sys.remote_exec", "webbrowser.open", "urllib.Request", "ftplib.connect",
        "smtplib.connect", "http.client.connect", "telnetlib.Telnet.open", "imaplib.open", "poplib.connect",
        "nntplib.connect",
    }
)
# Modules whose import is refused (they only exist to start processes or call C code).
_BLOCKED_MODULES = frozenset({"_posixsubprocess", "subprocess", "_ctypes", "ctypes", "multiprocessing", "_socket",
                              "socket", "pty", "mmap", "_multiprocessing", "_posixshmem"})
# Events whose first argument is a path the code modifies: allowed only inside the working directory.
_PATH_EVENTS = frozenset(
    {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.link", "os.symlink",
     "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.chflags", "os.mkfifo",
     "os.mknod", "os.lchmod", "os.lchown", "os.removexattr", "os.setxattr"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(BaseException):
    """Raised by the audit hook. A ``BaseException`` so that ``except Exception`` in the code cannot hide it."""


def _inside(path: object, root: str) -> bool:
    if isinstance(path, int):  # an already open file descriptor
        return True
    try:
        p = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return p == root or p.startswith(root + os.sep) or p == _DEVNULL


def _install_audit_hook(workdir: str) -> None:
    """Refuse process creation, signals, rlimit changes, sockets, ctypes and writes outside ``workdir``.

    Mirrors the guarding approach of OpenAI human-eval's ``reliability_guard`` but through PEP 578 audit
    hooks, which cannot be removed once added and also cover ``os``-level calls that the guard monkey-patches.
    """
    root = os.path.realpath(workdir)
    blocked, blocked_mods, path_events = _BLOCKED_EVENTS, _BLOCKED_MODULES, _PATH_EVENTS
    inside, violation = _inside, SandboxViolation

    def hook(event: str, args: tuple) -> None:
        if event in blocked:
            raise violation(f"{event} is not allowed in the sandbox")
        if event == "import":
            if args and args[0] in blocked_mods:
                raise violation(f"import of {args[0]!r} is not allowed in the sandbox")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not inside(path, root):
                raise violation(f"writing {path!r} outside the sandbox directory is not allowed")
        elif event in path_events:
            for p in args[:2] if event in ("os.rename", "os.link", "shutil.copyfile", "shutil.move") else args[:1]:
                if p is not None and not inside(p, root):
                    raise violation(f"{event} on {p!r} outside the sandbox directory is not allowed")

    sys.addaudithook(hook)


def _set_limits(limits: dict) -> None:
    """``setrlimit`` in the child: CPU seconds (SIGXCPU then SIGKILL), address space, file size (EFBIG
    instead of SIGXFSZ), no core dumps, few open files, and no new processes (effective for non-root users;
    root is covered by seccomp and the audit hook)."""
    cpu = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(limits["file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _unshare_network() -> bool:
    """Move the child into a fresh, empty network namespace (root only; silently skipped otherwise)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(0x40000000) == 0  # CLONE_NEWNET
    except (OSError, AttributeError):
        return False


def _load_seccomp(seccomp_path: str | None) -> bool:
    """Install a seccomp-BPF filter with ``pyseccomp`` (found at ``seccomp_path``) when available.

    Denied with EPERM: fork/vfork, clone without CLONE_THREAD (threads keep working), execve(at), socket,
    socketpair, kill/tkill, tgkill on another process, ptrace, setrlimit, prlimit64 with a new limit, unshare,
    setns, mount, chroot, pivot_root; clone3 returns ENOSYS so glibc falls back to the filtered clone.
    """
    sc = _import_seccomp(seccomp_path)
    if sc is None:
        return False
    try:
        f = sc.SyscallFilter(defaction=sc.ALLOW)
        for name in ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "kill", "tkill", "ptrace",
                     "setrlimit", "unshare", "setns", "mount", "umount2", "chroot", "pivot_root",
                     "process_vm_writev", "reboot", "kexec_load", "init_module", "finit_module"):
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000, 0))  # no CLONE_THREAD
        f.add_rule(sc.ERRNO(errno.EPERM), "tgkill", sc.Arg(0, sc.NE, os.getpid()))
        f.add_rule(sc.ERRNO(errno.EPERM), "prlimit64", sc.Arg(2, sc.NE, 0))
        f.load()
        return True
    except Exception:  # noqa: BLE001 - kernel without seccomp: the other layers remain
        return False


def _import_seccomp(seccomp_path: str | None):  # noqa: ANN202 - the module, or None
    """Import ``pyseccomp`` from the host's site-packages directory (the child runs without ``site``)."""
    if not seccomp_path:
        return None
    if "pyseccomp" in sys.modules:
        return sys.modules["pyseccomp"]
    sys.path.insert(0, seccomp_path)
    try:
        import pyseccomp

        return pyseccomp
    except Exception:  # noqa: BLE001 - libseccomp.so missing: the other layers remain
        return None
    finally:
        sys.path.remove(seccomp_path)


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


def _confine(request: dict) -> None:
    os.chdir(request["workdir"])
    if request.get("unshare_network"):
        _unshare_network()
    _set_limits(request["limits"])
    seccomp = _load_seccomp(request.get("seccomp_path"))
    tempfile.tempdir = request["workdir"]
    for name in list(sys.modules):
        if name.split(".")[0] in _BLOCKED_MODULES or name == "pyseccomp":
            del sys.modules[name]
    if request.get("audit_hook", True):
        _install_audit_hook(request["workdir"])
    request["_seccomp"] = seccomp


def _execute(request: dict) -> dict:
    """Confine this process, run the code, and describe how it ended (CRUXEval harness semantics:
    an ``AssertionError`` is a failed check, any other exception an error)."""
    out = _BoundedText(int(request["limits"]["output_chars"]))
    status, message = "passed", ""
    start = time.perf_counter()
    try:
        _confine(request)
        sys.stdout = sys.stderr = out
        code = compile(request["code"], "<sandbox>", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except AssertionError as e:
        status, message = "failed", f"AssertionError: {e}" if str(e) else "AssertionError"
    except SandboxViolation as e:
        status, message = "error", f"SandboxViolation: {e}"
    except SystemExit as e:
        if e.code not in (None, 0):
            status, message = "error", f"SystemExit: {e.code!r}"
    except BaseException as e:  # noqa: BLE001 - the untrusted code may raise anything
        try:
            message = f"{type(e).__name__}: {e}"
        except BaseException:  # noqa: BLE001 - a hostile __str__
            message = type(e).__name__
        status = "error"
        message = message.rstrip(": ")
    return {
        "status": status,
        "message": message[:_MAX_MESSAGE],
        "duration": time.perf_counter() - start,
        "stdout": out.value(),
        "output_truncated": out.truncated,
        "seccomp": bool(request.get("_seccomp")),
    }


def _redirect_std_fds() -> int:
    """Point fds 0/1/2 at /dev/null (so ``os.write(1, ...)`` goes nowhere) and return a private copy of
    the original stdout for the result."""
    result_fd = os.dup(1)
    null = os.open(_DEVNULL, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return result_fd


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


def _run_forked(request: dict) -> dict:
    """Worker mode: run one request in a forked child with its own temp dir and process group."""
    wall = float(request["limits"]["wall_seconds"])
    workdir = tempfile.mkdtemp(prefix="echorl-sandbox-", dir=request.get("tmp_root"))
    request = dict(request, workdir=workdir)
    r_fd, w_fd = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # ---- child
        try:
            os.close(r_fd)
            os.setpgid(0, 0)
            null = os.open(_DEVNULL, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            result = _execute(request)
            _write_all(w_fd, json.dumps(result).encode())
        finally:
            os._exit(0)
    # ---- worker
    os.close(w_fd)
    chunks: list[bytes] = []
    timed_out = False
    deadline = start + wall
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([r_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(r_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    if timed_out:
        _kill_group(pid)
    os.close(r_fd)
    _, wait_status = os.waitpid(pid, 0)
    _kill_group(pid)  # anything the code left behind in its group
    shutil.rmtree(workdir, ignore_errors=True)
    data = b"".join(chunks)
    if data and not timed_out:
        try:
            return json.loads(data)
        except ValueError:
            pass
    result = _signal_result(wait_status, wall, timed_out)
    result.setdefault("duration", time.perf_counter() - start)
    return result


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _worker() -> None:
    """Serve requests (one JSON object per line on stdin) until EOF."""
    out = os.dup(1)
    null = os.open(_DEVNULL, os.O_RDWR)
    os.dup2(null, 1)
    os.close(null)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        _import_seccomp(request.get("seccomp_path"))  # once, before forking: children inherit it
        result = _run_forked(request)
        _write_all(out, (json.dumps(result) + "\n").encode())


def _single() -> None:
    """One-process-per-run mode: this very process is the sandbox (the host made the temp dir)."""
    request = json.loads(sys.stdin.read())
    result_fd = _redirect_std_fds()
    result = _execute(request)
    _write_all(result_fd, json.dumps(result).encode())
    os._exit(0)


if __name__ == "__main__":
    _worker() if "--worker" in sys.argv[1:] else _single()
