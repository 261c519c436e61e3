"""An attached source whose restored position is past what survived a restart says so and goes on
from the high watermark: it neither re-reads the partition from the start nor waits silently."""

from __future__ import annotations

import logging

import pytest

from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec, encode_batch
from broker.txn.markers import encode_marker
from processors.executor import TopicPartition
from processors.fastdecode import as_records
from processors.sources import LogSource


async def test_a_position_beyond_the_log_end_is_reported_and_resumes_at_the_high_watermark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryLogStore()
    store.create_topic("in", 1)
    await store.append_records("in", [RecordSpec(b"%d" % i) for i in range(3)], partition=0)
    source = LogSource(store, ("in",))

    async def nothing(tps: list[TopicPartition]) -> None:
        return None

    await source.start(nothing, nothing)
    tp = ("in", 0)
    source.seek(tp, 10)  # a checkpoint taken before a crash that lost offsets 3..9
    with caplog.at_level(logging.ERROR, logger="processors.sources"):
        assert await source.fetch(100, 0.01, set()) == []  # not offsets 0..2 again
    await store.append_records("in", [RecordSpec(b"new")], partition=0)
    [(got_tp, records)] = await source.fetch(100, 0.01, set())  # was: nothing until offset 10, 3..9 skipped
    assert got_tp == tp and [(r.offset, r.value) for r in as_records(records)] == [(3, b"new")]
    assert "beyond the end of its partition" in caplog.text and source.positions_lost == 1


async def test_a_partition_ending_in_a_control_batch_is_stepped_over_not_read_forever() -> None:
    """Input written by a transactional producer ends in its commit marker, which holds no record for
    the processor. The source used to stay at the marker: its wait for data there returned at once
    (the data is there), without yielding to the event loop, and ``sluice serve`` hung."""
    store = MemoryLogStore()
    store.create_topic("in", 1)
    data = encode_batch([RecordSpec(b"a"), RecordSpec(b"b")], producer_id=7, producer_epoch=0)
    await store.append("in", 0, data)
    await store.append("in", 0, encode_marker(7, 0, True, timestamp_ms=0))
    source = LogSource(store, ("in",))

    async def nothing(tps: list[TopicPartition]) -> None:
        return None

    await source.start(nothing, nothing)
    [(_, records)] = await source.fetch(100, 0.01, set())
    assert [r.value for r in as_records(records)] == [b"a", b"b"]
    assert await source.fetch(100, 0.01, set()) == []
    assert source.positions[("in", 0)] == 3  # past the marker: the next wait is for new data
