"""What a sandboxed run may use (:class:`SandboxConfig`) and how it ended (:class:`SandboxResult`).

Plain data shared by the host (:mod:`echorl_envs.sandbox.host`) and its callers; the confined child never imports
it (it reads the limits from the request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SandboxConfig", "SandboxResult", "STATUSES"]

#: The possible ``SandboxResult.status`` values.
STATUSES = ("passed", "failed", "timeout", "error")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    wall_seconds: float = 5.0
    """Wall-clock limit; the host kills the run's process group when it passes."""
    cpu_seconds: int = 3
    """CPU-time limit (``RLIMIT_CPU``); exceeding it kills the child with SIGXCPU (status ``timeout``)."""
    memory_mb: int = 512
    """Address-space limit (``RLIMIT_AS``) in MiB; allocations beyond it raise ``MemoryError``."""
    file_size_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``) in MiB; beyond it writes fail with EFBIG."""
    output_chars: int = 10_000
    """Characters of stdout/stderr kept; the rest is dropped and ``output_truncated`` set."""
    seccomp: bool = True
    """Install the seccomp-BPF filter when ``pyseccomp`` and libseccomp are available."""
    unshare_network: bool = False
    """Kept for compatibility: an empty network namespace is now part of ``isolate``."""
    isolate: bool = True
    """Fresh PID/network/IPC/UTS/mount namespaces, a private read-only root with only ``/usr`` and the Python
    standard library, a size-limited ``/tmp`` (``disk_mb``) and the switch to ``nobody`` (see
    ``sandbox/confine.py``). Set up once per worker; a layer the platform refuses is skipped with a
    one-time warning."""
    disk_mb: int = 64
    """Total disk the code may write in its work directory, in MiB (a tmpfs of that size; with ``isolate``)."""
    audit_hook: bool = True
    """Install the audit hook (clear messages, write confinement); turn off only to test the kernel layers."""
    python: str | None = None
    """Interpreter to run (default: ``sys.executable``)."""

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "file_size_mb", "output_chars", "disk_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxConfig.{name} must be a positive number, got {name}={value!r}")
        if self.memory_mb < 64:
            raise ValueError(
                f"SandboxConfig.memory_mb must be >= 64 (the interpreter itself needs it), got memory_mb={self.memory_mb}"
            )

    def limits(self) -> dict[str, Any]:
        return {
            "wall_seconds": float(self.wall_seconds),
            "cpu_seconds": max(1, int(self.cpu_seconds)),
            "memory_bytes": int(self.memory_mb) << 20,
            "file_bytes": int(self.file_size_mb) << 20,
            "output_chars": int(self.output_chars),
        }


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended.

    ``status`` is ``passed`` (ran to the end), ``failed`` (an ``AssertionError``: a wrong answer, as in
    CRUXEval's harness), ``timeout`` (wall-clock or CPU limit) or ``error`` (any other exception, a refused
    operation, a crash); ``message`` says which.
    """

    status: str
    message: str = ""
    duration: float = 0.0
    stdout: str = ""
    output_truncated: bool = False
    seccomp: bool = False
    layers: tuple[str, ...] = ()
    """The confinement layers that were active (``namespaces``, ``mount_view``, ``uid_drop``, ``seccomp``,
    ``audit_hook``)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SandboxResult:
        status = d.get("status", "error")
        return cls(
            status=status if status in STATUSES else "error",
            message=str(d.get("message", "")),
            duration=float(d.get("duration", 0.0)),
            stdout=str(d.get("stdout", "")),
            output_truncated=bool(d.get("output_truncated", False)),
            seccomp=bool(d.get("seccomp", False)),
            layers=tuple(str(x) for x in d.get("layers", ()) if isinstance(x, str)),
        )
