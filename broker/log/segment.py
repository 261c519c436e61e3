"""The durable LogStore: each partition is a directory of segment files.

Layout of a data directory (``root``)::

    topics.json                    topic metadata (written atomically: tmp + fsync + rename)
    recovery-checkpoint.json       per-partition recovery points (see recovery.py)
    .clean-shutdown                present only between a clean close and the next start
    .lock                          flock held while a store has the directory open
    <topic>-<partition>/
        <20-digit base offset>.log        RecordBatch v2 bytes exactly as served to consumers
        <20-digit base offset>.index      sparse offset -> file position (see index.py)
        <20-digit base offset>.timeindex  sparse max timestamp -> offset

Writes happen synchronously in the event loop (``os.write`` to the page cache takes microseconds
and keeps offset assignment and byte order trivially consistent); fsyncs run in a worker thread and
are shared between concurrent appends (flusher.py). Reads use ``pread`` in the event loop.

Retention drops whole closed segments, oldest first, never the active one: by age (time of the
segment's last append, i.e. the file's mtime: device data often carries event times far in the
past, so record timestamps would delete fresh data at once) and by size (a segment goes when the
partition stays at or above ``retention_bytes`` without it, as Kafka does).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.errors import StorageError
from broker.log.api import LogStore, PartitionLog, TopicInfo
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.files import DirLock, atomic_write, fsync_dir, read_json, write_all
from broker.log.flusher import Flusher
from broker.log.recovery import (
    CLEAN_MARKER,
    RecoveryPoint,
    load_checkpoint,
    recover_partition,
    write_checkpoint,
)
from broker.log.segment_file import MAX_RELATIVE_OFFSET, MAX_SEGMENT_BYTES, Segment
from broker.protocol.records import BatchHeader

__all__ = ["SegmentLogStore", "SegmentPartitionLog"]

log = logging.getLogger("broker.log.segment")

TOPICS_FILE = "topics.json"
_OPEN_CLOSED_SEGMENTS = 16  # read descriptors kept open per partition for closed segments


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
    ) -> None:
        super().__init__(topic, partition, config)
        self.directory = directory
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._size = sum(s.size for s in segments)
        self._executor = executor
        self._clock = clock
        self._dir_dirty = False
        self._dir_fd: int | None = None
        self._failed: StorageError | None = None
        self._write_failing = False  # a write failed and none has fully succeeded since (logged once)
        self._closed = False
        self._open_closed: OrderedDict[int, Segment] = OrderedDict()
        self.recovery_point = point
        self.flusher = Flusher(config.flush, config.flush_interval_ms, self._sync, self._sync_failed)

    # -- properties ----------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def high_watermark(self) -> int:
        return self._segments[-1].end_offset

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

    def _write(self, batches: Sequence[tuple[bytearray, BatchHeader]]) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise StorageError(f"partition {self.topic}-{self.partition} is closed")
        now = self._now_ms()
        whole = True  # every byte and index entry written: ends a run of failures
        for data, header in batches:
            if self._should_roll(len(data), header, now):
                try:
                    self._roll(now)
                except StorageError as exc:
                    self._log_write_failure(str(exc))
                    raise
            seg = self._active
            position = seg.size
            assert seg.fd is not None and seg.index is not None and seg.index_fd is not None
            try:
                write_all(seg.fd, data)
            except OSError as exc:
                self._undo_partial_write(seg, position)
                error = StorageError(f"cannot append to {seg.log_path}: {exc.strerror}; the batch was not stored")
                self._log_write_failure(str(error))
                raise error from exc
            seg.size += len(data)
            self._size += len(data)
            seg.end_offset = header.last_offset + 1
            seg.last_write_ms = now
            seg.dirty_log = True
            index_bytes, time_bytes = seg.index.on_batch(
                position, header.base_offset - seg.base_offset, header.last_offset - seg.base_offset,
                header.max_timestamp, len(data),
            )
            try:
                if index_bytes:
                    write_all(seg.index_fd, index_bytes)
                if time_bytes:
                    assert seg.time_fd is not None
                    write_all(seg.time_fd, time_bytes)
            except OSError as exc:  # the batch is stored; a short index is repaired on restart
                whole = False
                self._log_write_failure(f"cannot write an index entry of {seg.log_path}: {exc.strerror}")
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

    def _undo_partial_write(self, seg: Segment, position: int) -> None:
        """Cut off whatever part of a failed write reached the file, so the log stays whole batches."""
        try:
            assert seg.fd is not None
            os.ftruncate(seg.fd, position)
        except OSError as exc:
            self._failed = StorageError(
                f"{seg.log_path} has a partial batch that cannot be removed ({exc.strerror}); "
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
        """Close the active segment and start a new one at the high watermark."""
        old = self._active
        assert old.index is not None and old.time_fd is not None
        tail = old.index.finalize()
        if tail:
            write_all(old.time_fd, tail)
        old.dirty_index = True
        new = Segment.create(self.directory, old.end_offset, now, self.config.index_interval_bytes)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._open_closed[old.base_offset] = old
        self._dir_dirty = True
        self.flusher.note_write()
        self.flusher.kick()  # like Kafka: a rolled segment is flushed in the background whatever the policy
        log.debug("rolled segment", extra={"partition": f"{self.topic}-{self.partition}", "base": new.base_offset})

    def write_mark(self) -> int:
        return self.flusher.written

    async def _make_durable(self, mark: int | None) -> None:
        if self.config.flush is FlushPolicy.ALWAYS:
            await self.flusher.wait_durable(mark)

    async def _sync(self) -> None:
        """One fsync round: every descriptor with unsynced changes, in a worker thread."""
        if self._failed is not None:
            raise self._failed  # a retried fsync may "succeed" after the kernel dropped the pages
        targets: list[tuple[int, bool]] = []
        if self._dir_dirty:
            if self._dir_fd is None:
                try:
                    self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
                except OSError as exc:
                    raise StorageError(f"cannot open {self.directory} to fsync it: {exc.strerror}") from exc
            targets.append((self._dir_fd, True))
            self._dir_dirty = False
        held: list[Segment] = []
        for seg in self._segments:
            if not (seg.dirty_log or seg.dirty_index):
                continue
            if seg.dirty_log and seg.fd is not None:
                targets.append((seg.fd, False))
            if seg.dirty_index:
                targets.extend((fd, False) for fd in (seg.index_fd, seg.time_fd) if fd is not None)
            seg.dirty_log = seg.dirty_index = False
            seg.syncing += 1
            held.append(seg)
        active = self._active
        assert active.index is not None
        point = RecoveryPoint(active.base_offset, active.size, active.end_offset,
                              active.index.max_timestamp, active.created_ms)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, _fsync_all, targets)
        except OSError as exc:
            raise StorageError(
                f"fsync failed in {self.directory} ({exc.strerror or exc}); the data may not be on disk"
            ) from exc
        finally:
            for seg in held:
                seg.syncing -= 1
        self.recovery_point = point
        for seg in held:
            if seg is not self._active and not seg.busy:
                seg.close_index_writers()
        self._trim_open_segments()

    def _sync_failed(self, exc: BaseException) -> None:
        message = f"fsync failed for partition {self.topic}-{self.partition} ({exc}); it refuses writes until restart"
        if self._failed is None:
            log.error(message)
            self._failed = StorageError(message)

    async def reconfigure(self, config: TopicConfig) -> None:
        await super().reconfigure(config)
        self.flusher.policy = config.flush
        self.flusher.interval_s = max(config.flush_interval_ms, 0) / 1000

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
        finally:
            self._closed = True
            for seg in self._segments:
                seg.close()
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None

    # -- reading -------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> bytes:
        self._check_range(offset)
        if offset == self.high_watermark:
            return b""
        i = bisect.bisect_right(self._bases, offset) - 1
        seg = self._use(self._segments[i])
        position = seg.locate(offset, self.config.index_interval_bytes)
        out = bytearray()
        while True:
            chunk = seg.read_batches(position, max_bytes - len(out), at_least_one=not out)
            out += chunk
            if len(out) >= max_bytes or position + len(chunk) < seg.size or i + 1 >= len(self._segments):
                break
            i += 1
            seg, position = self._use(self._segments[i]), 0
        return bytes(out)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        interval = self.config.index_interval_bytes
        for seg in self._segments:
            self._use(seg)
            index = seg.load_index(interval)
            if index.max_timestamp < timestamp_ms:
                continue
            rel = index.time_scan_start(timestamp_ms)
            _, position = index.position_for(rel)
            for _, header in seg.iter_headers(position):
                if header.max_timestamp >= timestamp_ms:
                    return max(header.base_offset, self.log_start_offset)
        return None

    def tail_headers(self, max_bytes: int) -> list[BatchHeader]:
        parts: list[list[BatchHeader]] = []
        need = max_bytes
        for seg in reversed(self._segments):  # newest first, only as far back as needed
            parts.append(self._use(seg).tail_headers(need, self.config.index_interval_bytes))
            need -= seg.size
            if need <= 0:
                break
        return [header for part in reversed(parts) for header in part]

    def _use(self, seg: Segment) -> Segment:
        """Note a read of a closed segment, keeping at most a few of their descriptors open."""
        if seg is not self._active:
            self._open_closed[seg.base_offset] = seg
            self._open_closed.move_to_end(seg.base_offset)
            self._trim_open_segments()
        return seg

    def _trim_open_segments(self) -> None:
        excess = len(self._open_closed) - _OPEN_CLOSED_SEGMENTS
        for base in list(self._open_closed)[:max(excess, 0)]:
            seg = self._open_closed[base]
            if not seg.busy and seg is not self._active:
                seg.close()
                del self._open_closed[base]

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
            self._open_closed.pop(seg.base_offset, None)
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
        self._segments[i] = new
        self._size += new.size - old.size
        if self._open_closed.pop(old.base_offset, None) is not None:
            self._open_closed[new.base_offset] = new
        old.close()


def _fsync_all(targets: list[tuple[int, bool]]) -> None:
    """Runs in a worker thread. fdatasync is enough for files (size changes are included)."""
    for fd, is_dir in targets:
        if is_dir:
            os.fsync(fd)
        else:
            os.fdatasync(fd)


class SegmentLogStore(LogStore):
    """Topics and partitions in a data directory. Call ``await start()`` before use."""

    def __init__(
        self,
        root: Path,
        *,
        default_config: TopicConfig | None = None,
        default_partitions: int = 1,
        auto_create_topics: bool = True,
        clock: Callable[[], float] = time.time,
        checkpoint_interval_s: float = 1.0,
        sync_threads: int = 4,
    ) -> None:
        super().__init__(default_config=default_config, default_partitions=default_partitions,
                         auto_create_topics=auto_create_topics)
        self.root = Path(root)
        self._clock = clock
        self._checkpoint_interval_s = checkpoint_interval_s
        self._executor = ThreadPoolExecutor(max_workers=sync_threads, thread_name_prefix="sluice-fsync")
        self._lock = DirLock(self.root)
        self._started = False
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._last_checkpoint: dict[str, RecoveryPoint] = {}
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_seq = 0
        self._checkpoint_seq_written = 0
        self.recovery_stats: dict[str, int] = {}

    def _dir(self, topic: str, partition: int) -> Path:
        return self.root / f"{topic}-{partition}"

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        started = time.monotonic()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create data directory {self.root}: {exc.strerror}") from exc
        self._lock.acquire()
        try:
            self._load()
        except BaseException:
            self._lock.release()
            raise
        self._started = True
        self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint_loop())
        log.info("log store opened", extra={
            "root": str(self.root), "topics": len(self._topics), **self.recovery_stats,
            "ms": round((time.monotonic() - started) * 1000, 1)})

    def _load(self) -> None:
        clean = (self.root / CLEAN_MARKER).exists()
        doc = read_json(self.root / TOPICS_FILE)
        topics: list[TopicInfo] = []
        if doc is not None:
            try:
                assert isinstance(doc, dict)
                for t in doc["topics"]:
                    topics.append(TopicInfo(t["name"], int(t["partitions"]), TopicConfig.from_dict(t["config"]),
                                            int(t["created_ms"]), bool(t.get("internal", False))))
            except (AssertionError, KeyError, TypeError, ValueError) as exc:
                raise StorageError(
                    f"{self.root / TOPICS_FILE} does not describe topics ({exc!r}); fix or remove it by hand"
                ) from exc
        points = load_checkpoint(self.root)
        if not clean and (points or topics):
            log.warning("previous run did not shut down cleanly; scanning unflushed log tails",
                        extra={"root": str(self.root)})
        scanned = truncated = 0
        for info in topics:
            logs: list[PartitionLog] = []
            for p in range(info.partitions):
                directory = self._dir(info.name, p)
                try:
                    directory.mkdir(exist_ok=True)
                    rec = recover_partition(directory, interval=info.config.index_interval_bytes,
                                            point=points.get(directory.name), now_ms=int(self._clock() * 1000))
                except OSError as exc:
                    raise StorageError(
                        f"cannot recover partition directory {directory}: {exc.strerror or exc}"
                    ) from exc
                scanned += rec.scanned_bytes
                truncated += rec.truncated_bytes
                logs.append(self._make_log(info, p, rec.segments, rec.point))
            self._topics[info.name] = info
            self._partitions[info.name] = logs
        self.recovery_stats = {"clean": int(clean), "scanned_bytes": scanned, "truncated_bytes": truncated}
        known = {self._dir(t.name, p).name for t in topics for p in range(t.partitions)}
        for entry in os.scandir(self.root):
            if entry.is_dir() and entry.name not in known:
                log.warning("directory in the data dir belongs to no topic; left alone",
                            extra={"path": entry.path})
        self._write_checkpoint()
        try:
            (self.root / CLEAN_MARKER).unlink(missing_ok=True)
            fsync_dir(self.root)
        except OSError as exc:
            raise StorageError(f"cannot update data directory {self.root}: {exc.strerror}") from exc

    def _make_log(self, info: TopicInfo, p: int, segments: list[Segment], point: RecoveryPoint) -> PartitionLog:
        return SegmentPartitionLog(info.name, p, info.config, self._dir(info.name, p), segments, point,
                                   executor=self._executor, clock=self._clock)

    async def close(self) -> None:
        if not self._started:
            self._executor.shutdown(wait=False)
            return
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            self._checkpoint_task = None
        errors: list[BaseException] = []
        try:
            for logs in self._partitions.values():
                for log_ in logs:
                    try:
                        await log_.close()
                    except StorageError as exc:
                        errors.append(exc)
            self._write_checkpoint(force=True)
            if errors:  # no clean-shutdown marker: the next start scans from the last good checkpoint
                raise errors[0]
            atomic_write(self.root / CLEAN_MARKER, b"")
        finally:
            self._started = False
            self._lock.release()
            self._executor.shutdown(wait=True)

    # -- recovery checkpoint -------------------------------------------------------------

    def _points(self) -> dict[str, RecoveryPoint]:
        return {
            log_.directory.name: log_.recovery_point
            for logs in self._partitions.values()
            for log_ in logs
            if isinstance(log_, SegmentPartitionLog)
        }

    def _store_points(self, points: dict[str, RecoveryPoint], seq: int) -> None:
        """Write one checkpoint (event loop or worker thread); an older snapshot never replaces a newer one."""
        with self._checkpoint_lock:
            if seq <= self._checkpoint_seq_written:
                return
            write_checkpoint(self.root, points)
            self._checkpoint_seq_written = seq

    def _snapshot_points(self) -> tuple[dict[str, RecoveryPoint], int] | None:
        points = self._points()
        if points == self._last_checkpoint:
            return None
        self._last_checkpoint = points
        self._checkpoint_seq += 1
        return points, self._checkpoint_seq

    def _write_checkpoint(self, *, force: bool = False) -> None:
        snapshot = self._snapshot_points()
        if snapshot is None and force:
            self._checkpoint_seq += 1
            snapshot = self._last_checkpoint, self._checkpoint_seq
        if snapshot is not None:
            self._store_points(*snapshot)

    async def write_checkpoint(self) -> None:
        """Persist the recovery points now (the background loop does this about once a second)."""
        snapshot = self._snapshot_points()
        if snapshot is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._store_points, *snapshot)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self._checkpoint_interval_s)
            try:
                await self.write_checkpoint()
            except StorageError as exc:
                log.error("cannot write recovery checkpoint", extra={"error": str(exc)})

    # -- LogStore hooks ------------------------------------------------------------------

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        if not self._started:
            raise StorageError("the segment log store is not started; call `await store.start()` first")
        directory = self._dir(info.name, partition)
        try:
            if directory.exists():
                log.warning("removing leftover data of a topic that no longer exists",
                            extra={"path": str(directory)})
                shutil.rmtree(directory)
            directory.mkdir()
        except OSError as exc:
            raise StorageError(f"cannot create partition directory {directory}: {exc.strerror}") from exc
        now = int(self._clock() * 1000)
        segment = Segment.create(directory, 0, now, info.config.index_interval_bytes)
        return self._make_log(info, partition, [segment], RecoveryPoint(0, 0, 0, -1, now))

    def _persist_topics(self) -> None:
        import json

        doc = {
            "version": 1,
            "topics": [
                {"name": t.name, "partitions": t.partitions, "config": t.config.to_dict(),
                 "created_ms": t.created_ms, "internal": t.internal}
                for t in self._topics.values()
            ],
        }
        atomic_write(self.root / TOPICS_FILE, json.dumps(doc, indent=1).encode())

    def _remove_partition_data(self, info: TopicInfo, partition: int) -> None:
        directory = self._dir(info.name, partition)
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot remove partition directory {directory}: {exc.strerror}") from exc
