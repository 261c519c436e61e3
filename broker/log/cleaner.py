"""Log compaction for topics with ``cleanup.policy`` containing ``compact``.

The segment store is cleaned as described below; the memory store by the same rules over its stored
batches (its newest batch stands for the active segment; nothing to crash-proof).

Rules (Kafka's, for one node):
- Only closed, fsynced segments are cleaned, oldest first, never the active one; a segment becomes
  cleanable once its last append is ``min.compaction.lag.ms`` old. Cleaning stops at the first one
  that is not.
- A partition is cleaned when its dirty bytes (segments not yet cleaned) are at least
  ``min.cleanable.dirty.ratio`` of the cleanable bytes, or its oldest dirty segment is
  ``max.compaction.lag.ms`` old, or tombstones it kept have passed ``delete.retention.ms``.
- The latest record of each key over the cleanable segments is kept; older ones are removed. Keyless
  records are removed (Kafka refuses them at produce time and its cleaner drops them too). A tombstone
  (null value) is kept until ``delete.retention.ms`` after its segment's last append, then removed.
- Offsets never change: a batch that keeps some records keeps its base and last offset; a run of
  batches that keep none becomes one empty batch spanning their offsets, so the log stays dense
  (recovery and the index rely on that) and consumers step over the gap, as they do on Kafka.
  Control batches and transactional batches are kept as they are, and transactional records are
  left out of the latest-per-key map: an aborted record must never shadow a committed one (Kafka
  consults its aborted-transaction index for this; Sluice does not compact transactional data yet).
- Crash safety: the cleaned copy of a segment is built beside it as ``<base>.log.clean.tmp`` (plus its
  indexes), fsynced, then renamed over the old files and the directory fsynced, one segment at a time
  in offset order. A kill at any point leaves each segment either old or new (recovery deletes
  ``*.tmp``); never a mix, and never a later segment cleaned of a tombstone while an earlier one
  still holds the value it deletes.
- Never blocks appends or fetches: the reading and writing run in a worker thread; only the renames
  and the swap of the in-memory ``Segment`` happen in the event loop, synchronously, so a Fetch reads
  either the old segment or the new one, never half of each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from broker.errors import BrokerError
from broker.log.api import LogStore
from broker.log.config import TopicConfig
from broker.log.files import atomic_write, fsync_dir, read_json, write_all
from broker.log.index import SegmentIndex
from broker.log.memory import MemoryPartitionLog
from broker.log.segment import SegmentPartitionLog
from broker.log.segment_file import Segment
from broker.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    decode_header,
    decode_records,
    record_keys,
    reencode_batch,
)

__all__ = ["CLEANER_STATE", "CleanStats", "LogCleaner"]

log = logging.getLogger("broker.log.cleaner")

CLEANER_STATE = "cleaner-state.json"
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 20
_TMP = ".clean.tmp"


@dataclass(frozen=True, slots=True)
class CleanStats:
    topic: str
    partition: int
    segments: int
    bytes_before: int
    bytes_after: int
    records_removed: int
    tombstones_removed: int
    seconds: float


@dataclass(slots=True)
class _State:
    """Persisted per partition: how far cleaning got, and when kept tombstones expire."""

    cleaned_to: int = 0  # offsets below this have been cleaned at least once
    tombstones_until: int | None = None  # ms: the earliest time a kept tombstone may be removed


@dataclass(frozen=True, slots=True)
class _Job:
    segment: Segment
    base: int
    log_path: Path
    size: int
    last_write_ms: int


@dataclass(slots=True)
class _Built:
    job: _Job
    size: int
    index: SegmentIndex
    removed: int = 0
    tombstones_removed: int = 0
    kept_tombstones: bool = False


class LogCleaner:
    """Cleans compacted partitions of a ``LogStore``; ``run`` loops, ``clean_once`` does one pass."""

    def __init__(self, store: LogStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-cleaner")
        self._states: dict[Path, _State] = {}
        self._memory_states: weakref.WeakKeyDictionary[MemoryPartitionLog, _State] = weakref.WeakKeyDictionary()
        self.passes = 0  # for tests and metrics: completed clean_once calls
        self.cleaned: list[CleanStats] = []  # the last pass's results

    async def run(self, interval_s: float) -> None:
        try:
            while True:
                await self.clean_once()
                await asyncio.sleep(interval_s)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def clean_once(self) -> list[CleanStats]:
        results: list[CleanStats] = []
        for info in self.store.list_topics(include_internal=True):
            if not info.config.compact:
                continue
            try:
                partitions = self.store.partitions(info.name)
            except BrokerError:
                continue  # deleted meanwhile
            for plog in partitions:
                try:
                    if isinstance(plog, SegmentPartitionLog):
                        stats = await self.clean_partition(plog)
                    elif isinstance(plog, MemoryPartitionLog):
                        stats = await self.clean_memory_partition(plog)
                    else:
                        continue
                except (BrokerError, OSError) as exc:
                    log.error("cannot clean partition; will retry", extra={
                        "partition": f"{plog.topic}-{plog.partition}", "error": str(exc)})
                    continue
                if stats is not None:
                    results.append(stats)
        self.cleaned = results
        self.passes += 1
        return results

    # -- one partition of the memory store ------------------------------------------------------

    async def clean_memory_partition(self, plog: MemoryPartitionLog) -> CleanStats | None:
        """The same rules on the memory store's batches (the newest one stands for the active segment);
        the work runs in the worker thread on immutable bytes, the swap in the event loop."""
        started = time.monotonic()
        now = int(self._clock() * 1000)
        config = plog.config
        batches = plog.cleanable_batches(now, config.min_compaction_lag_ms)
        if not batches:
            return None
        state = self._memory_states.setdefault(plog, _State())
        headers = [decode_header(batch) for batch, _ in batches]
        dirty = [(len(b), appended) for (b, appended), h in zip(batches, headers, strict=True)
                 if h.last_offset >= state.cleaned_to]
        total = sum(len(b) for b, _ in batches)
        due = bool(dirty) and (sum(size for size, _ in dirty) / total >= config.min_cleanable_dirty_ratio
                               or now - dirty[0][1] >= config.max_compaction_lag_ms)
        if not (due or (state.tombstones_until is not None and now >= state.tombstones_until)):
            return None
        loop = asyncio.get_running_loop()
        cleaned, counts, tombstones_until = await loop.run_in_executor(
            self._executor, _clean_memory, batches, config.delete_retention_ms, now)
        if not plog.replace_cleaned(batches[0][0], len(batches), cleaned):
            return None  # retention moved the log start meanwhile: next pass
        state.cleaned_to = headers[-1].last_offset + 1
        state.tombstones_until = tombstones_until
        stats = CleanStats(plog.topic, plog.partition, len(batches), total, sum(len(b) for b, _, _ in cleaned),
                           counts.removed, counts.tombstones_removed, time.monotonic() - started)
        log.info("cleaned partition", extra={
            "partition": f"{plog.topic}-{plog.partition}", "batches": len(batches), "bytes_before": total,
            "bytes_after": stats.bytes_after, "records_removed": counts.removed,
            "tombstones_removed": counts.tombstones_removed, "ms": round(stats.seconds * 1000, 1)})
        return stats

    # -- one partition ---------------------------------------------------------------------

    def _state(self, plog: SegmentPartitionLog) -> _State:
        state = self._states.get(plog.directory)
        if state is None:
            state = _State()
            try:
                doc = read_json(plog.directory / CLEANER_STATE)
                if isinstance(doc, dict):
                    state = _State(int(doc.get("cleaned_to", 0)), doc.get("tombstones_until"))
            except (BrokerError, TypeError, ValueError):
                pass  # unreadable: everything counts as dirty, which is only more work
            self._states[plog.directory] = state
        return state

    def _due(self, plog: SegmentPartitionLog, now: int) -> list[Segment]:
        """The segments to clean now (empty: nothing is due)."""
        config = plog.config
        eligible: list[Segment] = []
        for seg in plog.cleanable_segments():
            if now - seg.last_write_ms < config.min_compaction_lag_ms:
                break
            eligible.append(seg)
        if not eligible:
            return []
        state = self._state(plog)
        dirty = [s for s in eligible if s.end_offset > state.cleaned_to]
        total = sum(s.size for s in eligible)
        dirty_bytes = sum(s.size for s in dirty)
        due = bool(dirty) and (
            (total > 0 and dirty_bytes / total >= config.min_cleanable_dirty_ratio)
            or now - dirty[0].last_write_ms >= config.max_compaction_lag_ms
        )
        tombstones_due = state.tombstones_until is not None and now >= state.tombstones_until
        return eligible if due or tombstones_due else []

    async def clean_partition(self, plog: SegmentPartitionLog) -> CleanStats | None:
        started = time.monotonic()
        if len(plog.cleanable_segments()) < plog.segment_count - 1:
            # A rolled segment still waits for its fsync (under flush=os a roll during a running sync
            # is only synced by the next one): sync now rather than leave it uncleanable.
            await plog.flush()
        now = int(self._clock() * 1000)
        segments = self._due(plog, now)
        if not segments:
            return None
        jobs = [_Job(s, s.base_offset, s.log_path, s.size, s.last_write_ms) for s in segments]
        loop = asyncio.get_running_loop()
        config, interval = plog.config, plog.config.index_interval_bytes
        built = await loop.run_in_executor(self._executor, _build_all, jobs, config, now, interval)
        bytes_after = removed = tombstones = 0
        tombstones_until: int | None = None
        swapped = 0
        unsynced = False  # renames not yet made durable by a directory fsync
        try:
            for item in built:
                if item.tombstones_removed and unsynced:
                    # Earlier segments' renames must be on disk first: were this one to survive a crash
                    # without them, a value its dropped tombstone deleted would come back.
                    await loop.run_in_executor(self._executor, fsync_dir, plog.directory)
                if not _swap(plog, item):
                    _discard(item.job)
                    continue
                swapped += 1
                unsynced = True
                bytes_after += item.size
                removed += item.removed
                tombstones += item.tombstones_removed
        finally:
            for item in built[swapped:]:
                _discard(item.job)
        if unsynced:
            await loop.run_in_executor(self._executor, fsync_dir, plog.directory)
        for item in built[:swapped]:
            if item.kept_tombstones:
                deadline = item.job.last_write_ms + config.delete_retention_ms
                tombstones_until = deadline if tombstones_until is None else min(tombstones_until, deadline)
        state = self._state(plog)
        state.cleaned_to = max(state.cleaned_to, jobs[-1].segment.end_offset)
        state.tombstones_until = tombstones_until
        doc: dict[str, object] = {"cleaned_to": state.cleaned_to, "tombstones_until": state.tombstones_until}
        await loop.run_in_executor(self._executor, _write_state, plog.directory, doc)
        stats = CleanStats(plog.topic, plog.partition, swapped, sum(j.size for j in jobs), bytes_after,
                           removed, tombstones, time.monotonic() - started)
        log.info("cleaned partition", extra={
            "partition": f"{plog.topic}-{plog.partition}", "segments": swapped, "bytes_before": stats.bytes_before,
            "bytes_after": bytes_after, "records_removed": removed, "tombstones_removed": tombstones,
            "ms": round(stats.seconds * 1000, 1)})
        return stats


def _write_state(directory: Path, doc: dict[str, object]) -> None:
    import json

    atomic_write(directory / CLEANER_STATE, json.dumps(doc).encode())


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + _TMP)


def _discard(job: _Job) -> None:
    for path in (job.log_path, job.segment.index_path, job.segment.time_path):
        try:
            _tmp(path).unlink()
        except OSError:
            pass


def _swap(plog: SegmentPartitionLog, item: _Built) -> bool:
    """Rename the cleaned files over the old segment and swap it in memory (event loop, no await)."""
    old = item.job.segment
    if not plog.can_replace(old):
        return False  # removed by retention or the partition closed meanwhile
    os.replace(_tmp(old.index_path), old.index_path)
    os.replace(_tmp(old.time_path), old.time_path)
    os.replace(_tmp(old.log_path), old.log_path)
    new = Segment(old.directory, old.base_offset, size=item.size, end_offset=old.end_offset,
                  last_write_ms=old.last_write_ms, created_ms=old.created_ms, index=item.index)
    plog.replace_segment(old, new)
    return True


# -- worker thread -------------------------------------------------------------------------


def _iter_batches(path: Path, size: int) -> Iterator[tuple[bytes, BatchHeader]]:
    """Whole stored batches of a segment file (already CRC-checked on the way in)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        position = 0
        while position < size:
            buf = os.pread(fd, min(_READ_CHUNK, size - position), position)
            pos = 0
            while len(buf) - pos >= BATCH_HEADER_SIZE:
                header = decode_header(buf, pos)
                if pos + header.size > len(buf):
                    if pos == 0:  # one batch larger than the chunk
                        buf = os.pread(fd, header.size, position)
                        continue
                    break
                yield buf[pos : pos + header.size], header
                pos += header.size
            if pos == 0:
                return  # a partial tail: not ours to judge (recovery's job)
            position += pos
    finally:
        os.close(fd)


