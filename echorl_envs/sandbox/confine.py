"""Kernel-level confinement of the sandbox child (standard library only; loaded by ``sandbox/child.py``).

Two stages:

* once per worker process, :func:`isolate`: fresh PID, network, IPC, UTS and mount namespaces (plus a user
  namespace when not root), and a private root file system -- a tmpfs holding only read-only binds of
  ``/usr`` and the Python standard library (``ctypes``/test extension modules masked), ``/dev/null`` and
  friends, a ``/proc`` of the new PID namespace (no host pid is visible) and a size-limited tmpfs ``/tmp``
  for the work directories (``disk_mb`` is a limit on the *total* written, not per file);
* in each run's forked child, :func:`set_limits`, :func:`drop_privileges` (to ``nobody``: the host's files
  under ``/root``, other users' ``/proc/<pid>`` files and this process's own ``/proc/self/mem`` become
  unreadable) and :func:`load_seccomp`.

Every layer that cannot be enabled is reported by name; the host turns that into a one-time warning.
"""

from __future__ import annotations

import errno
import glob
import os
import resource
import signal
import sys
import sysconfig

NOBODY = 65534
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_AT_FDCWD = -100 & 0xFFFFFFFF  # as the kernel hands a 32-bit int argument to the filter
# Extension modules masked in the private root (they reach raw memory or C calls; the audit hook also refuses
# their import, but ``ExtensionFileLoader`` can load a file by path).
_MASKED_EXTENSIONS = ("_ctypes", "_ctypes_test", "_testcapi", "_testinternalcapi", "_testbuffer",
                      "_testmultiphase", "_testimportmultiple", "_testsinglephase", "_xxsubinterpreters",
                      "_xxinterpchannels", "_xxtestfuzz", "xxlimited", "xxlimited_35", "xxsubtype")


def _libc():  # noqa: ANN202 - a ctypes CDLL (only in the trusted worker, before any untrusted code runs)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc, ctypes


