"""Where a runner reads from and writes to.

``Source``: an assignment of topic-partitions, ``seek``, and ``fetch`` of decoded records with the
offsets after them. ``Sink``: ``write`` output records, ``flush`` until they are durable.
``LogSource``/``LogSink`` are the attached versions: they read partitions of a ``LogStore`` in the
same process (``PartitionLog.read`` / ``wait_for_data``) and append through the store. The Kafka
versions (a consumer-group member and a producer) live in ``processors.kafka_source`` and
``processors.kafka``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from broker.errors import BrokerError, OffsetOutOfRangeError
from broker.log.api import LogStore
from broker.log.partition_log import PartitionLog, wait_for_any
from broker.protocol.records import RecordSpec, split_complete_batches
from processors.errors import SourceError
from processors.executor import OutRecord, TopicPartition
from processors.fastdecode import Fetched, next_offset, stored_from

__all__ = ["AssignmentListener", "LogSink", "LogSource", "Sink", "Source"]

logger = logging.getLogger("processors.sources")

AssignmentListener = Callable[[list[TopicPartition]], Awaitable[None]]


class Source(Protocol):
    async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                    on_lost: AssignmentListener | None = None) -> None:
        """``on_lost``: partitions the group gave to others while this member was out of it (only a
        group member's source calls it; without it such partitions are reported revoked)."""
    async def stop(self) -> None: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                    ) -> Sequence[tuple[TopicPartition, Fetched]]:
        """Records of some assigned, unpaused partitions: record objects, or (attached) ``StoredRecords``."""
    def end_offset(self, tp: TopicPartition) -> int | None: ...
    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...


class Sink(Protocol):
    async def write(self, records: list[OutRecord]) -> None: ...
    async def flush(self) -> None: ...
    async def abort(self) -> None:
        """Take back what was written since the last commit, where a sink can (a transaction)."""


class LogSource:
    """Every partition of the source topics of an in-process store (created if missing)."""

    def __init__(self, store: LogStore, topics: tuple[str, ...], *, max_bytes: int = 1024 * 1024) -> None:
        self.store = store
        self.topics = topics
        self.max_bytes = max_bytes
        self.positions: dict[TopicPartition, int] = {}
        self.positions_lost = 0  # positions found beyond a partition's log end (records lost in a crash)
        self._rr = 0

    async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                    on_lost: AssignmentListener | None = None) -> None:
        tps: list[TopicPartition] = []
        try:
            for topic in self.topics:
                self.store.ensure_topic(topic)
                tps += [(topic, log.partition) for log in self.store.partitions(topic)]
        except BrokerError as exc:
            raise SourceError(f"cannot open source topics {self.topics}: {exc}") from exc
        for tp in tps:
            self.positions[tp] = self.store.partition(*tp).log_start_offset
        await on_assigned(tps)

    async def stop(self) -> None:
        return None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    def end_offset(self, tp: TopicPartition) -> int | None:
        return self.store.partition(*tp).high_watermark

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        return None  # attached: the checkpoint itself is the commit

    def _read(self, tp: TopicPartition, max_records: int) -> Fetched:
        log = self.store.partition(*tp)
        offset = self.positions[tp]
        if offset < log.log_start_offset:  # retention removed what we had not read: resume at the start
            offset = log.log_start_offset
        elif offset > log.log_end_offset:
            # The checkpoint points past what survived a restart (an unsynced tail lost in a power cut):
            # say so, and go on with what is appended from now on rather than re-reading the partition.
            self.positions_lost += 1
            logger.error("source position is beyond the end of its partition: records the processor had read "
                       "did not survive a restart; resuming at the high watermark", extra={
                           "topic": tp[0], "partition": tp[1], "position": offset,
                           "log_end_offset": log.log_end_offset, "resume_at": log.high_watermark})
            offset = self.positions[tp] = log.high_watermark
        try:
            data, skip_to = self._stored(log, offset)
        except OffsetOutOfRangeError:
            data, skip_to = self._stored(log, log.log_start_offset)
        out = stored_from(data, offset, max_records)  # not decoded: the executor reads the values in place
        if out:
            self.positions[tp] = next_offset(out)
        elif data or skip_to > offset:
            # nothing for the processor in what was read (control batches, aborted transactions): step
            # over it, or the wait below would return at once for data that never decodes
            self.positions[tp] = max(skip_to, _end_of(data, offset))
        return out

    def _stored(self, log: PartitionLog, offset: int) -> tuple[bytes, int]:
        """The stored batches to decode from ``offset``, and where to go on when none of them gives a
        record (the offset after every batch looked at, if more than ``data`` covers)."""
        return log.read(offset, self.max_bytes), offset

    def _wait_at(self, tp: TopicPartition) -> int:
        """The offset whose arrival means there may be something new to read in ``tp``."""
        return self.positions[tp]

    async def fetch(self, max_records: int, timeout: float, paused: set[TopicPartition]
                    ) -> list[tuple[TopicPartition, Fetched]]:
        tps = [tp for tp in self.positions if tp not in paused]
        if not tps:
            await asyncio.sleep(min(timeout, 0.05))
            return []
        self._rr = (self._rr + 1) % len(tps)
        order = tps[self._rr :] + tps[: self._rr]
        out: list[tuple[TopicPartition, Fetched]] = []
        budget = max_records
        for tp in order:
            records = self._read(tp, budget)
            if records:
                out.append((tp, records))
                budget -= len(records)
                if budget <= 0:
                    break
        if not out:
            await wait_for_any([(self.store.partition(*tp), self._wait_at(tp)) for tp in tps], timeout)
        return out


def _end_of(data: bytes, offset: int) -> int:
    headers, _ = split_complete_batches(data)
    return headers[-1].last_offset + 1 if headers else offset


class LogSink:
    """Appends output records to topics of the in-process store (key-partitioned, one batch per
    partition per write)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    async def write(self, records: list[OutRecord]) -> None:
        groups: dict[TopicPartition, list[RecordSpec]] = defaultdict(list)
        try:
            for r in records:
                self.store.ensure_topic(r.topic)
                p = self.store.partition_for(r.topic, r.key) if r.partition is None else r.partition
                groups[(r.topic, p)].append(RecordSpec(r.value, r.key, r.headers, r.timestamp))
            for (topic, p), specs in groups.items():
                for i in range(0, len(specs), 5_000):
                    await self.store.append_records(topic, specs[i : i + 5_000], partition=p)
        except BrokerError as exc:
            raise SourceError(f"cannot append results: {exc}") from exc

    async def flush(self) -> None:
        return None  # appends return once durable under the topic's flush policy

    async def abort(self) -> None:
        return None  # at-least-once: nothing to take back
