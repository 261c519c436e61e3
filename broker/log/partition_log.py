"""One partition of the log: ``PartitionLog``, the interface every store's partitions implement, with
the logic they share (checking and appending RecordBatches, offset ranges, waking waiting readers),
and ``wait_for_any`` for readers that follow several partitions. ``LogStore`` (api.py) owns topics
and their partitions.

Two ends: the *log end offset* is where the next append goes; the *high watermark* is what readers
(Fetch, ListOffsets, processors, HTTP) see. They are equal unless a store shows only durable records
(``SegmentLogStore`` with ``flush=always`` and ``visibility=durable``): then the high watermark moves
when an fsync completes, so nothing a consumer saw (or a processor checkpointed) can vanish in a
power cut. A reader asking for an offset beyond the log end is told so (``OffsetOutOfRangeError``):
after a restart that lost an unsynced tail, its position points at records that no longer exist.

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
import struct
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from broker.errors import CorruptRecordError, OffsetOutOfRangeError, RecordTooLargeError
from broker.log.config import TopicConfig
from broker.protocol.records import (
    BatchHeader,
    decode_header,
    iter_batches,
    recompress_batches,
    stamp_log_append_time,
    with_base_offset,
)

__all__ = ["AppendResult", "BatchParts", "PartitionLog", "wait_for_any"]


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # ms since the epoch
    log_start_offset: int
    max_timestamp: int = -1


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
