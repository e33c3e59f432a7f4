"""Atomic, checksummed, bit-exact files of named numpy arrays (the replay buffer's ``save``/``load`` format).

Layout (format version 2)::

    MAGIC (8 bytes) | header length L (8 bytes, little-endian) | SHA-256 of (length bytes + header) (32 bytes)
    | JSON header (L bytes) | payload

The header lists each array's name, dtype, shape, offset, size and its own SHA-256 (of name, dtype, shape and
bytes), the payload size and free-form
metadata; its checksum covers every header byte, so a flipped byte anywhere in the file is detected (a flip in the
header fails the header checksum, a flip in the payload fails its array's checksum, swapped offsets fail both).

Writing goes to a temporary file ``.<name>.<host>-<pid>.<random>.tmp`` in the same folder, held under an exclusive
``flock`` while it is written, fsynced, then renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a crash leaves either the old file or the new one. A save that is killed leaves its temporary file
behind; :func:`remove_orphans` (run by every save and load) deletes such a file only when the process that wrote it
is gone *and* its lock is free, so a save running in another live process is never disturbed.

Reading (:class:`ReplayFileReader`) opens the file once and does everything through that one descriptor: the
header, the checksums and the arrays (memory maps of the same open file). A concurrent save replaces the directory
entry, not the inode held open, so a load always sees exactly one version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import struct
import uuid
from pathlib import Path
from typing import Any

import numpy as np

try:  # POSIX advisory locks; without them orphans are judged by the writer's pid alone
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["ReplayFileError", "ReplayFileReader", "write_arrays", "remove_orphans", "tmp_name"]

logger = logging.getLogger(__name__)

MAGIC = b"ECHORLRB"
VERSION = 2
_PREFIX = 8 + 8 + 32
_CHUNK = 1 << 24
_MAX_HEADER = 1 << 30
_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
_TMP_RE = re.compile(r"^(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)\.[0-9a-f]{32}\.tmp$")


class ReplayFileError(ValueError):
    """A replay file is missing, truncated, corrupt, or from an incompatible buffer."""


# ---------------------------------------------------------------------------------------------------- writing
def _bytes_view(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr)).cast("B")


def _chunks(arr: np.ndarray):
    # Stream large (memmap) arrays row-block by row-block so saving 10^7 cold transitions does not copy them all.
    if arr.ndim == 0 or arr.nbytes <= _CHUNK:
        yield _bytes_view(arr)
        return
    row_bytes = max(1, arr.nbytes // len(arr))
    step = max(1, _CHUNK // row_bytes)
    for i in range(0, len(arr), step):
        yield _bytes_view(arr[i : i + step])


def _array_digest(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """SHA-256 seeded with the array's name, dtype and shape, so a table entry cannot be swapped with another."""
    digest = hashlib.sha256()
    digest.update(json.dumps([name, np.dtype(dtype).str, [int(s) for s in shape]]).encode() + b"\0")
    return digest


