"""A bound on the file descriptors segment files hold, shared by every partition of a store.

Why: a segment holds up to three descriptors (log, offset index, time index). Kept open for every
partition, 5,000 partitions held 15,000 descriptors and the process ran out (``EMFILE``), refusing
Kafka and HTTP clients too. Segments now open their files on use and register here; once more than
``limit`` descriptors are open, the least recently used segments are closed again.

Rules:
- A segment is *touched* when it is read, written or synced; it moves to the recent end.
- Trimming never closes the segment being used right now (``keep``), nor one with an fsync in flight
  (``syncing``): its descriptors are in a worker thread's hands. Unsynced writes do not pin a
  segment: the data sits in the page cache whichever descriptor wrote it, and the next fsync reopens
  the file (``fsync`` flushes the inode, not the descriptor).
- The bound is soft: when every open segment is pinned, the count may exceed it until they unpin.
- An ``open`` that fails with ``EMFILE``/``ENFILE`` (sockets or other code used the headroom) closes
  every idle cached descriptor and tries once more before the error reaches the caller.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections import OrderedDict
from typing import Protocol

__all__ = ["FdCache", "FdUser", "default_fd_limit"]

log = logging.getLogger("broker.log.fdcache")

_MIN_LIMIT = 4  # one segment holds up to three descriptors


class FdUser(Protocol):
    """What the cache needs of a segment."""

    @property
    def open_fds(self) -> int: ...

    @property
    def syncing(self) -> int: ...

    def close(self) -> None: ...


def default_fd_limit() -> int:
    """Half of the process's soft ``RLIMIT_NOFILE``: the other half stays for sockets and the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, soft // 2)


class FdCache:
    """LRU of segments with open descriptors; ``limit=None`` only counts (no bound)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = None if limit is None else max(limit, _MIN_LIMIT)
        self.open_count = 0
        self.evictions = 0  # segments closed to stay under the bound
        self.exhausted = 0  # opens that met EMFILE/ENFILE (each retried once after freeing idle files)
        self._lru: OrderedDict[int, FdUser] = OrderedDict()

    def open(self, path: os.PathLike[str] | str, flags: int, owner: FdUser, mode: int = 0o644) -> int:
        """``os.open`` on behalf of ``owner``, counted; frees idle descriptors once on EMFILE/ENFILE."""
        try:
            fd = os.open(path, flags, mode)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            before = self.open_count
            self.trim(keep=owner, target=0)
            self.exhausted += 1
            if self.exhausted == 1 or self.exhausted % 1000 == 0:  # counted always, logged sparingly
                log.warning("the process ran out of file descriptors; closed idle segment files and retried",
                            extra={"path": str(path), "closed": before - self.open_count,
                                   "times": self.exhausted, "bound": self.limit})
            fd = os.open(path, flags, mode)
        self.open_count += 1
        self._lru[id(owner)] = owner
        self._lru.move_to_end(id(owner))
        if self.limit is not None and self.open_count > self.limit:
            self.trim(keep=owner, target=self.limit)
        return fd

    def closed(self, owner: FdUser, count: int) -> None:
        """``owner`` closed ``count`` descriptors (called by the segment itself)."""
        self.open_count -= count
        if owner.open_fds == 0:
            self._lru.pop(id(owner), None)

    def touch(self, owner: FdUser) -> None:
        if id(owner) in self._lru:
            self._lru.move_to_end(id(owner))

    def trim(self, *, keep: FdUser | None = None, target: int | None = None) -> None:
        """Close least recently used segments until at most ``target`` (default: the limit) are open."""
        bound = self.limit if target is None else target
        if bound is None or self.open_count <= bound:
            return  # the common case (after every fsync round): no copy of the LRU
        for key in list(self._lru):
            if self.open_count <= bound:
                break
            owner = self._lru.get(key)
            if owner is None or owner is keep or owner.syncing:
                continue
            owner.close()  # calls closed(), which drops it from the LRU
            self.evictions += 1
