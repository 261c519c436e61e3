"""One segment on disk: ``<base>.log`` with its ``.index`` and ``.timeindex``, and their file descriptors.

A segment is *active* (the partition appends to it) or *closed* (read-only; its index is loaded
lazily on the first read and rebuilt from the log when missing or inconsistent, so a lost or damaged
index never loses data). Descriptors are opened on use and counted by the store's ``FdCache``, which
may close them again at any time the segment has no fsync in flight: every use goes through
``open_log`` / ``index_writer`` / ``time_writer``, never a stored descriptor. Reads use ``os.pread``
in the event loop: page-cache reads are microseconds, a thread hop would cost more.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from broker.errors import InvalidRecordError, StorageError
from broker.log.fdcache import FdCache
from broker.log.files import atomic_write, write_all
from broker.log.index import SegmentIndex
from broker.log.indexcache import UNBOUNDED_INDEXES, IndexCache
from broker.protocol.records import BATCH_HEADER_SIZE, BatchHeader, decode_header, split_complete_batches

__all__ = ["MAX_SEGMENT_BYTES", "UNBOUNDED_FDS", "Segment", "segment_name"]

log = logging.getLogger("broker.log.segment")

# Index positions and relative offsets are u32; stay well inside them.
MAX_SEGMENT_BYTES = 2**31 - 1
MAX_RELATIVE_OFFSET = 2**31 - 1
_HEADER_CHUNK = 16 * 1024
UNBOUNDED_FDS = FdCache(None)  # for segments opened outside a store (tools, tests): counted, never trimmed


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    """File triple of one segment plus what the partition tracks about it."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        size: int,
        end_offset: int,
        last_write_ms: int,
        created_ms: int,
        index: SegmentIndex | None = None,
        fds: FdCache = UNBOUNDED_FDS,
    ) -> None:
        self.directory = directory
        self.fds = fds
        self.base_offset = base_offset
        self.size = size
        self.end_offset = end_offset  # offset after the last stored record
        self.last_write_ms = last_write_ms
        self.created_ms = created_ms
        self.index = index
        self.fd: int | None = None  # log file (O_APPEND: the active segment writes through it)
        self.index_fd: int | None = None  # index files, appended to while the segment is active
        self.time_fd: int | None = None
        self.dirty_log = False  # written since the last fsync
        self.dirty_index = False  # index files written and not yet fsynced (after a roll)
        self.syncing = 0  # fsyncs in flight using this segment's descriptors
        self.reserved_end = 0  # disk blocks reserved up to here, past ``size`` (storage.preallocate_bytes)
        self.active = False  # the partition appends here; its index lives in memory, built by us
        self.indexes: IndexCache = UNBOUNDED_INDEXES  # bounds closed segments' loaded indexes (set by the partition)

    # -- paths ---------------------------------------------------------------------------

    @property
    def stem(self) -> Path:
        return self.directory / segment_name(self.base_offset)

    @property
    def log_path(self) -> Path:
        return self.stem.with_suffix(".log")

    @property
    def index_path(self) -> Path:
        return self.stem.with_suffix(".index")

    @property
    def time_path(self) -> Path:
        return self.stem.with_suffix(".timeindex")

    @property
    def open_fds(self) -> int:
        return (self.fd is not None) + (self.index_fd is not None) + (self.time_fd is not None)

    @property
    def busy(self) -> bool:
        """Descriptors that must not be closed yet: unsynced data or an fsync in flight."""
        return self.dirty_log or self.dirty_index or self.syncing > 0

    # -- opening and closing ----------------------------------------------------------------

    @classmethod
    def planned(cls, directory: Path, base_offset: int, now_ms: int, interval: int,
                fds: FdCache = UNBOUNDED_FDS) -> Segment:
        """A new, empty active segment whose files do not exist yet (``create_files`` makes them)."""
        seg = cls(directory, base_offset, size=0, end_offset=base_offset, last_write_ms=now_ms,
                  created_ms=now_ms, index=SegmentIndex(interval), fds=fds)
        seg.active = True
        return seg

    @classmethod
    def create(cls, directory: Path, base_offset: int, now_ms: int, interval: int,
               fds: FdCache = UNBOUNDED_FDS) -> Segment:
        """A new, empty active segment (its files created now)."""
        seg = cls.planned(directory, base_offset, now_ms, interval, fds)
        seg.create_files()
        return seg

    def create_files(self) -> None:
        """Create the empty log and index files of a planned segment (the caller fsyncs the directory)."""
        try:
            fd = self._open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            self.fd = fd
            if os.fstat(fd).st_size:
                raise StorageError(f"cannot create segment {self.log_path}: a non-empty file is already there")
        except OSError as exc:
            self.close()
            raise StorageError(f"cannot create segment {self.log_path}: {exc.strerror}") from exc
        self.open_index_writers(b"", b"")

    def _open(self, path: Path, flags: int) -> int:
        return self.fds.open(path, flags, self)

    def open_log(self) -> int:
        if self.fd is None:
            try:
                self.fd = self._open(self.log_path, os.O_RDWR | os.O_APPEND)
            except OSError as exc:
                raise StorageError(f"cannot open segment {self.log_path}: {exc.strerror}") from exc
        else:
            self.fds.touch(self)
        return self.fd

    def index_writer(self) -> int:
        """The offset index, open for appending (reopened after the cache closed it)."""
        if self.index_fd is None:
            self.index_fd = self._open_for_append(self.index_path)
        return self.index_fd

    def time_writer(self) -> int:
        """The time index, open for appending (reopened after the cache closed it)."""
        if self.time_fd is None:
            self.time_fd = self._open_for_append(self.time_path)
        return self.time_fd

    def _open_for_append(self, path: Path) -> int:
        try:
            return self._open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise StorageError(f"cannot open index file {path}: {exc.strerror}") from exc

    def open_index_writers(self, index: bytes, times: bytes) -> None:
        """(Re)write both index files with the given content, leaving them open for appending."""
        try:
            for path, data, attr in ((self.index_path, index, "index_fd"), (self.time_path, times, "time_fd")):
                old = getattr(self, attr)
                if old is not None:
                    setattr(self, attr, None)
                    os.close(old)
                    self.fds.closed(self, 1)
                fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
                setattr(self, attr, fd)
                write_all(fd, data)
        except OSError as exc:
            raise StorageError(f"cannot write index files of {self.log_path}: {exc.strerror}") from exc

    def close_index_writers(self) -> None:
        for attr in ("index_fd", "time_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                setattr(self, attr, None)
                os.close(fd)
                self.fds.closed(self, 1)

    def close_log(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
            self.fds.closed(self, 1)

    def close(self) -> None:
        self.close_log()
        self.close_index_writers()

    def delete(self) -> None:
        self.close()
        self.indexes.release(self)
        for path in (self.log_path, self.index_path, self.time_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot delete {path}: {exc.strerror}") from exc

    # -- reading ---------------------------------------------------------------------------

    def pread(self, length: int, position: int) -> bytes:
        return os.pread(self.open_log(), length, position)

    def iter_headers(self, position: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, header)`` of each batch from ``position`` (a batch boundary) to ``end``.

        Headers only (no CRC): used on bytes that recovery has already checked.
        """
        end = self.size if end is None else end
        while position < end:
            buf = self.pread(min(_HEADER_CHUNK, end - position), position)
            pos = 0
            while len(buf) - pos >= BATCH_HEADER_SIZE:
                header = decode_header(buf, pos)
                yield position + pos, header
                pos += header.size
            if pos == 0:  # fewer than a header's bytes left: a tail that is not a batch
                raise InvalidRecordError(f"{self.log_path}: partial batch header at position {position}")
            position += pos

    def tail_headers(self, max_bytes: int, interval: int) -> list[BatchHeader]:
        """Headers of this segment's batches from (at or before) ``max_bytes`` before its end: the scan
        starts at the last index entry at or before that point, so it covers at least ``max_bytes``."""
        start = 0
        if self.size > max_bytes:
            index = self.load_index(interval)
            i = bisect.bisect_right(index.positions, self.size - max_bytes) - 1
            start = index.positions[i] if i >= 0 else 0
        return [header for _, header in self.iter_headers(start)]

    def read_batches(self, position: int, max_bytes: int, *, at_least_one: bool, end: int | None = None) -> bytes:
        """Whole batches from ``position`` up to ``max_bytes`` (or one whole batch if ``at_least_one``),
        none past byte ``end`` (a batch boundary; default: the segment's size)."""
        end = self.size if end is None else min(end, self.size)
        if position >= end:
            return b""
        want = min(max(max_bytes, BATCH_HEADER_SIZE), end - position)
        buf = self.pread(want, position)
        _, complete = split_complete_batches(buf)
        if complete:
            return buf[:complete] if complete < len(buf) else buf
        if not at_least_one:
            return b""
        header = decode_header(buf if len(buf) >= BATCH_HEADER_SIZE else self.pread(BATCH_HEADER_SIZE, position))
        return self.pread(header.size, position)

    # -- index -----------------------------------------------------------------------------

    def load_index(self, interval: int) -> SegmentIndex:
        """The index of a closed segment: read from its files, or rebuilt from the log if they are bad."""
        if self.index is not None:
            self.indexes.hold(self)
            return self.index
        index: SegmentIndex | None = None
        try:
            raw_index = self.index_path.read_bytes()
            raw_times = self.time_path.read_bytes()
        except FileNotFoundError:
            reason = "missing"
        else:
            index = SegmentIndex.from_bytes(
                interval, raw_index, raw_times, size=self.size, rel_limit=self.end_offset - self.base_offset
            )
            reason = "inconsistent"
            if index is not None and not self.entry_matches(index):
                index = None
        if index is None:
            index = self.rebuild_index(interval, reason)
        self.index = index
        self.indexes.hold(self)
        return index

    def entry_matches(self, index: SegmentIndex) -> bool:
        """Cheap check of the last offset entry: the batch it points at has the offset it claims."""
        if not index.rel_offsets:
            return True
        try:
            header = decode_header(self.pread(BATCH_HEADER_SIZE, index.positions[-1]))
        except InvalidRecordError:
            return False
        return header.base_offset == self.base_offset + index.rel_offsets[-1]

    def rebuild_index(self, interval: int, reason: str) -> SegmentIndex:
        """Index a closed segment from its log and write both files atomically."""
        index = SegmentIndex(interval)
        try:
            for pos, header in self.iter_headers(0):
                index.on_batch(pos, header.base_offset - self.base_offset,
                               header.last_offset - self.base_offset, header.max_timestamp, header.size)
        except InvalidRecordError as exc:
            log.error("segment has unreadable batches; index covers the readable prefix",
                      extra={"segment": str(self.log_path), "error": str(exc)})
        index.finalize()
        index.next_rel = self.end_offset - self.base_offset
        raw_index, raw_times = index.to_bytes()
        atomic_write(self.index_path, raw_index)
        atomic_write(self.time_path, raw_times)
        log.warning("rebuilt %s index files of a segment", reason,
                    extra={"segment": str(self.log_path), "entries": len(index.rel_offsets)})
        return index

    def locate(self, offset: int, interval: int, *, retry: bool = True) -> int:
        """File position of the batch holding ``offset`` (which must lie in this segment)."""
        index = self.load_index(interval)
        rel, position = index.position_for(offset - self.base_offset)
        for pos, header in self.iter_headers(position):
            if pos == position and header.base_offset != self.base_offset + rel:
                # The entry does not point at the batch it names. A closed segment's files came from
                # disk: rebuild them and search again. The active index is built in memory by us.
                if self.active or not retry:
                    return self._locate_by_scan(offset)
                self.indexes.release(self)
                self.index = self.rebuild_index(interval, "inconsistent")
                self.indexes.hold(self)
                return self.locate(offset, interval, retry=False)
            if header.last_offset >= offset:
                return pos
        return self.size

    def _locate_by_scan(self, offset: int) -> int:
        for pos, header in self.iter_headers(0):
            if header.last_offset >= offset:
                return pos
        return self.size