def _mount(libc, ctypes, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:  # noqa: ANN001
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def _bind(libc, ctypes, src: str, dst: str, *, writable: bool = False) -> None:  # noqa: ANN001
    if os.path.isdir(src):
        os.makedirs(dst, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        if not os.path.exists(dst):
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(libc, ctypes, src, dst, None, _MS_BIND | _MS_REC)
    if not writable:
        try:
            _mount(libc, ctypes, None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        except OSError:  # inside a user namespace the locked flags of the source must be kept as they are
            _mount(libc, ctypes, None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)


def _relay_exit(pid: int) -> None:
    """The outer process after unshare(CLONE_NEWPID): wait for the namespace's init and mirror its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in range(0, 3):
        try:
            os.close(fd)
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _enter_namespaces(libc, ctypes) -> bool:  # noqa: ANN001
    """unshare PID/net/IPC/UTS/mount (and user, when not root) namespaces; returns False if not allowed."""
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
    if uid != 0:
        flags |= _CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        return False
    if uid != 0:  # map ourselves to root inside the user namespace (needed to mount)
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1")):
            try:
                with open(path, "w") as fh:
                    fh.write(text)
            except OSError:
                if path != "/proc/self/setgroups":
                    return False
    return True


def _build_root(libc, ctypes, disk_mb: int) -> None:  # noqa: ANN001
    """Private mount view: a tmpfs root with read-only /usr, the stdlib, /dev nodes, a fresh /proc and /tmp."""
    _mount(libc, ctypes, None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount(libc, ctypes, "tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=8m,mode=755")
    root = "/tmp/root"
    os.mkdir(root, 0o755)
    for name in ("usr", "bin", "lib", "lib64", "lib32", "libx32", "sbin"):
        src = "/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), root + src)
        elif os.path.isdir(src):
            _bind(libc, ctypes, src, root + src)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if not stdlib.startswith("/usr/"):
        _bind(libc, ctypes, stdlib, root + stdlib)
    dynload = os.path.join(stdlib, "lib-dynload")
    for name in _MASKED_EXTENSIONS:
        for so in glob.glob(os.path.join(dynload, name + ".*so")):
            _mount(libc, ctypes, "/dev/null", root + so, None, _MS_BIND)
    for dev in ("null", "zero", "urandom", "random"):
        _bind(libc, ctypes, "/dev/" + dev, root + "/dev/" + dev, writable=True)
    os.mkdir(root + "/proc", 0o555)
    _mount(libc, ctypes, "proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(root + "/tmp", 0o755)
    _mount(libc, ctypes, "tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={int(disk_mb)}m,nr_inodes=4096,mode=711")
    os.chroot(root)
    os.chdir("/")


#: ``<linux/prctl.h>``: the signal this process gets when its parent thread dies.
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this process when its parent (thread) dies.
    A change of credentials (a user namespace, the uid drop) clears it. Returns whether it is armed."""
    try:
        libc, _ = _libc()
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def isolate(disk_mb: int, relay_dies_with_parent: bool = False) -> list[str]:
    """Enter fresh namespaces and a private root (call once per worker; forks: the caller continues as the
    PID namespace's init, the original process only relays its exit). Returns the layers now active.

    The init dies with the relay (PR_SET_PDEATHSIG; the kernel then kills every process of the namespace), and
    with ``relay_dies_with_parent`` the relay dies with its own parent (armed again after the unshare, which
    clears it when it enters a user namespace).
    """
    layers: list[str] = []
    try:
        libc, ctypes = _libc()
    except OSError:
        return layers
    if not _enter_namespaces(libc, ctypes):
        return layers
    parent = os.getppid()
    pid = os.fork()
    if pid > 0:
        if relay_dies_with_parent:
            die_with_parent()
            if os.getppid() != parent:  # the parent died before the guard was armed
                os.kill(pid, signal.SIGKILL)
        _relay_exit(pid)
    die_with_parent()  # the relay's main thread forked us and lives as long as the relay
    layers.append("namespaces")
    try:
        _build_root(libc, ctypes, disk_mb)
        layers.append("mount_view")
    except OSError:
        pass
    return layers


def can_drop_privileges() -> bool:
    """Whether this process may switch to ``nobody`` (root of the initial user namespace)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return True


def drop_privileges() -> None:
    """Become ``nobody`` for good (real, effective and saved ids; no supplementary groups)."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def set_limits(limits: dict, threads: bool) -> None:
    """``setrlimit``: CPU seconds (SIGXCPU then SIGKILL), address space, file size (EFBIG instead of
    SIGXFSZ), no core dumps, few open files, and processes (0, or a few threads when seccomp already stops
    fork: the count is per uid, so it only bounds threads)."""
    cpu = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(limits["file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    nproc = 256 if threads else 0
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


# Syscalls denied with EPERM (names unknown to this kernel/libseccomp are skipped).
_DENIED = (
    "fork", "vfork", "execve", "execveat", "socket", "socketpair", "kill", "tkill", "ptrace", "setrlimit",
    "unshare", "setns", "mount", "umount2", "chroot", "pivot_root", "process_vm_readv", "process_vm_writev",
    "rt_sigaction", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "kcmp", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "open_by_handle_at", "name_to_handle_at", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setgroups", "setfsuid", "setfsgid", "capset", "seccomp", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "swapon", "swapoff", "acct", "quotactl", "syslog",
    "fchmod", "fchown",  # fd-based: the fd may name any file the code could open read-only
)
# *at syscalls that modify a path: denied when the directory fd is not AT_FDCWD (index of that argument).
_AT_WRITES = {"mkdirat": (0,), "unlinkat": (0,), "renameat": (0, 2), "renameat2": (0, 2), "linkat": (0, 2),
              "symlinkat": (1,), "fchmodat": (0,), "fchownat": (0,), "mknodat": (0,)}


def load_seccomp(sc) -> bool:  # noqa: ANN001 - the pyseccomp module or None
    """Install the seccomp-BPF filter (kernel level: holds for root and for code that subverts Python).

    Denied with EPERM: every name in ``_DENIED`` -- process creation and exec, sockets, signals to other
    processes (kill, pidfd_send_signal; tgkill only to this process), ptrace and process_vm_*, namespace,
    mount and privilege changes, Python signal handlers (rt_sigaction: a handler receives the interrupted
    frame), io_uring, bpf, keys, file handles; clone without CLONE_THREAD (threads keep working; clone3 gets
    ENOSYS so glibc falls back to clone); prlimit64 with a new limit; and writes through a foreign directory
    fd: openat with write flags and the modifying *at calls whose dirfd is not AT_FDCWD.
    """
    if sc is None:
        return False
    try:
        f = sc.SyscallFilter(defaction=sc.ALLOW)
        for name in _DENIED:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError, RuntimeError):
                pass
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000, 0))  # no CLONE_THREAD
        f.add_rule(sc.ERRNO(errno.EPERM), "tgkill", sc.Arg(0, sc.NE, os.getpid()))
        f.add_rule(sc.ERRNO(errno.EPERM), "prlimit64", sc.Arg(2, sc.NE, 0))
        for bit in (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND):
            f.add_rule(sc.ERRNO(errno.EPERM), "openat", sc.Arg(0, sc.NE, _AT_FDCWD), sc.Arg(2, sc.MASKED_EQ, bit, bit))
        for name, positions in _AT_WRITES.items():
            for pos in positions:
                try:
                    f.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(pos, sc.NE, _AT_FDCWD))
                except (OSError, ValueError, RuntimeError):
                    pass
        f.load()
        return True
    except Exception:  # noqa: BLE001 - kernel without seccomp: the other layers remain
        return False


def import_seccomp(seccomp_path: str | None):  # noqa: ANN201 - the module, or None
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
