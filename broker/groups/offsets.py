"""Committed offsets and group metadata: the ``OffsetStore`` interface and its two implementations.

``MemoryOffsetStore`` keeps offsets in a dict (tests, ``--storage memory``). ``DurableOffsetStore``
keeps them under a directory (``<data_dir>/groups/``)::

    offsets.snapshot          the whole state as of the end of log file N (atomic write + rename)
    offsets-<N+1>.log ...     commits since, appended as framed records

A framed record is ``u32 payload length, u32 CRC32C(payload), payload``; payloads are
``u8 kind`` + ``str16 group`` and, for commits (kind 5), ``u32 count`` × (``str16 topic, i32 partition,
i64 offset, i64 commit timestamp, i64 expire timestamp (-1 = none), i32 metadata length (-1 = null),
metadata utf-8``) (kind 1, written before offsets expired, has no timestamps: its offsets count as
committed when the store opens); a removal (kind 6, expired offsets) is ``u32 count`` × (``str16 topic,
i32 partition``) and forgets those offsets; a delete (kind 2, DeleteGroups) has no
more and removes the group's offsets and metadata; group metadata (kind 4) is followed by Kafka's
``GroupMetadataValue`` (group_records.py) and replaces the group's previous one (the latest per group
counts, as in Kafka's compacted ``__consumer_offsets``). Strings are ``u16 length`` + utf-8. The
snapshot (version 3; versions 1 (no group metadata) and 2 (untimed commits) are still read) holds one commit record
per group with offsets, one metadata record per group with metadata, and an end record (kind 3,
``u32`` number of records before it).

Durability: ``commit`` writes its record and returns only after an fsync that covers it. Commits
that arrive while an fsync runs share the next one (group commit). A failed write or fsync poisons
the store: every later commit fails, because a torn record in the middle of a log would hide the
commits after it.

Recovery: the snapshot is read, then every log file newer than it, in order. Only the newest log
may end in a torn record (a crash mid-append): it is ignored with a warning — nothing in it was
acknowledged. Damage anywhere else raises ``OffsetStoreCorruptError`` instead of dropping acknowledged
commits. After recovery, and whenever the current log grows past ``compact_bytes``, the state is
written as a new snapshot and the logs it covers are deleted; new commits go to a fresh log file,
so compaction never blocks or races appends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import struct
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import crc32c

from broker.groups.errors import OffsetStoreCorruptError, OffsetStoreError
from broker.groups.group_records import GroupMetadataRecord, decode_group_metadata, encode_group_metadata

__all__ = [
    "CommittedOffset",
    "DurableOffsetStore",
    "MemoryOffsetStore",
    "OffsetStore",
    "TopicPartition",
]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class CommittedOffset(NamedTuple):
    offset: int
    metadata: str | None
    # Wall-clock ms (Kafka's commitTimestamp; -1 until the store stamps it with the time of the commit)
    commit_timestamp_ms: int = -1
    # Kafka's expireTimestamp: commit time + an OffsetCommit v2-v4 retention_time_ms; -1 = none
    expire_timestamp_ms: int = -1


class OffsetStore(ABC):
    """Where a group's committed offsets live. One event loop uses a store at a time.

    Both stores keep every committed offset in memory (``_state``) and answer reads from it; they
    differ in how a commit or delete reaches it (directly, or through the durable log first)."""

    def __init__(self) -> None:
        self._state = _State()

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Load stored state; called once before use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Finish outstanding writes and release files."""

    @abstractmethod
    async def commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Store the offsets; returns once they survive a crash (for durable stores)."""

    @abstractmethod
    async def delete_group(self, group_id: str) -> None:
        """Forget every offset of the group, and its metadata."""

    @abstractmethod
    async def remove_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Forget these committed offsets of the group (expired ones); returns once that survives a crash."""

    @abstractmethod
    async def store_group(self, group_id: str, record: GroupMetadataRecord) -> None:
        """Store the group's metadata in place of the previous one; returns once it survives a crash.
        ValueError when the record does not fit Kafka's format (group_records.encode_group_metadata)."""

    def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of the group: all of them, or those of ``partitions`` that exist."""
        return self._state.fetch(group_id, partitions)

    def groups(self) -> list[str]:
        """Groups with at least one committed offset."""
        return sorted(self._state.groups)

    def group_metadata(self) -> dict[str, GroupMetadataRecord]:
        """The latest stored metadata of every group (what the coordinator restores at start)."""
        return dict(self._state.metadata)


class _State:
    """The maps both stores keep in memory."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.metadata: dict[str, GroupMetadataRecord] = {}

    def apply_commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        if offsets:
            self.groups.setdefault(group_id, {}).update(offsets)

    def apply_remove(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        stored = self.groups.get(group_id)
        if stored is None:
            return
        for tp in partitions:
            stored.pop(tp, None)
        if not stored:
            del self.groups[group_id]

    def stamp_untimed(self, now_ms: int) -> None:
        """Give offsets stored without a commit time (kind 1 records) ``now_ms``: they expire a
        retention period after the first start that knows about expiry, never at once."""
        for offsets in self.groups.values():
            for tp, committed in offsets.items():
                if committed.commit_timestamp_ms < 0:
                    offsets[tp] = committed._replace(commit_timestamp_ms=now_ms)

    def apply_delete(self, group_id: str) -> None:
        self.groups.pop(group_id, None)
        self.metadata.pop(group_id, None)

    def apply(self, kind: int, group_id: str, body: _Body) -> None:
        if kind in (_KIND_COMMIT, _KIND_COMMIT_TIMED) and isinstance(body, dict):
            self.apply_commit(group_id, body)
        elif kind == _KIND_REMOVE and isinstance(body, list):
            self.apply_remove(group_id, body)
        elif kind == _KIND_GROUP and isinstance(body, GroupMetadataRecord):
            self.metadata[group_id] = body
        elif kind == _KIND_DELETE:
            self.apply_delete(group_id)

    def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        stored = self.groups.get(group_id, {})
        if partitions is None:
            return dict(stored)
        return {tp: stored[tp] for tp in partitions if tp in stored}


def _stamped(offsets: Mapping[TopicPartition, CommittedOffset]) -> dict[TopicPartition, CommittedOffset]:
    """The offsets as CommittedOffsets, those without a commit time given the current time."""
    now_ms = int(time.time() * 1000)
    clean = {}
    for tp, value in offsets.items():
        committed = CommittedOffset(*value)
        clean[tp] = committed if committed.commit_timestamp_ms >= 0 else committed._replace(commit_timestamp_ms=now_ms)
    return clean


class MemoryOffsetStore(OffsetStore):
    async def commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        self._state.apply_commit(group_id, _stamped(offsets))

    async def remove_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._state.apply_remove(group_id, list(partitions))

    async def delete_group(self, group_id: str) -> None:
        self._state.apply_delete(group_id)

    async def store_group(self, group_id: str, record: GroupMetadataRecord) -> None:
        encode_group_metadata(record)  # refuses what the durable store refuses (ValueError)
        self._state.metadata[group_id] = record


# ---------------------------------------------------------------------- record codec

_FRAME = struct.Struct(">II")
_SNAPSHOT_HEADER = struct.Struct(">8sHQ")
_SNAPSHOT_MAGIC = b"SLUICEOF"
_SNAPSHOT_VERSION = 3
_SNAPSHOT_VERSIONS = (1, 2, 3)  # 1: before group metadata records; 2: before commit timestamps
_KIND_COMMIT = 1
_KIND_DELETE = 2
_KIND_END = 3
_KIND_GROUP = 4
_KIND_COMMIT_TIMED = 5
_KIND_REMOVE = 6
_Body = dict[TopicPartition, CommittedOffset] | list[TopicPartition] | GroupMetadataRecord | int | None
_ENTRY = struct.Struct(">iqi")  # kind 1
_TIMED_ENTRY = struct.Struct(">iqqqi")
_LOG_NAME = re.compile(r"^offsets-(\d{12})\.log$")
SNAPSHOT_NAME = "offsets.snapshot"


def _str16(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">H", len(raw)) + raw


def encode_commit(group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> bytes:
    parts = [bytes([_KIND_COMMIT_TIMED]), _str16(group_id), struct.pack(">I", len(offsets))]
    for (topic, partition), (offset, metadata, committed_ms, expire_ms) in offsets.items():
        parts.append(_str16(topic))
        raw = b"" if metadata is None else metadata.encode()
        length = -1 if metadata is None else len(raw)
        parts.append(_TIMED_ENTRY.pack(partition, offset, committed_ms, expire_ms, length))
        parts.append(raw)
    return b"".join(parts)


def encode_remove(group_id: str, partitions: Iterable[TopicPartition]) -> bytes:
    entries = [_str16(topic) + struct.pack(">i", partition) for topic, partition in partitions]
    return b"".join([bytes([_KIND_REMOVE]), _str16(group_id), struct.pack(">I", len(entries)), *entries])


def encode_group(group_id: str, record: GroupMetadataRecord) -> bytes:
    return bytes([_KIND_GROUP]) + _str16(group_id) + encode_group_metadata(record)


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("payload ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def str16(self) -> str:
        (n,) = struct.unpack(">H", self.take(2))
        return self.take(n).decode()


def _decode_payload(payload: bytes) -> tuple[int, str, _Body]:
    r = _Reader(payload)
    kind = r.take(1)[0]
    if kind == _KIND_END:
        (count,) = struct.unpack(">I", r.take(4))
        return kind, "", count
    group_id = r.str16()
    if kind == _KIND_DELETE:
        return kind, group_id, None
    if kind == _KIND_GROUP:
        return kind, group_id, decode_group_metadata(payload[r.pos :])
    if kind not in (_KIND_COMMIT, _KIND_COMMIT_TIMED, _KIND_REMOVE):
        raise ValueError(f"unknown record kind {kind}")
    (count,) = struct.unpack(">I", r.take(4))
    body: dict[TopicPartition, CommittedOffset] | list[TopicPartition]
    if kind == _KIND_REMOVE:
        body = []
        for _ in range(count):
            topic = r.str16()
            body.append((topic, struct.unpack(">i", r.take(4))[0]))
    else:
        body = {}
        for _ in range(count):
            topic = r.str16()
            if kind == _KIND_COMMIT:
                partition, offset, mlen = _ENTRY.unpack(r.take(_ENTRY.size))
                committed_ms = expire_ms = -1
            else:
                partition, offset, committed_ms, expire_ms, mlen = _TIMED_ENTRY.unpack(r.take(_TIMED_ENTRY.size))
            metadata = None if mlen < 0 else r.take(mlen).decode()
            body[(topic, partition)] = CommittedOffset(offset, metadata, committed_ms, expire_ms)
    if r.pos != len(payload):
        raise ValueError("trailing bytes in payload")
    return kind, group_id, body


def _iter_frames(data: bytes, start: int) -> Iterable[tuple[int, bytes]]:
    """Yield (end position, payload) for each intact frame; stops at the first bad one."""
    pos = start
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > len(data):
            return
        payload = data[pos + _FRAME.size : end]
        if crc32c.crc32c(payload) != crc:
            return
        yield end, payload
        pos = end


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# ---------------------------------------------------------------------- durable store


class DurableOffsetStore(OffsetStore):
    def __init__(self, directory: str | os.PathLike[str], *, compact_bytes: int = 16 * 1024 * 1024) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.compact_bytes = compact_bytes
        self._fd: int | None = None
        self._log_seq = 0
        self._log_bytes = 0
        self._dir_dirty = False
        self._written = 0  # records written to the OS
        self._synced = 0  # records covered by a completed fsync
        self._unsynced: list[tuple[int, int, str, _Body]] = []
        self._sync_task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    # -------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            covers = self._load_snapshot()
            logs = self._log_files()
            newest = max([covers, *logs], default=covers)
            replay = [seq for seq in sorted(logs) if seq > covers]
            for seq in replay:
                self._replay_log(seq, last=seq == replay[-1])
            self._state.stamp_untimed(int(time.time() * 1000))
            self._write_snapshot(self._snapshot_bytes(newest))
            for seq in logs:
                (self.directory / self._log_name(seq)).unlink()
            self._open_log(newest + 1)
            _fsync_dir(self.directory)
            self._dir_dirty = False
        except OSError as exc:
            raise OffsetStoreError(f"cannot open offset store in {self.directory}: {exc}") from exc
        log.info("offset store opened", extra={"dir": str(self.directory), "groups": len(self._state.groups),
                                               "group_metadata": len(self._state.metadata), "replayed": len(replay)})

    async def close(self) -> None:
        if self._sync_task is not None and not self._sync_task.done():
            try:
                await asyncio.shield(self._sync_task)
            except OffsetStoreError:
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -------------------------------------------------------------- OffsetStore

    async def commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        clean = _stamped(offsets)
        await self._append(_KIND_COMMIT_TIMED, group_id, clean, encode_commit(group_id, clean))

    async def remove_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        tps = list(partitions)
        await self._append(_KIND_REMOVE, group_id, tps, encode_remove(group_id, tps))

    async def delete_group(self, group_id: str) -> None:
        await self._append(_KIND_DELETE, group_id, None, bytes([_KIND_DELETE]) + _str16(group_id))

    async def store_group(self, group_id: str, record: GroupMetadataRecord) -> None:
        await self._append(_KIND_GROUP, group_id, record, encode_group(group_id, record))

    # -------------------------------------------------------------- write path

    async def _append(self, kind: int, group_id: str, body: _Body, payload: bytes) -> None:
        if self._failed is not None:
            raise OffsetStoreError(f"offset store failed earlier: {self._failed}")
        if self._fd is None:
            raise OffsetStoreError("offset store is not open")
        frame = _frame(payload)
        try:
            _write_all(self._fd, frame)
        except OSError as exc:
            self._failed = exc
            log.error("offset log write failed", extra={"dir": str(self.directory), "error": str(exc)})
            raise OffsetStoreError(f"cannot write the offset log: {exc}") from exc
        self._log_bytes += len(frame)
        self._written += 1
        seq = self._written
        self._unsynced.append((seq, kind, group_id, body))
        while self._synced < seq:
            if self._failed is not None:
                raise OffsetStoreError(f"offset store failed: {self._failed}")
            if self._sync_task is None or self._sync_task.done():
                self._sync_task = asyncio.get_running_loop().create_task(self._sync())
                self._sync_task.add_done_callback(_consume_exception)
            await asyncio.shield(self._sync_task)

    async def _sync(self) -> None:
        target = self._written
        fd = self._fd
        dir_dirty = self._dir_dirty
        assert fd is not None
        try:
            await asyncio.to_thread(self._fsync, fd, dir_dirty)
        except OSError as exc:
            self._failed = exc
            log.error("offset log fsync failed", extra={"dir": str(self.directory), "error": str(exc)})
            raise OffsetStoreError(f"cannot fsync the offset log: {exc}") from exc
        if dir_dirty:
            self._dir_dirty = False
        self._synced = max(self._synced, target)
        done = [item for item in self._unsynced if item[0] <= target]
        self._unsynced = [item for item in self._unsynced if item[0] > target]
        for _, kind, group_id, body in done:
            self._state.apply(kind, group_id, body)
        if self._log_bytes >= self.compact_bytes and self._written == self._synced:
            await self._compact()

    def _fsync(self, fd: int, dir_dirty: bool) -> None:
        os.fsync(fd)
        if dir_dirty:
            _fsync_dir(self.directory)

    async def _compact(self) -> None:
        """Snapshot the (fully synced) state and move appends to a fresh log file."""
        covers = self._log_seq
        snapshot = self._snapshot_bytes(covers)
        old_fd = self._fd
        try:
            self._open_log(covers + 1)
        except OSError as exc:
            log.warning("offset log rotation failed", extra={"dir": str(self.directory), "error": str(exc)})
            return
        if old_fd is not None:
            os.close(old_fd)
        self._dir_dirty = True
        try:
            await asyncio.to_thread(self._finish_compaction, snapshot, covers)
        except OSError as exc:
            # The old logs stay and are replayed on the next start; nothing is lost.
            log.warning("offset snapshot failed", extra={"dir": str(self.directory), "error": str(exc)})
            return
        log.info("offset store compacted", extra={"dir": str(self.directory), "log_seq": covers + 1})

    def _finish_compaction(self, snapshot: bytes, covers: int) -> None:
        self._write_snapshot(snapshot)
        for seq in self._log_files():
            if seq <= covers:
                (self.directory / self._log_name(seq)).unlink()

    # -------------------------------------------------------------- files

    @staticmethod
    def _log_name(seq: int) -> str:
        return f"offsets-{seq:012d}.log"

    def _log_files(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _LOG_NAME.match(p.name)))

    def _open_log(self, seq: int) -> None:
        path = self.directory / self._log_name(seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._log_seq = seq
        self._log_bytes = os.fstat(self._fd).st_size

    def _snapshot_bytes(self, covers: int) -> bytes:
        parts = [_SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, covers)]
        for group_id, offsets in self._state.groups.items():
            parts.append(_frame(encode_commit(group_id, offsets)))
        for group_id, record in self._state.metadata.items():
            parts.append(_frame(encode_group(group_id, record)))
        parts.append(_frame(bytes([_KIND_END]) + struct.pack(">I", len(parts) - 1)))
        return b"".join(parts)

    def _write_snapshot(self, data: bytes) -> None:
        tmp = self.directory / (SNAPSHOT_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / SNAPSHOT_NAME)
        _fsync_dir(self.directory)

    def _load_snapshot(self) -> int:
        path = self.directory / SNAPSHOT_NAME
        if not path.exists():
            return 0
        data = path.read_bytes()
        if len(data) < _SNAPSHOT_HEADER.size:
            raise OffsetStoreCorruptError(f"{path}: shorter than its header")
        magic, version, covers = _SNAPSHOT_HEADER.unpack_from(data, 0)
        if magic != _SNAPSHOT_MAGIC or version not in _SNAPSHOT_VERSIONS:
            raise OffsetStoreCorruptError(f"{path}: not an offset snapshot (magic {magic!r}, version {version})")
        records = 0
        end_seen = False
        pos = _SNAPSHOT_HEADER.size
        for pos, payload in _iter_frames(data, _SNAPSHOT_HEADER.size):  # noqa: B007 - pos used after the loop
            try:
                kind, group_id, body = _decode_payload(payload)
            except (ValueError, UnicodeDecodeError) as exc:
                raise OffsetStoreCorruptError(f"{path}: undecodable record: {exc}") from exc
            if kind == _KIND_END:
                end_seen = body == records
                break
            if kind not in (_KIND_COMMIT, _KIND_COMMIT_TIMED, _KIND_GROUP):
                raise OffsetStoreCorruptError(f"{path}: record of kind {kind} in a snapshot")
            self._state.apply(kind, group_id, body)
            records += 1
        if not end_seen or pos != len(data):
            raise OffsetStoreCorruptError(f"{path}: damaged or truncated (read {records} records)")
        return int(covers)

    def _replay_log(self, seq: int, *, last: bool) -> None:
        path = self.directory / self._log_name(seq)
        data = path.read_bytes()
        good = 0
        for end, payload in _iter_frames(data, 0):
            try:
                kind, group_id, body = _decode_payload(payload)
            except (ValueError, UnicodeDecodeError) as exc:
                raise OffsetStoreCorruptError(f"{path}@{good}: undecodable record: {exc}") from exc
            self._state.apply(kind, group_id, body)
            good = end
        if good != len(data):
            if not last:
                raise OffsetStoreCorruptError(f"{path}: damaged record at byte {good} of {len(data)}")
            log.warning(
                "offset log ends in a torn record; ignoring it (it was never acknowledged)",
                extra={"file": str(path), "good_bytes": good, "torn_bytes": len(data) - good},
            )


def _consume_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
