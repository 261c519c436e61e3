"""A bound on the memory closed segments' indexes hold, shared by every partition of a store.

Why: a segment's sparse index costs about 20 bytes per ``index.interval.bytes`` (4 KiB) of log. Kept
for every segment ever read, memory followed the size of the retained log (0.5 % of it: 500 MB for
100 GB), and a consumer reading a topic from the start loaded every index once and kept it. Kafka
maps its index files and lets the page cache decide; here closed segments load theirs on use and
register them here, and once their total passes ``limit`` bytes the least recently used ones are
dropped (the next use reads the files again: a few hundred KiB per 64 MiB segment).

Rules:
- Only closed segments are held. The active segment's index is built in memory as batches arrive
  and carries state (bytes since the last entry, running max timestamp) that its files do not, so
  it is never dropped; it joins the cache when the segment rolls.
- A segment is *touched* on every lookup; it moves to the recent end.
- Dropping never touches files: the index files of a closed segment hold every entry (written as
  the entries were made), and a short or damaged file is rebuilt from the log on the next load.
- A deleted or replaced segment is released, so the cache never keeps a removed segment alive.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from broker.log.index import SegmentIndex

__all__ = ["DEFAULT_INDEX_CACHE_BYTES", "UNBOUNDED_INDEXES", "IndexCache", "IndexHolder"]

DEFAULT_INDEX_CACHE_BYTES = 16 * 1024 * 1024  # the indexes of ~3 GiB of hot log at the default interval


class IndexHolder(Protocol):
    """What the cache needs of a segment."""

    index: SegmentIndex | None
    active: bool


class IndexCache:
    """LRU of closed segments holding their index in memory; ``limit=None`` holds nothing (no bound)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.held_bytes = 0
        self.evictions = 0  # indexes dropped to stay under the bound
        self._lru: OrderedDict[int, tuple[IndexHolder, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def hold(self, segment: IndexHolder) -> None:
        """``segment`` (closed, its index loaded) was just used: count it if new, mark it recent."""
        if self.limit is None:
            return
        key = id(segment)
        entry = self._lru.get(key)
        if entry is not None:
            self._lru.move_to_end(key)
            return
        if segment.active or segment.index is None:
            return
        size = segment.index.nbytes
        self._lru[key] = (segment, size)
        self.held_bytes += size
        if self.limit is not None and self.held_bytes > self.limit:
            self._trim(keep=key)

    def release(self, segment: IndexHolder) -> None:
        """``segment`` was deleted or replaced: forget it (its index goes with it)."""
        entry = self._lru.pop(id(segment), None)
        if entry is not None:
            self.held_bytes -= entry[1]

    def _trim(self, *, keep: int) -> None:
        assert self.limit is not None
        for key in list(self._lru):
            if self.held_bytes <= self.limit:
                break
            if key == keep:
                continue
            segment, size = self._lru.pop(key)
            self.held_bytes -= size
            segment.index = None
            self.evictions += 1


UNBOUNDED_INDEXES = IndexCache(None)  # for segments opened outside a store (tools, tests): never dropped
