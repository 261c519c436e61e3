"""Small file-system helpers for the segment store: atomic replace, directory fsync, the data-dir lock.

Every OSError leaving here becomes a ``StorageError`` with one sentence naming the path, because the
operator reading the log needs to know which file and why, not a traceback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from broker.errors import StorageError

__all__ = [
    "DirLock", "atomic_write", "fsync_dir", "read_json", "reserve_blocks", "write_all", "write_all_parts",
]

_FALLOC_FL_KEEP_SIZE = 1  # <linux/falloc.h>
# What fallocate answers where this file system (or kernel) cannot reserve blocks: give up for good.
UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    """Linux's fallocate(2) (Python's os module has only posix_fallocate, which changes the file size)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fallocate)


_fallocate = _load_fallocate()


def reserve_blocks(fd: int, offset: int, length: int) -> int:
    """Allocate disk blocks for ``length`` bytes from ``offset`` without changing the file's size
    (``fallocate(fd, FALLOC_FL_KEEP_SIZE, ...)``); 0, or the errno why not (``ENOSYS`` without fallocate).

    Appends into reserved blocks skip ext4's delayed allocation per page (bench/RESULTS.md), and since
    the size does not move, readers and crash recovery see the file exactly as without it.
    ``ftruncate`` to the file's size gives unused reserved blocks back."""
    if _fallocate is None:
        return errno.ENOSYS
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return 0
    return ctypes.get_errno()


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until every byte is written (regular files may take fewer bytes, e.g. on ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_all_parts(fd: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Write ``parts`` one after the other with one ``os.writev`` (none of them copied into one buffer
    first), continuing where a short write stopped."""
    if len(parts) == 1:
        write_all(fd, parts[0])
        return
    written = os.writev(fd, parts)
    total = sum(map(len, parts))
    if written == total:
        return
    for part in parts:  # a short write (e.g. ENOSPC on the way): finish part by part
        if written >= len(part):
            written -= len(part)
            continue
        write_all(fd, memoryview(part)[written:])
        written = 0


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Write a temporary file, fsync it, rename it over the old one, fsync the directory.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc


def read_json(path: Path) -> object | None:
    """The JSON document in ``path``, None if the file does not exist; StorageError if unreadable."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise StorageError(f"{path} is not valid JSON ({exc}); fix or remove it by hand") from exc


class DirLock:
    """An exclusive ``flock`` on ``<root>/.lock``: two processes writing one data dir would corrupt it."""

    def __init__(self, root: Path) -> None:
        self.path = root / ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(
                f"data directory {self.path.parent} is not usable: cannot create {self.path.name} ({exc.strerror}); "
                "files made by another user (an earlier run through sudo?) need this user's write access "
                "(chown -R), or pass another --data-dir"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StorageError(
                f"data directory {self.path.parent} is in use by another Sluice process (lock {self.path} is held): "
                "stop that one, or give this one its own --data-dir"
            ) from exc
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
