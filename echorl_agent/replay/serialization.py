"""Atomic, checksummed, bit-exact files of named numpy arrays (the replay buffer's ``save``/``load`` format).

Layout: ``MAGIC (8 bytes) | header length (8 bytes, little-endian) | JSON header | payload``. The header lists each
array's name, dtype, shape, offset and size, the total payload size and the payload's SHA-256, plus free-form
metadata. Writing goes to a temporary file in the same folder, is fsynced, then renamed over the target
(``os.replace`` is atomic on POSIX and Windows), so a crash leaves either the old file or the new one. Reading
first checks magic, header, file size and checksum, and only then hands out the arrays, so a truncated or corrupt
file raises :class:`ReplayFileError` before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ReplayFileError", "write_arrays", "read_header", "verify_payload", "read_array"]

MAGIC = b"ECHORLRB"
VERSION = 1
_CHUNK = 1 << 24


class ReplayFileError(ValueError):
    """A replay file is missing, truncated, corrupt, or from an incompatible buffer."""


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


def write_arrays(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Atomically write ``arrays`` and JSON-serialisable ``meta`` to ``path``."""
    path = Path(path)
    entries, offset, digest = [], 0, hashlib.sha256()
    for name, arr in arrays.items():
        for chunk in _chunks(arr):
            digest.update(chunk)
        entries.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset,
                        "nbytes": int(arr.nbytes)})
        offset += int(arr.nbytes)
    header = json.dumps({"version": VERSION, "arrays": entries, "payload_nbytes": offset,
                         "sha256": digest.hexdigest(), "meta": meta}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for arr in arrays.values():
                for chunk in _chunks(arr):
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
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


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the header (magic, version, declared sizes against the file size)."""
    path = Path(path)
    if not path.is_file():
        raise ReplayFileError(f"no replay file at {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise ReplayFileError(f"{path} is not an echorl replay file (bad magic {head[:8]!r}); was it written by save()?")
        (hlen,) = struct.unpack("<Q", head[8:])
        if hlen > size - 16:
            raise ReplayFileError(f"{path} is truncated: header of {hlen} bytes declared, file has {size} bytes")
        try:
            header = json.loads(f.read(hlen))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReplayFileError(f"{path} has a corrupt header ({e})") from e
    if header.get("version") != VERSION:
        raise ReplayFileError(f"{path} has format version {header.get('version')}, this echorl reads {VERSION}")
    header["_payload_start"] = 16 + hlen
    expected = header["_payload_start"] + int(header["payload_nbytes"])
    if size != expected:
        raise ReplayFileError(
            f"{path} is truncated or has trailing data: {size} bytes on disk, header declares {expected}"
        )
    return header


def verify_payload(path: str | os.PathLike[str], header: dict[str, Any]) -> None:
    """Stream the payload through SHA-256 and compare with the header; raises :class:`ReplayFileError`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(header["_payload_start"])
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != header["sha256"]:
        raise ReplayFileError(f"{path} is corrupt: payload checksum mismatch (expected {header['sha256'][:16]}...)")


def read_array(path: str | os.PathLike[str], header: dict[str, Any], name: str) -> np.ndarray:
    """A read-only memory map of array ``name`` (call :func:`verify_payload` first)."""
    for e in header["arrays"]:
        if e["name"] == name:
            shape = tuple(e["shape"])
            if e["nbytes"] == 0:
                return np.zeros(shape, dtype=np.dtype(e["dtype"]))
            return np.memmap(path, mode="r", dtype=np.dtype(e["dtype"]), shape=shape,
                             offset=header["_payload_start"] + e["offset"])
    raise ReplayFileError(f"{path} has no array {name!r}; arrays: {[e['name'] for e in header['arrays']]}")