def tmp_name(path: Path) -> Path:
    """The temporary file a save of ``path`` writes first: ``.<name>.<host>-<pid>.<random>.tmp``."""
    return path.with_name(f".{path.name}.{_HOST}-{os.getpid()}.{uuid.uuid4().hex}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_orphans(path: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary files of saves of ``path`` that were killed before their rename; returns what was removed.

    A file is removed only if it was written on this host by a process that no longer exists and nobody holds its
    lock (a save in progress holds an exclusive ``flock``), so a live writer -- in this or another process -- keeps
    its file. A pid reused by an unrelated process keeps the orphan (the safe direction) until that process exits.
    """
    path = Path(path)
    prefix = f".{path.name}."
    removed: list[Path] = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        m = _TMP_RE.match(name[len(prefix):])
        if m is None or m["host"] != _HOST or pid_alive(int(m["pid"])):
            continue
        tmp = path.parent / name
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live writer holds it
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
                logger.warning("removed %s, left by a save (pid %s) that was killed before it finished",
                               tmp, m["pid"])
        finally:
            os.close(fd)
    return removed


def write_arrays(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Atomically write ``arrays`` and JSON-serialisable ``meta`` to ``path`` (orphaned temp files are removed)."""
    path = Path(path)
    entries, offset = [], 0
    for name, arr in arrays.items():
        digest = _array_digest(name, arr.dtype, arr.shape)
        for chunk in _chunks(arr):
            digest.update(chunk)
        entries.append({"name": name, "dtype": arr.dtype.str, "shape": [int(s) for s in arr.shape],
                        "offset": offset, "nbytes": int(arr.nbytes), "sha256": digest.hexdigest()})
        offset += int(arr.nbytes)
    header = json.dumps({"version": VERSION, "arrays": entries, "payload_nbytes": offset, "meta": meta}).encode()
    length = struct.pack("<Q", len(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = tmp_name(path)
    try:
        with open(tmp, "xb") as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            f.write(MAGIC + length + hashlib.sha256(length + header).digest() + header)
            for arr in arrays.values():
                for chunk in _chunks(arr):
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # still under the lock: no cleaner can judge the file orphaned meanwhile
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename durable too
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------- reading
def _check_entries(path: Path, header: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Validate the array table (types, sizes, contiguous offsets); returns it keyed by name."""
    entries: dict[str, dict[str, Any]] = {}
    offset = 0
    for e in header["arrays"]:
        name, shape = e["name"], tuple(e["shape"])
        dtype = np.dtype(e["dtype"])
        if not isinstance(name, str) or name in entries or dtype.hasobject:
            raise ReplayFileError(f"{path} has a bad array entry {e!r}")
        if not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ReplayFileError(f"{path} has a bad shape {shape!r} for array {name!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if e["nbytes"] != nbytes or e["offset"] != offset or not isinstance(e["sha256"], str):
            raise ReplayFileError(f"{path}: array {name!r} entry is inconsistent ({e!r}, expected offset {offset}, "
                                  f"nbytes {nbytes})")
        offset += nbytes
        entries[name] = {**e, "shape": shape, "dtype": dtype}
    if offset != header["payload_nbytes"]:
        raise ReplayFileError(f"{path}: arrays cover {offset} bytes, header declares {header['payload_nbytes']}")
    return entries


class ReplayFileReader:
    """One replay file opened once: validated header, checksums and arrays all read through the same descriptor.

    Use as a context manager. Construction checks magic, header checksum, version, the array table and the file
    size; :meth:`verify` checks every array's SHA-256; :meth:`array` returns a read-only memory map.

    Raises:
        ReplayFileError: missing, truncated or corrupt file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()/__exit__
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ReplayFileError(f"no replay file at {self.path} ({e.strerror})") from e
        try:
            self._read_header()
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> None:
        path, f = self.path, self._file
        size = os.fstat(f.fileno()).st_size
        head = f.read(_PREFIX)
        if len(head) < 16 or head[:8] != MAGIC:
            raise ReplayFileError(f"{path} is not an echorl replay file (bad magic {head[:8]!r}); was it written by save()?")
        if len(head) < _PREFIX:
            raise ReplayFileError(f"{path} is truncated: {size} bytes, shorter than the {_PREFIX}-byte prefix")
        (hlen,) = struct.unpack("<Q", head[8:16])
        if hlen > min(size - _PREFIX, _MAX_HEADER):
            raise ReplayFileError(f"{path} is truncated or corrupt: header of {hlen} bytes declared, file has {size} bytes")
        raw = f.read(hlen)
        if hashlib.sha256(head[8:16] + raw).digest() != head[16:_PREFIX]:
            raise ReplayFileError(f"{path} is corrupt: header checksum mismatch")
        try:
            header = json.loads(raw)
            if header.get("version") != VERSION:
                raise ReplayFileError(f"{path} has format version {header.get('version')}, this echorl reads {VERSION}")
            self.entries = _check_entries(path, header)
            self.meta: dict[str, Any] = header["meta"]
        except ReplayFileError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # a header whose checksum was forged
            raise ReplayFileError(f"{path} has a malformed header ({type(e).__name__}: {e})") from e
        self._start = _PREFIX + hlen
        expected = self._start + int(header["payload_nbytes"])
        if size != expected:
            raise ReplayFileError(f"{path} is truncated or has trailing data: {size} bytes on disk, header declares {expected}")

    def verify(self) -> None:
        """Stream every array through SHA-256 and compare with the header; raises :class:`ReplayFileError`."""
        fd = self._file.fileno()
        for name, e in self.entries.items():
            digest, pos, end = _array_digest(name, e["dtype"], e["shape"]), self._start + e["offset"], self._start + e["offset"] + e["nbytes"]
            while pos < end:
                chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
                if not chunk:
                    raise ReplayFileError(f"{self.path} is truncated inside array {name!r}")
                digest.update(chunk)
                pos += len(chunk)
            if digest.hexdigest() != e["sha256"]:
                raise ReplayFileError(f"{self.path} is corrupt: checksum mismatch in array {name!r}")

    def array(self, name: str) -> np.ndarray:
        """A read-only memory map of array ``name`` (of the file opened at construction; call :meth:`verify` first)."""
        e = self.entries.get(name)
        if e is None:
            raise ReplayFileError(f"{self.path} has no array {name!r}; arrays: {list(self.entries)}")
        if e["nbytes"] == 0:
            return np.zeros(e["shape"], dtype=e["dtype"])
        return np.memmap(self._file, mode="r", dtype=e["dtype"], shape=e["shape"], offset=self._start + e["offset"])

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ReplayFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
