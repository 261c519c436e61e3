"""In-memory LogStore: the same contract as the segment store, nothing on disk.

Used by tests and benchmarks, and by ``sluice serve --storage memory``. Durability is whatever the
process lives for; flush policies are accepted and have nothing to wait for.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from broker.log.api import LogStore, TopicInfo
from broker.log.config import TopicConfig
from broker.log.partition_log import BatchParts, PartitionLog
from broker.protocol.records import BatchHeader, decode_header

__all__ = ["MemoryLogStore", "MemoryPartitionLog"]


class MemoryPartitionLog(PartitionLog):
    def __init__(self, topic: str, partition: int, config: TopicConfig) -> None:
        super().__init__(topic, partition, config)
        self._batches: list[bytes] = []
        self._bases: list[int] = []  # base offset of each batch, ascending
        self._max_ts: list[int] = []  # running max of batch max timestamps, for time lookups
        self._append_ms: list[int] = []
        self._start = 0
        self._end = 0
        self._bytes = 0

    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def log_end_offset(self) -> int:
        return self._end

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def _write(self, batches: Sequence[tuple[BatchParts, BatchHeader]]) -> None:
        import time

        now = int(time.time() * 1000)
        for parts, header in batches:
            data = b"".join(parts)
            self._batches.append(data)
            self._bases.append(header.base_offset)
            previous = self._max_ts[-1] if self._max_ts else -1
            self._max_ts.append(max(previous, header.max_timestamp))
            self._append_ms.append(now)
            self._end = header.last_offset + 1
            self._bytes += len(data)

    async def _make_durable(self, mark: int | None) -> None:
        return None

    def read(self, offset: int, max_bytes: int) -> bytes:
        self._check_range(offset)
        if offset == self._end:
            return b""
        index = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        out = bytearray()
        while index < len(self._batches):
            batch = self._batches[index]
            if out and len(out) + len(batch) > max_bytes:
                break
            out += batch
            index += 1
        return bytes(out)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        index = bisect.bisect_left(self._max_ts, timestamp_ms)
        if index >= len(self._bases):
            return None
        return max(self._bases[index], self._start)

    def enforce_retention(self, now_ms: int) -> int:
        removed = 0
        if not self.config.delete:
            return 0  # cleanup.policy=compact: never trimmed by time or size
        retention_ms = self.config.retention_ms
        retention_bytes = self.config.retention_bytes
        # Keep the newest batch so the high watermark stays anchored (like Kafka's active segment).
        while len(self._batches) > 1:
            too_old = retention_ms >= 0 and now_ms - self._append_ms[0] > retention_ms
            too_big = retention_bytes >= 0 and self._bytes > retention_bytes
            if not (too_old or too_big):
                break
            size = len(self._batches[0])
            del self._batches[0], self._bases[0], self._max_ts[0], self._append_ms[0]
            self._bytes -= size
            removed += size
            self._start = max(self._start, self._bases[0])
        return removed

    async def _advance_log_start(self, offset: int) -> None:
        self._start = offset
        # Drop the batches that end at or below it (the next one starts at or below ``offset``).
        while len(self._bases) > 1 and self._bases[1] <= offset:
            self._bytes -= len(self._batches[0])
            del self._batches[0], self._bases[0], self._max_ts[0], self._append_ms[0]
        if self._bases and offset >= self._end:  # everything deleted: nothing left to anchor
            for column in (self._batches, self._bases, self._max_ts, self._append_ms):
                column.clear()
            self._bytes = 0

    # -- compaction hooks (broker/log/cleaner.py) ---------------------------------------------

    def cleanable_batches(self, now_ms: int, min_lag_ms: int) -> list[tuple[bytes, int]]:
        """``(batch, append time)`` of the stored batches old enough to clean, oldest first; never the
        newest batch (the memory store's "active segment")."""
        out: list[tuple[bytes, int]] = []
        for batch, appended in zip(self._batches[:-1], self._append_ms[:-1], strict=True):
            if now_ms - appended < min_lag_ms:
                break
            out.append((batch, appended))
        return out

    def replace_cleaned(self, first: bytes, count: int, cleaned: list[tuple[bytes, int, int]]) -> bool:
        """Replace the ``count`` oldest batches (the first of which must still be ``first``) with
        ``cleaned`` ``(batch, base offset, append time)``; False when retention moved the start meanwhile."""
        if not self._batches or self._batches[0] is not first or len(self._batches) <= count:
            return False
        removed = sum(len(b) for b in self._batches[:count])
        self._batches[:count] = [b for b, _, _ in cleaned]
        self._bases[:count] = [base for _, base, _ in cleaned]
        self._append_ms[:count] = [appended for _, _, appended in cleaned]
        self._bytes += sum(len(b) for b, _, _ in cleaned) - removed
        running = -1
        for i, batch in enumerate(self._batches):  # the running max, recomputed over the new batches
            running = max(running, decode_header(batch).max_timestamp)
            self._max_ts[i] = running
        del self._max_ts[len(self._batches):]
        return True

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None


class MemoryLogStore(LogStore):
    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        return MemoryPartitionLog(info.name, partition, info.config)

    def _persist_topics(self) -> None:
        return None

    def _remove_partition_data(self, info: TopicInfo, partition: int) -> None:
        return None
