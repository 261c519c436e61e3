"""The narrow storage interface every front door writes through and every reader reads from.

``LogStore`` owns topics; each topic has ``partitions`` ``PartitionLog``s. Two implementations share
all of the logic here and one test suite (``tests/broker/log/test_store_contract.py``):
``MemoryLogStore`` (tests, benchmarks, ``--storage memory``) and ``SegmentLogStore`` (segment files).

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
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace

from broker.errors import (
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicError,
)
from broker.log.config import TopicConfig, validate_topic_name
from broker.log.partitioner import StickyPartitioner, partition_for_key
from broker.protocol.records import (
    BatchHeader,
    RecordSpec,
    encode_batch,
    iter_batches,
    recompress_batches,
    with_base_offset,
)

__all__ = ["MAX_PARTITIONS", "AppendResult", "LogStore", "PartitionLog", "TopicInfo", "wait_for_any"]

MAX_PARTITIONS = 10_000


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
    def high_watermark(self) -> int:
        """The offset the next record will get; readers see everything below it."""

    @property
    @abstractmethod
    def size_bytes(self) -> int:
        """Bytes of stored batches."""

    @abstractmethod
    def _write(self, batches: Sequence[tuple[bytearray, BatchHeader]]) -> None:
        """Store batches whose base offsets are already assigned (synchronous, no await)."""

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

        At least one whole batch is returned even when it is larger than ``max_bytes``;
        an empty result means ``offset`` is at (or past) the high watermark.
        Raises ``OffsetOutOfRangeError`` when ``offset`` is below the log start or above the end.
        """

    @abstractmethod
    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Earliest offset whose batch max timestamp is ≥ ``timestamp_ms``; None if there is none."""

    @abstractmethod
    def enforce_retention(self, now_ms: int) -> int:
        """Drop whole segments past retention time or size; returns bytes removed."""

    @abstractmethod
    async def flush(self) -> None:
        """Force everything to disk now, whatever the policy."""

    @abstractmethod
    async def close(self) -> None: ...

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
        """Raise OffsetOutOfRangeError unless log start ≤ ``offset`` ≤ high watermark (for ``read``)."""
        if offset < self.log_start_offset or offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.high_watermark}] "
                f"for {self.topic}-{self.partition}"
            )

    async def wait_durable(self, mark: int | None = None) -> None:
        """Return once the writes up to ``mark`` (from ``write_mark``; None: everything written so far)
        are as durable as the topic's flush policy promises: on disk for ``always``; for ``interval``
        and ``os``, which promise nothing per write, at once. Concurrent waiters share one fsync
        (group commit).

        Why the mark: a caller that appends now and waits later (pipelined Produce requests answer in
        order) would otherwise wait for the writes made in between too, one more fsync round each."""
        await self._make_durable(mark)

    def append_nowait(self, data: bytes | bytearray | memoryview) -> AppendResult:
        """Validate, assign offsets and write, without waiting for durability."""
        if len(data) > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"record batch of {len(data)} bytes exceeds max.message.bytes={self.config.max_message_bytes} "
                f"for {self.topic}-{self.partition}"
            )
        codec = self.config.recompress_to
        view = memoryview(data if codec is None else recompress_batches(data, codec))
        parsed = list(iter_batches(view))
        next_offset = self.high_watermark
        stored: list[tuple[bytearray, BatchHeader]] = []
        max_ts = -1
        for pos, header in parsed:
            batch = with_base_offset(view[pos : pos + header.size], next_offset)
            stored.append((batch, _rebased(header, next_offset)))
            next_offset += header.last_offset_delta + 1
            max_ts = max(max_ts, header.max_timestamp)
        base = self.high_watermark
        self._write(stored)
        self._wake_readers()
        return AppendResult(base, next_offset - 1, int(time.time() * 1000), self.log_start_offset, max_ts)

    async def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Wait until the high watermark passes ``offset`` or ``timeout`` seconds elapse."""
        if self.high_watermark > offset:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (offset, future)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(future, timeout)
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


def _rebased(header: BatchHeader, base_offset: int) -> BatchHeader:
    return replace(header, base_offset=base_offset)


class LogStore(ABC):
    """Topics and their partitions. Subclasses decide where bytes and metadata live."""

    def __init__(
        self,
        *,
        default_config: TopicConfig | None = None,
        default_partitions: int = 1,
        auto_create_topics: bool = True,
    ) -> None:
        self.default_config = default_config or TopicConfig()
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, list[PartitionLog]] = {}
        self._sticky = StickyPartitioner()

    # -- what implementations provide -------------------------------------------------

    @abstractmethod
    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog: ...

    @abstractmethod
    def _persist_topics(self) -> None:
        """Save topic metadata (no-op in memory)."""

    @abstractmethod
    def _remove_partition_data(self, info: TopicInfo, partition: int) -> None: ...

    async def start(self) -> None:  # noqa: B027 - optional hook, a no-op for the memory store
        """Open existing topics (file-backed stores recover here)."""

    # -- topics --------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: TopicConfig | None = None,
        *,
        internal: bool = False,
    ) -> TopicInfo:
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        count = self.default_partitions if partitions is None else partitions
        if not 1 <= count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"partition count must be between 1 and {MAX_PARTITIONS}, got {count}")
        info = TopicInfo(name, count, config or self.default_config, int(time.time() * 1000), internal)
        self._partitions[name] = [self._open_partition(info, p) for p in range(count)]
        self._topics[name] = info
        self._persist_topics()
        return info

    async def alter_topic_config(self, name: str, config: TopicConfig) -> TopicInfo:
        """Change a topic's config in place (retention, segment size, flush policy, ...)."""
        info = replace(self.topic(name), config=config)
        for log in self._partitions[name]:
            await log.reconfigure(config)
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
        info = self.topic(name)
        for log in self._partitions.pop(name):
            await log.close()
        del self._topics[name]
        for p in range(info.partitions):
            self._remove_partition_data(info, p)
        self._persist_topics()

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
        return sum(log.enforce_retention(now) for logs in self._partitions.values() for log in logs)

    async def flush(self) -> None:
        for logs in self._partitions.values():
            for log in logs:
                await log.flush()

    async def close(self) -> None:
        for logs in self._partitions.values():
            for log in logs:
                await log.close()
