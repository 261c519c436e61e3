"""The narrow storage interface every front door writes through and every reader reads from.

``LogStore`` owns topics; each topic has ``partitions`` ``PartitionLog``s. Two implementations share
all of the logic here and one test suite (``tests/broker/log/test_store_contract.py``):
``MemoryLogStore`` (tests, benchmarks, ``--storage memory``) and ``SegmentLogStore`` (segment files).

Two ends: the *log end offset* is where the next append goes; the *high watermark* is what readers
(Fetch, ListOffsets, processors, HTTP) see. They are equal unless a store shows only durable records
(``SegmentLogStore`` with ``flush=always`` and ``visibility=durable``): then the high watermark moves
when an fsync completes, so nothing a consumer saw (or a processor checkpointed) can vanish in a
power cut. A reader asking for an offset beyond the log end is told so (``OffsetOutOfRangeError``):
after a restart that lost an unsynced tail, its position points at records that no longer exist.

Topic changes are all-or-nothing: ``create_topic`` and ``create_partitions`` check every limit first
(``PartitionLimits``), then open the partitions (no disk work for the segment store: a partition's
directory appears with its first write) and save the metadata; if saving fails, the change is undone
and nothing is left behind.

A ``PartitionLog`` stores Kafka RecordBatch v2 bytes as they came, after checking header and CRC
and rewriting the base offset. ``append`` returns once the batch is as durable as the topic's flush
policy promises (``append_nowait`` + ``wait_durable`` split the same work in two, for callers that
must assign offsets in order but wait together: ``write_mark`` taken right after ``append_nowait``
names exactly those writes, so the wait never grows to cover later ones); ``read`` hands back whole
stored batches for Fetch to send untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from broker.errors import (
    BrokerError,
    CorruptRecordError,
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicError,
)
from broker.log.config import TopicConfig, validate_topic_name
from broker.log.partitioner import StickyPartitioner, partition_for_key
from broker.protocol.records import (
    BatchHeader,
    RecordSpec,
    decode_header,
    encode_batch,
    iter_batches,
    recompress_batches,
    stamp_log_append_time,
    with_base_offset,
)

__all__ = [
    "MAX_PARTITIONS",
    "AppendResult",
    "BatchParts",
    "LogStore",
    "PartitionLimits",
    "PartitionLog",
    "TopicInfo",
    "wait_for_any",
]

log = logging.getLogger("broker.log")

MAX_PARTITIONS = 10_000  # Kafka's controller bound on partitions created by one request
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."  # Kafka's message


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    """Caps on partitions, checked before anything is created.

    ``per_request``: partitions one request may create (CreateTopics over all its topics,
    CreatePartitions, one HTTP create); above it Kafka's controller answers ``POLICY_VIOLATION``.
    ``total``: partitions the store may hold at once (each costs memory and, when used, descriptors);
    a create that would pass it is refused with ``POLICY_VIOLATION`` too.
    """

    per_request: int = MAX_PARTITIONS
    total: int = 50_000

    def check_request(self, requested: int) -> None:
        """Raise ``PolicyViolationError`` when one request asks for more than ``per_request`` partitions."""
        if requested > self.per_request:
            raise PolicyViolationError(
                f"{EXCESSIVE_PARTITIONS} {requested} requested, the limit (storage.max_partitions_per_request) "
                f"is {self.per_request}"
            )


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # ms since the epoch
    log_start_offset: int
    max_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    config: TopicConfig
    created_ms: int
    internal: bool = False


class PartitionLog(ABC):
    """One partition: an append-only sequence of record batches with dense offsets."""

    def __init__(self, topic: str, partition: int, config: TopicConfig) -> None:
        self.topic = topic
        self.partition = partition
        self.config = config
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    # -- what implementations provide -------------------------------------------------

    @property
    @abstractmethod
    def log_start_offset(self) -> int:
        """First offset still stored (retention moves it forward)."""

    @property
    @abstractmethod
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""

    @property
    def high_watermark(self) -> int:
        """Readers see everything below it: the log end, unless the store shows only durable records."""
        return self.log_end_offset

    @property
    @abstractmethod
    def size_bytes(self) -> int:
        """Bytes of stored batches."""

    @abstractmethod
    def _write(self, batches: Sequence[tuple[BatchParts, BatchHeader]]) -> None:
        """Store batches whose base offsets are already assigned (synchronous, no await); each batch is
        the concatenation of its parts (``BatchParts``)."""

    @abstractmethod
    async def _make_durable(self, mark: int | None) -> None:
        """Return once the writes up to ``mark`` (None: everything written so far) are as durable as
        the flush policy says."""

    def write_mark(self) -> int:
        """A token for everything written so far, for ``wait_durable(mark)``: stores that need no
        waiting return 0."""
        return 0

    @abstractmethod
    def read(self, offset: int, max_bytes: int) -> bytes:
        """Stored batches starting with the one holding ``offset``, about ``max_bytes`` long.

        At least one whole batch is returned even when it is larger than ``max_bytes``; nothing at or
        beyond the high watermark is returned (an empty result means ``offset`` is at or past it).
        Raises ``OffsetOutOfRangeError`` when ``offset`` is below the log start or above the log end.
        """

    @abstractmethod
    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Earliest offset whose batch max timestamp is ≥ ``timestamp_ms``; None if there is none."""

    @abstractmethod
    def enforce_retention(self, now_ms: int) -> int:
        """Drop whole segments past retention time or size; returns bytes removed."""

    @abstractmethod
    async def _advance_log_start(self, offset: int) -> None:
        """Make ``offset`` (above the log start, at most the high watermark) the log start offset,
        durably, and drop the stored batches that lie wholly below it."""

    @abstractmethod
    async def flush(self) -> None:
        """Force everything to disk now, whatever the policy."""

    @abstractmethod
    async def close(self) -> None: ...

    def abandon(self) -> None:  # noqa: B027 - optional hook: nothing to release in memory
        """Release a partition that was never used (a create that failed), without waiting."""

    def tail_headers(self, max_bytes: int) -> list[BatchHeader]:
        """Headers of the last stored batches, oldest first, covering at least the last ``max_bytes``
        of the partition (or all of it): what a restart scans to rebuild idempotent-producer state.

        This default reads the whole partition through ``read``; file-backed stores override it to
        read only the tail (headers, no CRC check: stored batches were checked on the way in).
        """
        headers: list[BatchHeader] = []
        offset = self.log_start_offset
        while offset < self.high_watermark:
            data = self.read(offset, 1 << 20)
            for _, header in iter_batches(data, verify=False):
                headers.append(header)
                offset = header.last_offset + 1
            if not data:
                break
        total, keep = 0, len(headers)
        while keep > 0 and total < max_bytes:
            keep -= 1
            total += headers[keep].size
        return headers[keep:]

    async def delete_records(self, before: int) -> int:
        """Kafka's DeleteRecords: raise the log start offset to ``before`` (never lower it), so records
        below it are no longer served. ``before`` must lie in [0, high watermark] (else
        ``OffsetOutOfRangeError``). Returns the log start offset, as durable as the store is."""
        if before < 0 or before > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot delete records of {self.topic}-{self.partition} before offset {before}: "
                f"it is not within [0, {self.high_watermark}] (the high watermark)"
            )
        if before > self.log_start_offset:
            await self._advance_log_start(before)
        return self.log_start_offset

    async def reconfigure(self, config: TopicConfig) -> None:
        """Apply a changed topic config; everything written so far is flushed first, so a switch
        away from ``always`` never weakens what was already acknowledged."""
        await self.flush()
        self.config = config

    # -- shared logic -------------------------------------------------------------------

    async def append(self, data: bytes | bytearray | memoryview) -> AppendResult:
        """Validate one or more batches, assign offsets, store them and wait for durability.

        Offsets are assigned and bytes written without yielding to the event loop, so
        concurrent appends never interleave; they then share one fsync (group commit).
        """
        result = self.append_nowait(data)
        await self._make_durable(self.write_mark())
        return result

    def _check_range(self, offset: int) -> None:
        """Raise OffsetOutOfRangeError unless log start ≤ ``offset`` ≤ log end (for ``read``).

        Like Kafka, an offset between the high watermark and the log end is in range (it reads as
        empty until the high watermark passes it)."""
        if offset < self.log_start_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {self.topic}-{self.partition} is below the log start offset "
                f"{self.log_start_offset} (retention or deletion removed it)"
            )
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {self.topic}-{self.partition} is beyond the log end offset "
                f"{self.log_end_offset}: records at or after {self.log_end_offset} that the reader was at "
                "no longer exist (e.g. an unsynced tail lost in a crash); reset the position"
            )

    async def wait_durable(self, mark: int | None = None) -> None:
        """Return once the writes up to ``mark`` (from ``write_mark``; None: everything written so far)
        are as durable as the topic's flush policy promises: on disk for ``always``; for ``interval``
        and ``os``, which promise nothing per write, at once. Concurrent waiters share one fsync
        (group commit).

        Why the mark: a caller that appends now and waits later (pipelined Produce requests answer in
        order) would otherwise wait for the writes made in between too, one more fsync round each."""
        await self._make_durable(mark)

    def is_durable(self, mark: int) -> bool:
        """True when the writes up to ``mark`` are already as durable as the flush policy promises, so
        ``wait_durable(mark)`` has nothing to wait for (callers that wrote to many partitions then wait
        only where a wait is due, with no task for the others). False when the store cannot tell."""
        return False

    def append_nowait(
        self, data: bytes | bytearray | memoryview, *, verified: bool = False, header: BatchHeader | None = None
    ) -> AppendResult:
        """Validate, assign offsets and write, without waiting for durability. ``verified``: the caller
        has already checked every batch's CRC (Produce's validation), so it is not computed twice.
        ``header``: ``data`` is exactly the one batch this header was read from (Produce's validation
        read it), so it is not decoded again."""
        config = self.config
        if len(data) > config.max_message_bytes:
            raise RecordTooLargeError(
                f"record batch of {len(data)} bytes exceeds max.message.bytes={config.max_message_bytes} "
                f"for {self.topic}-{self.partition}"
            )
        codec = config.recompress_to
        view = memoryview(data if codec is None else recompress_batches(data, codec))
        parsed: list[tuple[int, BatchHeader]]
        if header is not None and codec is None:
            if header.size != len(view):
                raise CorruptRecordError(f"the batch is {len(view)} bytes, its header says {header.size}")
            parsed = [(0, header)]
        else:
            parsed = list(iter_batches(view, verify=not verified))
        next_offset = self.log_end_offset
        stored: list[tuple[BatchParts, BatchHeader]] = []
        max_ts = -1
        now = int(time.time() * 1000)
        append_time = config.message_timestamp_type == "LogAppendTime"
        for pos, header in parsed:
            parts: BatchParts
            if append_time and not header.is_control:
                batch = with_base_offset(view[pos : pos + header.size], next_offset)
                stamp_log_append_time(batch, now)  # message.timestamp.type=LogAppendTime, as Kafka does
                header = decode_header(batch)
                parts = (batch,)
            else:  # the new base offset, then the producer's bytes after it: not copied (it is outside the CRC)
                parts = (_BASE_OFFSET.pack(next_offset), view[pos + 8 : pos + header.size])
            stored.append((parts, _rebased(header, next_offset)))
            next_offset += header.last_offset_delta + 1
            max_ts = max(max_ts, header.max_timestamp)
        base = self.log_end_offset
        self._write(stored)
        self._wake_readers()
        return AppendResult(base, next_offset - 1, now, self.log_start_offset, max_ts)

    async def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Wait until the high watermark passes ``offset`` or ``timeout`` seconds elapse.

        Raises ``OffsetOutOfRangeError`` at once when ``offset`` is beyond the log end: waiting would
        later hand out records after a gap nobody was told about."""
        if self.high_watermark > offset:
            return True
        if offset > self.log_end_offset:
            self._check_range(offset)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (offset, future)
        self._waiters.append(entry)
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for returns the result when a cancellation
            # arrives in the turn the data does, and the cancelled reader (a Fetch, a processor's
            # fetch loop being stopped) would go on as if never cancelled
            async with asyncio.timeout(timeout):
                await future
            return True
        except TimeoutError:
            return self.high_watermark > offset
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _wake_readers(self) -> None:
        if not self._waiters:
            return
        hw = self.high_watermark
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for offset, future in self._waiters:
            if hw > offset:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((offset, future))
        self._waiters = keep


async def wait_for_any(
    positions: Sequence[tuple[PartitionLog, int]], timeout: float, stop: asyncio.Event | None = None
) -> None:
    """Return once any ``(log, offset)`` has data at ``offset``, ``stop`` is set, or ``timeout`` passes.

    For readers that follow several partitions at once (Fetch, SSE streams, attached processors)."""
    if len(positions) == 1 and stop is None:  # the common Fetch case: no tasks to create
        log, offset = positions[0]
        await log.wait_for_data(offset, timeout)
        return
    waits = [asyncio.ensure_future(log.wait_for_data(offset, timeout)) for log, offset in positions]
    if stop is not None:
        waits.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
        for waiter in waits:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await waiter


# A stored batch as the pieces to write one after the other (``os.writev``): its rewritten base offset and
# the rest of the producer's bytes, or the whole batch when it had to be copied (LogAppendTime stamps).
BatchParts = tuple[bytes | bytearray | memoryview, ...]
_BASE_OFFSET = struct.Struct(">q")


def _rebased(header: BatchHeader, base_offset: int) -> BatchHeader:
    return BatchHeader._make((base_offset, *header[1:]))  # base_offset is the first field; _replace is slower


class LogStore(ABC):
    """Topics and their partitions. Subclasses decide where bytes and metadata live."""

    def __init__(
        self,
        *,
        default_config: TopicConfig | None = None,
        default_partitions: int = 1,
        auto_create_topics: bool = True,
        limits: PartitionLimits | None = None,
    ) -> None:
        self.default_config = default_config or TopicConfig()
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self.limits = limits or PartitionLimits()
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, list[PartitionLog]] = {}
        self._deleting: set[str] = set()
        self._sticky = StickyPartitioner()
        self._deletion_listeners: list[Callable[[str], None]] = []

    # -- what implementations provide -------------------------------------------------

    @abstractmethod
    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        """A new, empty partition. Should not touch the disk (the segment store creates files on the
        first write): whatever it does is undone by ``_remove_partition_data`` if the create fails."""

    @abstractmethod
    def _persist_topics(self) -> None:
        """Save topic metadata atomically (no-op in memory)."""

    @abstractmethod
    def _remove_partition_data(self, info: TopicInfo, partition: int) -> None: ...

    async def start(self) -> None:  # noqa: B027 - optional hook, a no-op for the memory store
        """Open existing topics (file-backed stores recover here)."""

    # -- topics --------------------------------------------------------------------------

    @property
    def total_partitions(self) -> int:
        return sum(len(logs) for logs in self._partitions.values())

    def validate_create(self, name: str, partitions: int | None = None) -> int:
        """Every check ``create_topic`` makes, without creating (CreateTopics ``validate_only``);
        returns the partition count the topic would get."""
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        if name in self._deleting:
            raise TopicExistsError(f"topic {name!r} is marked for deletion")
        count = self.default_partitions if partitions is None else partitions
        if count < 1:
            raise InvalidPartitionsError(f"Number of partitions was set to an invalid non-positive value ({count}).")
        self._check_new_partitions(name, count)
        return count

    def _check_new_partitions(self, topic: str, count: int) -> None:
        """The per-request and total caps for ``count`` partitions about to be added to ``topic``."""
        self.limits.check_request(count)
        total = self.total_partitions
        if total + count > self.limits.total:
            raise PolicyViolationError(
                f"adding {count} partitions to {topic!r} would bring the broker to {total + count} "
                f"partitions; the limit (storage.max_partitions) is {self.limits.total}"
            )

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: TopicConfig | None = None,
        *,
        internal: bool = False,
    ) -> TopicInfo:
        """Create a topic, all or nothing: on any failure no trace of it is left, in memory or on disk."""
        count = self.validate_create(name, partitions)
        info = TopicInfo(name, count, config or self.default_config, int(time.time() * 1000), internal)
        logs: list[PartitionLog] = []
        try:
            for p in range(count):
                logs.append(self._open_partition(info, p))
            self._topics[name] = info
            self._partitions[name] = logs
            self._persist_topics()
        except BaseException:
            self._topics.pop(name, None)
            self._partitions.pop(name, None)
            self._undo_partitions(info, logs, range(count))
            raise
        return info

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicInfo:
        """Grow ``name`` to ``total`` partitions, all or nothing (Kafka's CreatePartitions rules)."""
        info = self.topic(name)
        if total < info.partitions:
            raise InvalidPartitionsError(
                f"Topic currently has {info.partitions} partitions, which is higher than the requested {total}."
            )
        if total == info.partitions:
            raise InvalidPartitionsError(f"Topic already has {info.partitions} partitions.")
        self._check_new_partitions(name, total - info.partitions)
        if validate_only:
            return replace(info, partitions=total)
        grown = replace(info, partitions=total)
        logs = self._partitions[name]
        added: list[PartitionLog] = []
        try:
            for p in range(info.partitions, total):
                added.append(self._open_partition(grown, p))
            logs.extend(added)
            self._topics[name] = grown
            self._persist_topics()
        except BaseException:
            del logs[info.partitions :]
            self._topics[name] = info
            self._undo_partitions(grown, added, range(info.partitions, total))
            raise
        return grown

    def _undo_partitions(self, info: TopicInfo, logs: Sequence[PartitionLog], numbers: range) -> None:
        """Best effort cleanup after a failed create: close what was opened, remove what was made."""
        for plog in logs:
            plog.abandon()
        for p in numbers:
            try:
                self._remove_partition_data(info, p)
            except BrokerError as exc:
                log.error("cannot remove a partition of a failed create", extra={
                    "topic": info.name, "partition": p, "error": str(exc)})

    async def alter_topic_config(self, name: str, config: TopicConfig) -> TopicInfo:
        """Change a topic's config in place (retention, segment size, flush policy, ...)."""
        info = replace(self.topic(name), config=config)
        logs = self._partitions[name]
        for plog in logs:
            await plog.reconfigure(config)  # flushes first: a delete may land meanwhile
        if self._partitions.get(name) is not logs:  # deleted (and maybe created again) during the awaits
            raise UnknownTopicError(f"topic {name!r} was deleted while its config was being changed")
        self._topics[name] = info
        self._persist_topics()
        return info

    def ensure_topic(self, name: str) -> TopicInfo:
        """The topic, created with defaults if auto-creation is on."""
        info = self._topics.get(name)
        if info is not None:
            return info
        if not self.auto_create_topics:
            raise UnknownTopicError(f"unknown topic {name!r} (auto-creation is off)")
        return self.create_topic(name)

    async def delete_topic(self, name: str) -> None:
        """Remove a topic: first from memory and the metadata file (so concurrent deletes, appends and
        lookups see it gone at once), then close its partitions and delete their files."""
        info = self.topic(name)
        logs = self._partitions.pop(name)
        del self._topics[name]
        try:
            self._persist_topics()
        except BaseException:
            self._topics[name] = info
            self._partitions[name] = logs
            raise
        for listener in self._deletion_listeners:  # the topic is gone for everyone from here on
            listener(name)
        self._deleting.add(name)
        try:
            for plog in logs:
                try:
                    await plog.close()
                except BrokerError as exc:  # a failed partition: its data is being deleted anyway
                    log.warning("partition of a deleted topic did not close cleanly", extra={
                        "topic": name, "partition": plog.partition, "error": str(exc)})
            for p in range(info.partitions):
                self._remove_partition_data(info, p)
        finally:
            self._deleting.discard(name)

    def subscribe_deletions(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` after every topic deletion, whoever asked for it (Kafka, HTTP, CLI),
        so that state kept per topic elsewhere (idempotent-producer sequences) goes with the topic."""
        self._deletion_listeners.append(listener)

    def topic(self, name: str) -> TopicInfo:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicError(f"unknown topic {name!r}") from None

    def list_topics(self, *, include_internal: bool = False) -> list[TopicInfo]:
        return [t for t in self._topics.values() if include_internal or not t.internal]

    def has_topic(self, name: str) -> bool:
        return name in self._topics

    def partition(self, topic: str, partition: int) -> PartitionLog:
        logs = self._partitions.get(topic)
        if logs is None:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        if not 0 <= partition < len(logs):
            raise UnknownTopicError(f"topic {topic!r} has no partition {partition} (it has {len(logs)})")
        return logs[partition]

    def partitions(self, topic: str) -> list[PartitionLog]:
        self.topic(topic)
        return list(self._partitions[topic])

    def partition_for(self, topic: str, key: bytes | None) -> int:
        """murmur2 for keyed records (Kafka's choice), round-robin for keyless ones."""
        count = self.topic(topic).partitions
        if key is None:
            return self._sticky.next_partition(count)
        return partition_for_key(key, count)

    # -- appends --------------------------------------------------------------------------

    async def append(self, topic: str, partition: int, batch: bytes | bytearray | memoryview) -> AppendResult:
        return await self.partition(topic, partition).append(batch)

    async def append_records(
        self, topic: str, records: Sequence[RecordSpec], *, key: bytes | None = None, partition: int | None = None
    ) -> AppendResult:
        """Encode ``records`` into one batch and append it; the partition comes from ``key``
        (or the first record's key) unless given. Auto-creates the topic when allowed."""
        self.ensure_topic(topic)
        if partition is None:
            partition = self.partition_for(topic, key if key is not None else records[0].key)
        return await self.append(topic, partition, encode_batch(records))

    def enforce_retention(self, now_ms: int | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return sum(plog.enforce_retention(now) for logs in self._partitions.values() for plog in logs)

    async def flush(self) -> None:
        for logs in list(self._partitions.values()):
            for plog in logs:
                await plog.flush()

    async def close(self) -> None:
        for logs in list(self._partitions.values()):
            for plog in logs:
                await plog.close()
