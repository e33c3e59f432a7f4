"""Python-level guard of the sandbox child: the PEP 578 audit hook (standard library only).

Loaded by ``sandbox/child.py`` by path before any untrusted code runs (the child runs as ``python -I -S``
and never imports ``echorl_envs``). The hook gives clear ``SandboxViolation`` messages for refused
operations and, more importantly for judging, keeps the judged code away from the interpreter's own state:
frames (``sys._getframe``, ``gi_frame``/``tb_frame``/..., trace and profile functions), ``gc`` object walks,
hand-made code objects and ``marshal`` (which can read arbitrary memory), ``ctypes`` and the CPython test
modules. That is what keeps the per-run result nonce (see ``sandbox/child.py``) out of reach, so the judged
code cannot forge a ``passed`` report. The kernel layers (uid drop, namespaces, seccomp, rlimits) are what
keeps the host safe; the hook only adds messages and the in-process secrecy the nonce needs.
"""

from __future__ import annotations

import json
import os
import sys

# Audit events (https://docs.python.org/3/library/audit_events.html) that are refused outright.
BLOCKED_EVENTS = frozenset(
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
        # the interpreter's own state: frames, object walks, tracing, hand-made code, more hooks
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
        "sys._current_exceptions", "sys.settrace", "sys.setprofile", "sys.addaudithook", "code.__new__",
        "marshal.loads", "marshal.load", "cpython.PyInterpreterState_New", "cpython.run_interactivehook",
    }
)
# Modules whose import is refused (they start processes, call C code or reach raw memory).
BLOCKED_MODULES = frozenset(
    {"_posixsubprocess", "subprocess", "_ctypes", "ctypes", "multiprocessing", "_socket", "socket", "pty",
     "mmap", "_multiprocessing", "_posixshmem", "_testcapi", "_testinternalcapi", "_testbuffer",
     "_testmultiphase", "_testimportmultiple", "_testsinglephase", "_xxsubinterpreters", "_xxinterpchannels",
     "_xxtestfuzz", "_ctypes_test", "_cffi_backend", "cffi", "faulthandler", "tracemalloc"}
)
# Attribute reads that hand out frames (``object.__getattr__`` audit event).
BLOCKED_ATTRIBUTES = frozenset({"gi_frame", "cr_frame", "ag_frame", "tb_frame", "f_back"})
# Events whose first argument(s) are paths the code modifies: allowed only inside the working directory.
PATH_EVENTS = {
    "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.chmod": 1, "os.chown": 1, "os.link": 2,
    "os.symlink": 2, "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1, "shutil.copyfile": 2,
    "shutil.move": 2, "os.chflags": 1, "os.mkfifo": 1, "os.mknod": 1, "os.lchmod": 1, "os.lchown": 1,
    "os.removexattr": 1, "os.setxattr": 1,
}
_DIR_FD_AT = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.rename": 2, "os.chmod": 2, "os.chown": 3,
              "os.link": 2, "os.symlink": 2, "os.utime": 3, "os.mkfifo": 2, "os.mknod": 3}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DEVNULL = "/dev/null"


class SandboxViolation(BaseException):
    """Raised by the audit hook. A ``BaseException`` so that ``except Exception`` in the code cannot hide it."""


def _resolve(path: object) -> str | None:
    """The real path ``path`` names (an int is an open fd, resolved through /proc/self/fd), or None."""
    try:
        if isinstance(path, int):
            return os.readlink(f"/proc/self/fd/{path}")
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError, OSError):
        return None


def _inside(path: object, root: str) -> bool:
    p = _resolve(path)
    return p is not None and (p == root or p.startswith(root + os.sep) or p == _DEVNULL)


def _guard_extension_loading(hook_state: dict) -> None:
    """Route ``_imp.create_dynamic``/``create_builtin`` through the audit hook.

    ``ExtensionFileLoader`` loads a ``.so`` by path without an ``import`` event, and an extension module the
    trusted worker already loaded (``_ctypes``, used by pyseccomp) comes back from CPython's cache even when
    its file is masked. The wrappers below hold no reference to the real functions (only the unreachable hook
    does); they raise the ``echorl.create_*`` event and the hook refuses blocked modules and fresh copies of ``_imp``
    and ``_signal`` (which would bring back the functions the child replaced).
    """
    import _imp
    import types

    hook_state["create_dynamic"], hook_state["create_builtin"] = _imp.create_dynamic, _imp.create_builtin
    hook_state["namespace"] = types.SimpleNamespace

    def create_dynamic(spec, file=None, _audit=sys.audit):  # noqa: ANN001, ANN202
        box: list = []
        _audit("echorl.create_dynamic", spec.name, spec.origin, box)
        return box[0]

    def create_builtin(spec, _audit=sys.audit):  # noqa: ANN001, ANN202
        box: list = []
        _audit("echorl.create_builtin", spec.name, getattr(spec, "origin", None), box)
        return box[0]

    _imp.create_dynamic, _imp.create_builtin = create_dynamic, create_builtin


