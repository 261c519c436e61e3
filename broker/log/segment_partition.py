"""One partition of the segment store: a directory of segments, with its writes, fsyncs, reads and retention.

Rules:
- Files appear with the first write (``_materialize``): a created topic costs no directory and no
  descriptor until it is used, so creating thousands of partitions cannot fail half-way on disk.
- Directory entries are fsynced before anything that depends on them is acknowledged: a new
  partition's first sync round fsyncs its directory (the first segment's files) and the data
  directory (the partition directory itself); a roll or a retention delete marks the directory
  dirty for the next round. The fsyncs run in a worker thread (flusher.py has the policies).
- Descriptors come from the store's ``FdCache`` and may be closed between uses; every use reopens
  through the segment (``open_log``, ``index_writer``, ``time_writer``). A sync round pins the
  segments it syncs (``syncing``) so their descriptors stay open until the worker is done.
- The high watermark: with ``flush=always`` and ``visibility=durable`` it is the offset at the
  last completed sync round (the recovery point), and reads stop at the byte position that round
  covered; otherwise it is the log end. Readers are woken when it moves.
- The log start offset is the first segment's base, or higher after DeleteRecords: that offset is
  written to ``log-start-offset`` in the directory (atomic write, fsynced) before it is answered, and
  read back on start (capped at the log end, in case a crash lost the tail it pointed into).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.errors import StorageError
from broker.log.config import FlushPolicy, TopicConfig, Visibility
from broker.log.fdcache import FdCache
from broker.log.files import UNSUPPORTED_ERRNOS, atomic_write, read_json, reserve_blocks, write_all, write_all_parts
from broker.log.flusher import Flusher
from broker.log.indexcache import UNBOUNDED_INDEXES, IndexCache
from broker.log.partition_log import BatchParts, PartitionLog
from broker.log.recovery import RecoveryPoint
from broker.log.segment_file import MAX_RELATIVE_OFFSET, MAX_SEGMENT_BYTES, UNBOUNDED_FDS, Segment
from broker.protocol.records import BatchHeader

__all__ = ["LOG_START_FILE", "SegmentPartitionLog"]

LOG_START_FILE = "log-start-offset"

log = logging.getLogger("broker.log.segment")


class SegmentPartitionLog(PartitionLog):
    """One partition directory. Construct through ``SegmentLogStore`` (it recovers and owns the threads)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        config: TopicConfig,
        directory: Path,
        segments: list[Segment],
        point: RecoveryPoint,
        *,
        executor: ThreadPoolExecutor,
        clock: Callable[[], float],
        fds: FdCache = UNBOUNDED_FDS,
        indexes: IndexCache = UNBOUNDED_INDEXES,
        materialized: bool = True,
        visibility: Visibility = Visibility.DURABLE,
        preallocate_bytes: int = 0,
    ) -> None:
        super().__init__(topic, partition, config)
        self.directory = directory
        self.visibility = visibility
        # Disk blocks reserved ahead of the active segment's end, this many at a time (0: none); see _reserve.
        self._preallocate_bytes = preallocate_bytes
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._size = sum(s.size for s in segments)
        self._executor = executor
        self._clock = clock
        self._fds = fds
        self._indexes = indexes
        for seg in segments:
            seg.indexes = indexes
            indexes.hold(seg)  # closed segments recovery indexed
        self._materialized = materialized
        self._dir_dirty = False  # entries of this directory changed since the last sync
        self._parent_dirty = False  # this directory's own entry in the data directory is new
        self._failed: StorageError | None = None
        self._write_failing = False  # a write failed and none has fully succeeded since (logged once)
        self._closed = False
        self.recovery_point = point
        self.flusher = Flusher(config.flush, config.flush_interval_ms, self._sync, self._sync_failed)
        self._deleted_before = self._load_log_start() if materialized else 0  # DeleteRecords' offset

    # -- properties ----------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return max(self._segments[0].base_offset, self._deleted_before)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].end_offset

    @property
    def durable_only(self) -> bool:
        """Readers see only fsynced records (``flush=always`` with ``visibility=durable``)."""
        return self.visibility is Visibility.DURABLE and self.config.flush is FlushPolicy.ALWAYS

    @property
    def high_watermark(self) -> int:
        if self.durable_only:
            return max(min(self.recovery_point.offset, self.log_end_offset), self.log_start_offset)
        return self.log_end_offset

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- writing -------------------------------------------------------------------------

    def _materialize(self) -> None:
        """Create the directory and first segment of a partition that has never been written."""
        try:
            if self.directory.exists():
                log.warning("removing leftover data of a topic that no longer exists",
                            extra={"path": str(self.directory)})
                shutil.rmtree(self.directory)
            self.directory.mkdir()
        except OSError as exc:
            raise StorageError(f"cannot create partition directory {self.directory}: {exc.strerror}") from exc
        try:
            self._active.create_files()
        except StorageError:
            shutil.rmtree(self.directory, ignore_errors=True)  # ours and empty: the next write starts over
            raise
        self._materialized = True
        self._dir_dirty = self._parent_dirty = True

    def _write(self, batches: Sequence[tuple[BatchParts, BatchHeader]]) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise StorageError(f"partition {self.topic}-{self.partition} is closed")
        if not self._materialized:
            try:
                self._materialize()
            except StorageError as exc:
                self._log_write_failure(str(exc))
                raise
        now = self._now_ms()
        whole = True  # every byte and index entry written: ends a run of failures
        for parts, header in batches:
            size = sum(map(len, parts))
            if self._should_roll(size, header, now):
                try:
                    self._roll(now)
                except StorageError as exc:
                    self._log_write_failure(str(exc))
                    raise
            seg = self._active
            position = seg.size
            assert seg.index is not None
            if self._preallocate_bytes and position + size > seg.reserved_end:
                self._reserve(seg, size)
            try:
                write_all_parts(seg.open_log(), parts)
            except (OSError, StorageError) as exc:
                self._undo_partial_write(seg, position)
                reason = exc.strerror if isinstance(exc, OSError) else str(exc)
                error = StorageError(f"cannot append to {seg.log_path}: {reason}; the batch was not stored")
                self._log_write_failure(str(error))
                raise error from exc
            seg.size += size
            self._size += size
            seg.end_offset = header.last_offset + 1
            seg.last_write_ms = now
            seg.dirty_log = True
            index_bytes, time_bytes = seg.index.on_batch(
                position, header.base_offset - seg.base_offset, header.last_offset - seg.base_offset,
                header.max_timestamp, size,
            )
            try:
                if index_bytes:
                    write_all(seg.index_writer(), index_bytes)
                if time_bytes:
                    write_all(seg.time_writer(), time_bytes)
            except (OSError, StorageError) as exc:  # the batch is stored; a short index is repaired on restart
                whole = False
                reason = exc.strerror if isinstance(exc, OSError) else str(exc)
                self._log_write_failure(f"cannot write an index entry of {seg.log_path}: {reason}")
        self.flusher.note_write()
        if whole and self._write_failing:
            self._write_failing = False
            log.info(f"partition {self.topic}-{self.partition} is writable again")

    def _log_write_failure(self, reason: str) -> None:
        """Log a failed write once per run of failures: a full disk fails every append until space is
        freed, and each one is answered (and counted) by the front door that asked."""
        if self._write_failing:
            return
        self._write_failing = True
        sticky = f"; {self._failed}" if self._failed is not None else ""
        log.error(f"write failed for partition {self.topic}-{self.partition}: {reason}{sticky}; "
                  "further failures are not logged until a write succeeds")

    def _reserve(self, seg: Segment, incoming: int) -> None:
        """Reserve disk blocks for the next ``preallocate_bytes`` (at least ``incoming``) of the active
        segment without changing its size (``files.reserve_blocks``): appends into them skip ext4's
        delayed allocation per page. Readers and recovery go by the file size, so they see nothing of it;
        what is left unused goes back when the segment rolls or the partition closes (``_release``).
        Where the file system cannot, preallocation stops for this partition; no space now is left to
        the write itself to report."""
        length = max(self._preallocate_bytes, incoming)
        try:
            error = reserve_blocks(seg.open_log(), seg.size, length)
        except StorageError:
            return  # the write reopens the file and reports
        if error == 0:
            seg.reserved_end = seg.size + length
        elif error in UNSUPPORTED_ERRNOS:
            self._preallocate_bytes = 0
            log.info(f"partition {self.topic}-{self.partition}: the file system cannot reserve blocks "
                     f"({os.strerror(error)}); segment preallocation is off for it")

    def _release(self, seg: Segment) -> None:
        """Give back the blocks reserved past ``seg``'s end (also those a crash left behind, which no
        one recorded): ``ftruncate`` to its own size."""
        if not self._preallocate_bytes or not self._materialized:
            return
        try:
            os.ftruncate(seg.open_log(), seg.size)
        except (OSError, StorageError) as exc:
            log.warning(f"cannot release the space reserved after {seg.log_path}: {exc}")
        seg.reserved_end = 0

    def _undo_partial_write(self, seg: Segment, position: int) -> None:
        """Cut off whatever part of a failed write reached the file, so the log stays whole batches."""
        seg.reserved_end = 0  # whatever was reserved after ``position`` goes with the cut
        try:
            os.ftruncate(seg.open_log(), position)
        except (OSError, StorageError) as exc:
            self._failed = StorageError(
                f"{seg.log_path} has a partial batch that cannot be removed ({exc}); "
                "restart to recover the partition"
            )

    def _should_roll(self, incoming: int, header: BatchHeader, now: int) -> bool:
        seg = self._active
        if seg.size == 0:
            return False
        return (
            seg.size + incoming > min(self.config.segment_bytes, MAX_SEGMENT_BYTES)
            or now - seg.created_ms >= self.config.max_segment_ms
            or header.last_offset - seg.base_offset > MAX_RELATIVE_OFFSET
        )

    def _roll(self, now: int) -> None:
        """Close the active segment and start a new one at the log end."""
        old = self._active
        assert old.index is not None
        tail = old.index.finalize()
        self._release(old)
        if tail:
            write_all(old.time_writer(), tail)
        old.dirty_index = True
        new = Segment.create(self.directory, old.end_offset, now, self.config.index_interval_bytes, self._fds)
        new.indexes = self._indexes
        old.active = False
        self._indexes.hold(old)  # closed now: its index may be dropped (its files hold every entry)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._dir_dirty = True  # the new segment's files: fsynced with the next round
        self.flusher.note_write()
        self.flusher.kick()  # like Kafka: a rolled segment is flushed in the background whatever the policy
        log.debug("rolled segment", extra={"partition": f"{self.topic}-{self.partition}", "base": new.base_offset})

    def write_mark(self) -> int:
        return self.flusher.written

    async def _make_durable(self, mark: int | None) -> None:
        if self.config.flush is FlushPolicy.ALWAYS:
            await self.flusher.wait_durable(mark)

    def is_durable(self, mark: int) -> bool:
        return self.config.flush is not FlushPolicy.ALWAYS or self.flusher.durable >= mark

    async def _sync(self) -> None:
        """One fsync round: every segment file and directory with unsynced changes, in a worker thread."""
        if self._failed is not None:
            raise self._failed  # a retried fsync may "succeed" after the kernel dropped the pages
        held: list[Segment] = []
        files: list[int] = []
        try:
            for seg in self._segments:
                if not (seg.dirty_log or seg.dirty_index):
                    continue
                seg.syncing += 1  # pinned first: opening the next file may trim the cache
                held.append(seg)
                if seg.dirty_log:
                    files.append(seg.open_log())
                if seg.dirty_index:
                    files += [seg.index_writer(), seg.time_writer()]
        except StorageError:
            for seg in held:
                seg.syncing -= 1
            raise
        dirs: list[Path] = []
        if self._dir_dirty:
            dirs.append(self.directory)
        if self._parent_dirty:
            dirs.append(self.directory.parent)
        self._dir_dirty = self._parent_dirty = False
        for seg in held:
            seg.dirty_log = seg.dirty_index = False
        active = self._active
        assert active.index is not None
        point = RecoveryPoint(active.base_offset, active.size, active.end_offset,
                              active.index.max_timestamp, active.created_ms)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, _fsync_all, files, dirs)
        except OSError as exc:
            raise StorageError(
                f"fsync failed in {self.directory} ({exc.strerror or exc}); the data may not be on disk"
            ) from exc
        finally:
            for seg in held:
                seg.syncing -= 1
        moved = point.offset > self.recovery_point.offset
        self.recovery_point = point
        for seg in held:
            if seg is not self._active and not seg.busy:
                seg.close_index_writers()
        self._fds.trim()
        if moved and self.durable_only:
            self._wake_readers()

    def _sync_failed(self, exc: BaseException) -> None:
        message = f"fsync failed for partition {self.topic}-{self.partition} ({exc}); it refuses writes until restart"
        if self._failed is None:
            log.error(message)
            self._failed = StorageError(message)

    async def reconfigure(self, config: TopicConfig) -> None:
        await super().reconfigure(config)
        self.flusher.policy = config.flush
        self.flusher.interval_s = max(config.flush_interval_ms, 0) / 1000
        self._wake_readers()  # leaving durable-only visibility moves the high watermark to the log end

    async def flush(self) -> None:
        await self.flusher.wait_durable()
        if self._failed is not None:
            raise self._failed

    async def close(self) -> None:
        """Sync and close; raises if the partition failed (the caller must not mark a clean shutdown)."""
        if self._closed:
            return
        try:
            await self.flusher.close()
            if self._failed is not None:
                raise self._failed
            self._release(self._active)
        finally:
            self.abandon()

    def abandon(self) -> None:
        self._closed = True
        for seg in self._segments:
            seg.close()
            self._indexes.release(seg)

    # -- reading -------------------------------------------------------------------------

    def _visible_end(self, seg: Segment) -> int:
        """Bytes of ``seg`` that readers may see (everything, unless only durable records are shown)."""
        if not self.durable_only:
            return seg.size
        point = self.recovery_point
        if seg.base_offset < point.segment:
            return seg.size
        if seg.base_offset == point.segment:
            return min(point.position, seg.size)
        return 0

    def read(self, offset: int, max_bytes: int) -> bytes:
        self._check_range(offset)
        if offset >= self.high_watermark:
            return b""
        i = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[i]
        position = seg.locate(offset, self.config.index_interval_bytes)
        out = bytearray()
        while True:
            end = self._visible_end(seg)
            chunk = seg.read_batches(position, max_bytes - len(out), at_least_one=not out, end=end)
            out += chunk
            if len(out) >= max_bytes or position + len(chunk) < end or i + 1 >= len(self._segments):
                break
            i += 1
            seg, position = self._segments[i], 0
        return bytes(out)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        interval = self.config.index_interval_bytes
        for seg in self._segments:
            index = seg.load_index(interval)
            if index.max_timestamp < timestamp_ms:
                continue
            rel = index.time_scan_start(timestamp_ms)
            _, position = index.position_for(rel)
            for _, header in seg.iter_headers(position):
                if header.max_timestamp >= timestamp_ms and header.last_offset >= self.log_start_offset:
                    found = max(header.base_offset, self.log_start_offset)
                    return found if found < self.high_watermark else None
        return None

    def tail_headers(self, max_bytes: int) -> list[BatchHeader]:
        parts: list[list[BatchHeader]] = []
        need = max_bytes
        for seg in reversed(self._segments):  # newest first, only as far back as needed
            parts.append(seg.tail_headers(need, self.config.index_interval_bytes))
            need -= seg.size
            if need <= 0:
                break
        return [header for part in reversed(parts) for header in part]

    # -- retention -----------------------------------------------------------------------

    def enforce_retention(self, now_ms: int) -> int:
        removed = 0
        if not self.config.delete:
            return 0  # cleanup.policy=compact: the cleaner keeps it small, never time or size
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        while len(self._segments) > 1:
            seg = self._segments[0]
            if seg.busy:
                break  # not yet fsynced after its roll; next round
            too_old = retention_ms >= 0 and now_ms - seg.last_write_ms > retention_ms
            too_big = retention_bytes >= 0 and self._size - seg.size >= retention_bytes
            if not (too_old or too_big):
                break
            seg.delete()
            del self._segments[0], self._bases[0]
            self._size -= seg.size
            removed += seg.size
            self._dir_dirty = True
        if removed:
            self.flusher.note_write()
            log.info("retention removed segments", extra={
                "partition": f"{self.topic}-{self.partition}", "bytes": removed,
                "log_start_offset": self.log_start_offset})
        return removed

    # -- DeleteRecords ------------------------------------------------------------------------

    def _load_log_start(self) -> int:
        doc = read_json(self.directory / LOG_START_FILE)
        if doc is None:
            return 0
        try:
            assert isinstance(doc, dict)
            stored = int(doc["log_start_offset"])
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{self.directory / LOG_START_FILE} holds no log_start_offset ({exc!r})") from exc
        if stored > self.log_end_offset:
            log.warning("deleted-records offset lies past the recovered log end; the log starts at its end",
                        extra={"partition": f"{self.topic}-{self.partition}", "log_start_offset": stored,
                               "log_end_offset": self.log_end_offset})
        return min(stored, self.log_end_offset)

    async def _advance_log_start(self, offset: int) -> None:
        doc = json.dumps({"log_start_offset": offset}).encode()
        await asyncio.get_running_loop().run_in_executor(
            self._executor, atomic_write, self.directory / LOG_START_FILE, doc)
        self._deleted_before = max(self._deleted_before, offset)
        removed = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= self.log_start_offset:
            seg = self._segments[0]
            if seg.busy:
                break  # an fsync of it is in flight; retention removes it later
            seg.delete()
            del self._segments[0], self._bases[0]
            self._size -= seg.size
            removed += seg.size
            self._dir_dirty = True
        if removed:
            self.flusher.note_write()
        log.info("records deleted", extra={"partition": f"{self.topic}-{self.partition}",
                                           "log_start_offset": self.log_start_offset, "bytes_removed": removed})

    # -- compaction hooks (broker/log/cleaner.py) ---------------------------------------------

    def cleanable_segments(self) -> list[Segment]:
        """Closed segments, oldest first, up to the first one with an fsync pending (never the active one)."""
        out: list[Segment] = []
        for seg in self._segments[:-1]:
            if seg.busy:
                break
            out.append(seg)
        return out

    def can_replace(self, old: Segment) -> bool:
        """``old`` is still a closed segment of this open partition with no fsync in flight."""
        return (not self._closed and self._failed is None and not old.busy
                and any(seg is old for seg in self._segments[:-1]))

    def replace_segment(self, old: Segment, new: Segment) -> None:
        """Put ``new`` (same base offset; its files already renamed over ``old``'s) in ``old``'s place.
        Reads are synchronous, so none is half on each; ``old``'s descriptors (of the replaced files) close."""
        i = next(j for j, seg in enumerate(self._segments) if seg is old)
        new.fds = self._fds  # its descriptors count against the store's bound like every other segment's
        new.indexes = self._indexes
        self._indexes.release(old)
        self._indexes.hold(new)
        self._segments[i] = new
        self._size += new.size - old.size
        old.close()


def _fsync_all(files: list[int], dirs: list[Path]) -> None:
    """Runs in a worker thread. fdatasync is enough for files (size changes are included); directories
    are opened here, fsynced and closed (they change rarely: a new partition, a roll, a retention delete)."""
    for fd in files:
        os.fdatasync(fd)
    for path in dirs:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
