"""How ``IngestSink.ingest_lines`` appends a read's partitions (``line_writes.LineWrite``).

The batches of every partition are written in turn without a task each, and the call waits for every
partition the flush policy makes it wait for; a storage failure in one partition is raised (nothing
acknowledged, nothing dead-lettered), a batch the log refuses becomes dead letters for its lines only.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker.errors import StorageError
from broker.log.api import TopicInfo
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.memory import MemoryLogStore, MemoryPartitionLog
from broker.log.partition_log import AppendResult, PartitionLog
from broker.log.segment import SegmentLogStore
from broker.protocol.records import BatchHeader
from ingest.errors import SinkError
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults, SourceRef
from ingest.sink import IngestSink
from tests.ingest.conftest import read_all

SOURCE = SourceRef("tcp", "default", "json")
ARRIVAL = 1_700_000_000_000


def _lines(count: int) -> list[bytes]:
    return [json.dumps({"device_id": f"dev-{i}", "v": i}).encode() for i in range(count)]


def _partitions_of(store: MemoryLogStore | SegmentLogStore, topic: str) -> set[int]:
    return {p for p, recs in read_all(store, topic).items() if recs}


class _GatedPartition(MemoryPartitionLog):
    """A partition whose durability waits for its own gate (a stalled disk under this partition)."""

    gate: asyncio.Event

    async def _make_durable(self, mark: int | None) -> None:
        await self.gate.wait()


class _GatedPerPartition(MemoryLogStore):
    def __init__(self) -> None:
        super().__init__(default_partitions=3)
        self.gates = [asyncio.Event() for _ in range(3)]

    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        log = _GatedPartition(info.name, partition, info.config)
        log.gate = self.gates[partition]
        return log


@pytest.mark.parametrize("stalled", range(3))
async def test_waits_for_every_partition_it_wrote(stalled: int) -> None:
    store = _GatedPerPartition()
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    for partition, gate in enumerate(store.gates):
        if partition != stalled:
            gate.set()
    write = asyncio.create_task(sink.ingest_lines(SOURCE, _lines(30), ARRIVAL))
    for _ in range(20):  # let the write run as far as it can: only the stalled partition's wait blocks it
        await asyncio.sleep(0)
    assert _partitions_of(store, "tcp") == {0, 1, 2}
    assert not write.done()
    store.gates[stalled].set()
    await write
    assert sink.messages_written == 30


class _BrokenPartition(MemoryPartitionLog):
    """A partition on a disk that refuses every write."""

    def append_nowait(
        self, data: bytes | bytearray | memoryview, *, verified: bool = False, header: BatchHeader | None = None
    ) -> AppendResult:
        raise StorageError(f"cannot append to {self.topic}-{self.partition}: No space left on device")


class _OnePartitionBroken(MemoryLogStore):
    def _open_partition(self, info: TopicInfo, partition: int) -> PartitionLog:
        if info.name == "tcp" and partition == 1:
            return _BrokenPartition(info.name, partition, info.config)
        return super()._open_partition(info, partition)


async def test_a_storage_failure_in_one_partition_is_raised_not_dead_lettered() -> None:
    store = _OnePartitionBroken(default_partitions=3)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    with pytest.raises(SinkError, match="No space left on device"):
        await sink.ingest_lines(SOURCE, _lines(30), ARRIVAL)
    assert sink.dead_lettered == 0 and sink.storage_failures == 1
    assert not store.has_topic("_dead_letters")
    assert _partitions_of(store, "tcp") == {0, 2}  # stored before the failure: sent again, at least once


async def test_a_refused_batch_dead_letters_only_its_own_lines() -> None:
    store = MemoryLogStore(default_partitions=3, default_config=TopicConfig(max_message_bytes=3000))
    store.create_topic("_dead_letters", 1, TopicConfig(max_message_bytes=1 << 20))
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    big = json.dumps({"device_id": "dev-0", "x": "x" * 4000}).encode()  # dev-0's partition gets too big a batch
    lines = [*_lines(30), big]
    await sink.ingest_lines(SOURCE, lines, ARRIVAL)
    stored = read_all(store, "tcp")
    dead = [r for recs in read_all(store, "_dead_letters").values() for r in recs]
    refused = {r.value for r in dead}
    assert big in refused and all((dict(r.headers)["reason"] or b"").startswith(b"log refused append") for r in dead)
    kept = {r.value for recs in stored.values() for r in recs}
    assert kept | refused == set(lines) and not kept & refused
    assert kept and sink.dead_lettered == len(refused) < len(lines)


@pytest.mark.parametrize("flush", [FlushPolicy.ALWAYS, FlushPolicy.OS])
async def test_segment_partitions_say_when_a_write_is_durable(tmp_path: Path, flush: FlushPolicy) -> None:
    store = SegmentLogStore(tmp_path, default_config=TopicConfig(flush=flush))
    await store.start()
    try:
        store.ensure_topic("t")
        plog = store.partition("t", 0)
        plog.append_nowait(_batch())
        mark = plog.write_mark()
        assert plog.is_durable(mark) is (flush is not FlushPolicy.ALWAYS)  # flush=os promises nothing per write
        await plog.wait_durable(mark)
        assert plog.is_durable(mark)
    finally:
        await store.close()


def test_a_store_that_cannot_tell_says_not_durable() -> None:
    assert not MemoryPartitionLog("t", 0, TopicConfig()).is_durable(0)


def _batch() -> bytes:
    from broker.protocol.records import encode_record_tuples

    return encode_record_tuples([(b"v", b"k", (), ARRIVAL)])
