"""Shared helpers for ingest tests: a deliberately slow log (the slow disk) and record readers."""

from __future__ import annotations

import asyncio
from typing import Unpack

from broker.log.api import LogStore, TopicInfo
from broker.log.memory import MemoryLogStore, MemoryPartitionLog
from broker.log.partition_log import AppendResult, PartitionLog
from broker.protocol.records import Record, decode_all
from tests.broker.log.helpers import LogStoreOptions


class SlowPartitionLog(MemoryPartitionLog):
    """A partition whose durability wait takes ``delay`` seconds, like a slow fsync."""

    delay = 0.0

    async def _make_durable(self, mark: int | None) -> None:
        await asyncio.sleep(self.delay)


class SlowLogStore(MemoryLogStore):
    """The real in-memory store with a slow disk under it."""

    def __init__(self, delay: float, **kwargs: Unpack[LogStoreOptions]) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.appends = 0

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        log = SlowPartitionLog(info.name, partition, info.config)
        log.delay = self.delay
        return log

    async def append(self, topic: str, partition: int, batch: bytes | bytearray | memoryview) -> AppendResult:
        self.appends += 1
        return await super().append(topic, partition, batch)


def read_all(store: LogStore, topic: str) -> dict[int, list[Record]]:
    """Every record of every partition of ``topic`` (empty dict when the topic does not exist)."""
    if not store.has_topic(topic):
        return {}
    out: dict[int, list[Record]] = {}
    for p, log in enumerate(store.partitions(topic)):
        out[p] = decode_all(log.read(log.log_start_offset, 1 << 40))
    return out


def records(store: LogStore, topic: str) -> list[Record]:
    return [r for recs in read_all(store, topic).values() for r in recs]


class GatedPartitionLog(MemoryPartitionLog):
    """A partition whose durability waits while ``gate`` is closed (a stalled disk), then ``delay``."""

    gate: asyncio.Event
    delay = 0.0

    async def _make_durable(self, mark: int | None) -> None:
        await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)


class GatedLogStore(MemoryLogStore):
    def __init__(self, delay: float = 0.0, **kwargs: Unpack[LogStoreOptions]) -> None:
        super().__init__(**kwargs)
        self.gate = asyncio.Event()
        self.delay = delay

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        log = GatedPartitionLog(info.name, partition, info.config)
        log.gate = self.gate
        log.delay = self.delay
        return log