def install_audit_hook(workdir: str) -> None:
    """Install the hook for a run whose working directory is ``workdir`` (cannot be removed afterwards).

    Refuses: process creation, signals, rlimit/uid changes, sockets, ctypes, frame and ``gc`` access,
    tracing, code-object construction, reading ``/proc``, and writes outside ``workdir`` (including
    ``dir_fd=`` forms and fd-based ``fchmod``/``ftruncate``/... on files outside it).
    """
    root = os.path.realpath(workdir)
    blocked, blocked_mods, blocked_attrs = BLOCKED_EVENTS, BLOCKED_MODULES, BLOCKED_ATTRIBUTES
    path_events, dir_fd_at, write_flags = PATH_EVENTS, _DIR_FD_AT, _WRITE_FLAGS
    two_dir_fds = ("os.rename", "os.link")
    inside, resolve, violation = _inside, _resolve, SandboxViolation
    isinstance_, str_, len_, any_, type_ = isinstance, str, len, any, type
    state: dict = {}
    _guard_extension_loading(state)
    create = {"echorl.create_dynamic": state.pop("create_dynamic"), "echorl.create_builtin": state.pop("create_builtin")}
    namespace, basename = state.pop("namespace"), os.path.basename

    def hook(event: str, args: tuple) -> None:
        if event in blocked or event.startswith("ctypes."):
            raise violation(f"{event} is not allowed in the sandbox")
        if event in create:  # (name, origin, box) from the _imp wrappers
            name, origin, box = args
            if type_(name) is not str_ or (origin is not None and type_(origin) is not str_):
                raise violation("extension modules must be named by plain strings in the sandbox")
            stem = basename(origin).split(".")[0] if origin else name
            if name in ("_imp", "_signal") or name.split(".")[-1] in blocked_mods or stem in blocked_mods:
                raise violation(f"loading the extension module {name!r} is not allowed in the sandbox")
            box.append(create[event](namespace(name=name, origin=origin)))
            return
        if event == "import":
            if args and args[0] in blocked_mods:
                raise violation(f"import of {args[0]!r} is not allowed in the sandbox")
        elif event == "object.__getattr__":
            if len_(args) > 1 and args[1] in blocked_attrs:
                raise violation(f"reading .{args[1]} is not allowed in the sandbox")
        elif event in ("object.__setattr__", "object.__delattr__"):
            if len_(args) > 1 and args[1] in ("__code__", "__globals__", "__closure__"):
                raise violation(f"changing .{args[1]} is not allowed in the sandbox")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance_(path, int):  # re-opening an fd the code already holds grants nothing new
                return
            real = resolve(path)
            if real is not None and (real == "/proc" or real.startswith("/proc/")):
                raise violation("reading /proc is not allowed in the sandbox")
            writing = (isinstance_(mode, str_) and any_(c in mode for c in "wax+")) or (
                isinstance_(flags, int) and flags & write_flags
            )
            if writing and not inside(path, root):
                raise violation(f"writing {path!r} outside the sandbox directory is not allowed")
        elif event in path_events:
            at = dir_fd_at.get(event)
            # dir_fd arguments are -1 (or None) when not given; a real one could point anywhere
            if at is not None and any_(d not in (None, -1) for d in args[at:at + 2 if event in two_dir_fds else at + 1]):
                raise violation(f"{event} with dir_fd is not allowed in the sandbox")
            for p in args[: path_events[event]]:
                if p is not None and not inside(p, root):
                    raise violation(f"{event} on {p!r} outside the sandbox directory is not allowed")

    sys.addaudithook(hook)


def verify_report(data: bytes, nonce: str, wait_status: int | None) -> dict | None:
    """The report ``data`` as a result dict if it is genuine (one JSON object carrying ``nonce``, the process
    exited with status 0), ``{"status": "error", ...}`` if something else was written, None if nothing was."""
    if not data:
        return None
    try:
        result = json.loads(data)
        genuine = isinstance(result, dict) and result.pop("nonce", None) == nonce
    except ValueError:
        genuine = False
    if not genuine:
        return {"status": "error", "message": "the code wrote a forged or garbled result (not a pass)"}
    if wait_status is not None and not (os.WIFEXITED(wait_status) and os.WEXITSTATUS(wait_status) == 0):
        return None
    return result