def _build_all(jobs: list[_Job], config: TopicConfig, now: int, interval: int) -> list[_Built]:
    latest: dict[bytes, int] = {}
    for job in jobs:
        for batch, header in _iter_batches(job.log_path, job.size):
            if header.is_transactional:
                continue  # see _rewrite: transactional records neither shadow nor are shadowed (yet)
            for offset, key, _tombstone in record_keys(batch, header):
                if key is not None:
                    latest[key] = offset
    built: list[_Built] = []
    try:
        for job in jobs:
            drop_tombstones = now - job.last_write_ms >= config.delete_retention_ms
            built.append(_rewrite(job, latest, drop_tombstones, interval))
    except BaseException:
        for job in jobs:
            _discard(job)
        raise
    return built


class _Writer:
    """Buffered writes of the cleaned segment with its index."""

    def __init__(self, path: Path, interval: int, base: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.index = SegmentIndex(interval)
        self.base = base
        self.size = 0
        self.buffer = bytearray()
        self.index_bytes = bytearray()
        self.time_bytes = bytearray()

    def add(self, batch: bytes, header: BatchHeader) -> None:
        idx, times = self.index.on_batch(self.size, header.base_offset - self.base, header.last_offset - self.base,
                                         header.max_timestamp, len(batch))
        self.index_bytes += idx
        self.time_bytes += times
        self.buffer += batch
        self.size += len(batch)
        if len(self.buffer) >= _WRITE_CHUNK:
            write_all(self.fd, self.buffer)
            self.buffer.clear()
            # Sync as we go: one large fsync at the end would hold up the appenders' own fsyncs (the
            # journal commits them together) for as long as it takes to write the whole segment.
            os.fdatasync(self.fd)

    def finish(self) -> None:
        try:
            write_all(self.fd, self.buffer)
            os.fsync(self.fd)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(slots=True)
class _Counts:
    removed: int = 0
    tombstones_removed: int = 0
    kept_tombstones: bool = False


def _compact(
    batches: Iterable[tuple[bytes, BatchHeader, bool, int]], latest: dict[bytes, int], counts: _Counts
) -> Iterator[tuple[bytes, BatchHeader, int]]:
    """The cleaned batches for ``(batch, header, drop tombstones?, tag)`` input, each with the tag of the
    (last) input batch it stands for: kept whole, re-encoded with fewer records, or a run of batches
    that kept nothing folded into one empty batch spanning their offsets."""
    run: tuple[BatchHeader, int, int] | None = None  # first header, last offset, tag

    def empty_run() -> tuple[bytes, BatchHeader, int]:
        assert run is not None
        first, last, tag = run
        data = reencode_batch(first._replace(last_offset_delta=last - first.base_offset, attributes=0,
                                                  producer_id=-1, producer_epoch=-1, base_sequence=-1), [])
        return data, decode_header(data), tag

    for batch, header, drop_tombstones, tag in batches:
        if header.is_control or header.is_transactional:
            # Kept as they are: an aborted transaction's record must never shadow a committed
            # value, and which ones were aborted is the transaction layer's to say.
            if run is not None:
                yield empty_run()
                run = None
            yield batch, header, tag
            continue
        keys = record_keys(batch, header)
        kept: set[int] = set()
        for offset, key, tombstone in keys:
            if key is None or latest.get(key) != offset:
                counts.removed += 1
            elif tombstone and drop_tombstones:
                counts.removed += 1
                counts.tombstones_removed += 1
            else:
                kept.add(offset)
                counts.kept_tombstones = counts.kept_tombstones or tombstone
        if kept or not keys:
            if run is not None:
                yield empty_run()
                run = None
            if len(kept) == len(keys):
                yield batch, header, tag  # nothing to remove: the stored bytes as they are
            else:
                data = reencode_batch(header, [r for r in decode_records(batch, header) if r.offset in kept])
                yield data, decode_header(data), tag
        else:
            run = (run[0] if run is not None else header, header.last_offset, tag)
    if run is not None:
        yield empty_run()


def _rewrite(job: _Job, latest: dict[bytes, int], drop_tombstones: bool, interval: int) -> _Built:
    out = _Writer(_tmp(job.log_path), interval, job.base)
    counts = _Counts()
    try:
        source = ((batch, header, drop_tombstones, 0) for batch, header in _iter_batches(job.log_path, job.size))
        for data, header, _tag in _compact(source, latest, counts):
            out.add(data, header)
        out.finish()
        out.index.finalize()
        out.index.next_rel = job.segment.end_offset - job.base
        raw_index, raw_times = out.index.to_bytes()
        _write_synced(_tmp(job.segment.index_path), raw_index)
        _write_synced(_tmp(job.segment.time_path), raw_times)
        # Keep the segment's age: time retention (compact,delete) and tombstone expiry count from it.
        os.utime(_tmp(job.log_path), ns=(job.last_write_ms * 1_000_000, job.last_write_ms * 1_000_000))
    except BaseException:
        out.close()
        _discard(job)
        raise
    return _Built(job, out.size, out.index, counts.removed, counts.tombstones_removed, counts.kept_tombstones)


def _clean_memory(
    batches: list[tuple[bytes, int]], delete_retention_ms: int, now: int
) -> tuple[list[tuple[bytes, int, int]], _Counts, int | None]:
    """The memory store's cleaned batches ``(batch, base offset, append time)``, the counts, and when
    the earliest kept tombstone may go (worker thread; the bytes objects are immutable)."""
    latest: dict[bytes, int] = {}
    headers = [decode_header(batch) for batch, _ in batches]
    for (batch, _), header in zip(batches, headers, strict=True):
        if not header.is_transactional:
            for offset, key, _tombstone in record_keys(batch, header):
                if key is not None:
                    latest[key] = offset
    counts = _Counts()
    source = ((batch, header, now - appended >= delete_retention_ms, i)
              for i, ((batch, appended), header) in enumerate(zip(batches, headers, strict=True)))
    cleaned: list[tuple[bytes, int, int]] = []
    tombstones_until: int | None = None
    for data, header, i in _compact(source, latest, counts):
        appended = batches[i][1]
        cleaned.append((bytes(data), header.base_offset, appended))
    if counts.kept_tombstones:
        tombstones_until = min(appended + delete_retention_ms for _, appended in batches)
    return cleaned, counts, tombstones_until


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
