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
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.errors import StorageError
from broker.log.api import LogStore, PartitionLimits, TopicInfo
from broker.log.config import TopicConfig, Visibility
from broker.log.fdcache import FdCache, default_fd_limit
from broker.log.files import DirLock, atomic_write, fsync_dir, read_json
from broker.log.indexcache import DEFAULT_INDEX_CACHE_BYTES, IndexCache
from broker.log.partition_log import PartitionLog
from broker.log.recovery import (
    CLEAN_MARKER,
    RecoveryPoint,
    load_checkpoint,
    recover_partition,
    write_checkpoint,
)
from broker.log.segment_file import Segment
from broker.log.segment_partition import SegmentPartitionLog

__all__ = ["SegmentLogStore", "SegmentPartitionLog"]

log = logging.getLogger("broker.log.segment")

TOPICS_FILE = "topics.json"


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
        limits: PartitionLimits | None = None,
        max_open_files: int | None = None,
        visibility: Visibility = Visibility.DURABLE,
        index_cache_bytes: int | None = DEFAULT_INDEX_CACHE_BYTES,
        preallocate_bytes: int = 0,
    ) -> None:
        super().__init__(default_config=default_config, default_partitions=default_partitions,
                         auto_create_topics=auto_create_topics, limits=limits)
        self.root = Path(root)
        self.visibility = visibility
        # Disk blocks each active segment reserves ahead of its end (0: none; SegmentPartitionLog._reserve).
        self.preallocate_bytes = preallocate_bytes
        # Descriptors of segment files, all partitions together (None: half the soft RLIMIT_NOFILE).
        self.fds = FdCache(default_fd_limit() if max_open_files is None else max_open_files)
        # Closed segments' indexes held in memory, all partitions together (None: no bound).
        self.indexes = IndexCache(index_cache_bytes)
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
                if not directory.exists():  # never written: stays without files until it is
                    logs.append(self._new_partition(info, p))
                    continue
                try:
                    rec = recover_partition(directory, interval=info.config.index_interval_bytes,
                                            point=points.get(directory.name), now_ms=int(self._clock() * 1000),
                                            fds=self.fds)
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

    def _make_log(self, info: TopicInfo, p: int, segments: list[Segment], point: RecoveryPoint,
                  *, materialized: bool = True) -> PartitionLog:
        return SegmentPartitionLog(info.name, p, info.config, self._dir(info.name, p), segments, point,
                                   executor=self._executor, clock=self._clock, fds=self.fds, indexes=self.indexes,
                                   materialized=materialized, visibility=self.visibility,
                                   preallocate_bytes=self.preallocate_bytes)

    def _new_partition(self, info: TopicInfo, p: int) -> PartitionLog:
        """An empty partition with no directory or files yet: they are created by its first write."""
        now = int(self._clock() * 1000)
        segment = Segment.planned(self._dir(info.name, p), 0, now, info.config.index_interval_bytes, self.fds)
        return self._make_log(info, p, [segment], RecoveryPoint(0, 0, 0, -1, now), materialized=False)

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
        return self._new_partition(info, partition)

    def _persist_topics(self) -> None:
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
