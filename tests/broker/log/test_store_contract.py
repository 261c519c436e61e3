"""The LogStore contract: every implementation must pass all of these."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.errors import (
    CorruptRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicError,
    UnsupportedMagicError,
)
from broker.log.api import LogStore
from broker.log.config import FlushPolicy, TopicConfig
from broker.protocol.records import RecordSpec, decode_all, encode_batch, unpack_header
from tests.broker.log.conftest import STORE_FACTORIES


def batch(*values: bytes, ts: int = 1_000) -> bytes:
    return encode_batch([RecordSpec(v) for v in values], timestamp=ts)


async def test_append_assigns_dense_offsets_and_reads_back(store: LogStore) -> None:
    store.create_topic("t", 2)
    first = await store.append("t", 0, batch(b"a", b"b"))
    second = await store.append("t", 0, batch(b"c"))
    assert (first.base_offset, first.last_offset) == (0, 1)
    assert (second.base_offset, second.last_offset) == (2, 2)
    log = store.partition("t", 0)
    assert log.high_watermark == 3
    records = decode_all(log.read(0, 1 << 20))
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert store.partition("t", 1).high_watermark == 0


async def test_read_starts_at_the_batch_holding_the_offset(store: LogStore) -> None:
    store.create_topic("t", 1)
    await store.append("t", 0, batch(b"a", b"b", b"c"))
    await store.append("t", 0, batch(b"d"))
    records = decode_all(store.partition("t", 0).read(1, 1 << 20))
    assert [r.offset for r in records] == [0, 1, 2, 3]  # whole batches, as Kafka returns them
    assert [r.offset for r in decode_all(store.partition("t", 0).read(3, 1 << 20))] == [3]


async def test_read_returns_at_least_one_batch_even_above_max_bytes(store: LogStore) -> None:
    store.create_topic("t", 1)
    await store.append("t", 0, batch(b"x" * 5000))
    await store.append("t", 0, batch(b"y"))
    data = store.partition("t", 0).read(0, 10)
    assert [r.value for r in decode_all(data)] == [b"x" * 5000]


async def test_read_at_end_is_empty_and_beyond_is_out_of_range(store: LogStore) -> None:
    store.create_topic("t", 1)
    await store.append("t", 0, batch(b"a"))
    log = store.partition("t", 0)
    assert log.read(1, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)


async def test_offset_for_timestamp(store: LogStore) -> None:
    store.create_topic("t", 1)
    for i, ts in enumerate([1_000, 2_000, 3_000]):
        await store.append("t", 0, batch(str(i).encode(), ts=ts))
    log = store.partition("t", 0)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(2_000) == 1
    assert log.offset_for_timestamp(2_500) == 2
    assert log.offset_for_timestamp(9_999) is None


async def test_corrupt_batch_is_rejected_and_stored_data_is_intact(store: LogStore) -> None:
    store.create_topic("t", 1)
    await store.append("t", 0, batch(b"good"))
    bad = bytearray(batch(b"bad"))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        await store.append("t", 0, bytes(bad))
    wrong_magic = bytearray(batch(b"old"))
    wrong_magic[16] = 1
    with pytest.raises(UnsupportedMagicError):
        await store.append("t", 0, bytes(wrong_magic))
    with pytest.raises(CorruptRecordError):
        await store.append("t", 0, batch(b"cut")[:30])
    log = store.partition("t", 0)
    assert log.high_watermark == 1
    assert [r.value for r in decode_all(log.read(0, 1 << 20))] == [b"good"]


async def test_oversized_batch_is_rejected(store: LogStore) -> None:
    store.create_topic("small", 1, TopicConfig(max_message_bytes=1000))
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        await store.append("small", 0, batch(b"x" * 2000))
    assert store.partition("small", 0).high_watermark == 0


async def test_topic_admin_and_errors(store: LogStore) -> None:
    store.create_topic("a.b_c-1", 3)
    assert [t.name for t in store.list_topics()] == ["a.b_c-1"]
    assert store.topic("a.b_c-1").partitions == 3
    with pytest.raises(TopicExistsError):
        store.create_topic("a.b_c-1", 1)
    for bad in ["", ".", "..", "has space", "x" * 250, "slash/no"]:
        with pytest.raises(InvalidTopicError):
            store.create_topic(bad, 1)
    with pytest.raises(UnknownTopicError):
        store.partition("missing", 0)
    with pytest.raises(UnknownTopicError):
        store.partition("a.b_c-1", 3)
    await store.delete_topic("a.b_c-1")
    assert store.list_topics() == []
    with pytest.raises(UnknownTopicError):
        await store.delete_topic("a.b_c-1")


async def test_keyed_records_land_in_murmur2_partitions(store: LogStore) -> None:
    store.create_topic("k", 6)
    result = await store.append_records("k", [RecordSpec(b"v", key=b"foobar")])
    # (murmur2(b"foobar") & 0x7fffffff) % 6, computed by Kafka's Java partitioner
    assert store.partition("k", (-790332482 & 0x7FFFFFFF) % 6).high_watermark == result.last_offset + 1


async def test_concurrent_appends_get_distinct_offsets(store: LogStore) -> None:
    store.create_topic("t", 1)
    results = await asyncio.gather(*(store.append("t", 0, batch(str(i).encode())) for i in range(50)))
    assert sorted(r.base_offset for r in results) == list(range(50))


async def test_wait_for_data_wakes_on_append(store: LogStore) -> None:
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    waiter = asyncio.create_task(log.wait_for_data(0, timeout=5))
    await asyncio.sleep(0)
    assert not waiter.done()
    await store.append("t", 0, batch(b"x"))
    assert await waiter is True
    assert await log.wait_for_data(1, timeout=0.01) is False


async def test_a_cancellation_that_meets_new_data_is_not_swallowed(tmp_path: Path) -> None:
    """A reader cancelled in the same loop turn as data arrives must end cancelled (Python 3.11's
    asyncio.wait_for returned the result instead: a Fetch or processor loop being stopped went on, and
    whoever waited for it to end waited forever). ``wait_for_data`` belongs to the base class; the memory
    store is the one whose append wakes readers without yielding, which lines the two up."""
    store = STORE_FACTORIES["memory"](tmp_path, default_config=TopicConfig())
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    waiter = asyncio.create_task(log.wait_for_data(0, timeout=5))
    await asyncio.sleep(0)
    await store.append("t", 0, batch(b"x"))
    assert not waiter.done()  # woken, not yet run: the cancellation meets the data
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_waiting_beyond_the_log_end_is_refused_not_silently_skipped(store: LogStore) -> None:
    """A reader whose position is past the log end (its records did not survive a restart) is told so
    at once: waiting would later hand it records after a gap it never heard of."""
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    await store.append("t", 0, batch(b"x"))
    with pytest.raises(OffsetOutOfRangeError, match="beyond the log end offset 1"):
        await log.wait_for_data(5, timeout=5)
    with pytest.raises(OffsetOutOfRangeError, match="beyond the log end offset 1"):
        log.read(5, 100)


async def test_retention_by_bytes_drops_oldest_and_moves_log_start(store: LogStore) -> None:
    store.create_topic("r", 1, TopicConfig(retention_bytes=2000, segment_bytes=1024))
    for i in range(20):
        await store.append("r", 0, batch(bytes([i]) * 200))
    removed = store.enforce_retention()
    log = store.partition("r", 0)
    assert removed > 0
    assert log.log_start_offset > 0
    assert log.high_watermark == 20
    assert log.size_bytes <= 2000 + 1024 + 300  # at most one active segment over the limit
    first = decode_all(log.read(log.log_start_offset, 1 << 20))[0]
    assert first.offset <= log.log_start_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


async def test_alter_topic_config_applies_to_partitions(store: LogStore) -> None:
    store.create_topic("cfg", 2, TopicConfig(retention_bytes=-1))
    await store.append("cfg", 0, batch(b"before"))
    changed = TopicConfig(retention_bytes=10, flush=FlushPolicy.OS)
    await store.alter_topic_config("cfg", changed)
    assert store.topic("cfg").config == changed
    assert all(log.config == changed for log in store.partitions("cfg"))
    await store.append("cfg", 0, batch(b"after"))
    assert [r.value for r in decode_all(store.partition("cfg", 0).read(0, 1 << 20))] == [b"before", b"after"]
    with pytest.raises(UnknownTopicError):
        await store.alter_topic_config("missing", changed)


def test_append_nowait_with_the_callers_header_stores_what_decoding_would(store: LogStore) -> None:
    """Produce hands over the header its validation read (``header=``): the batch is stored and indexed
    exactly as when the log decodes it itself; a header that does not describe the bytes is refused."""
    store.create_topic("h", 1, TopicConfig(flush=FlushPolicy.OS))  # readable at once
    log = store.partition("h", 0)
    first = encode_batch([RecordSpec(b"a"), RecordSpec(b"b")], timestamp=1_000)
    second = encode_batch([RecordSpec(b"c")], timestamp=2_000)
    decoded = log.append_nowait(first, verified=True)
    given = log.append_nowait(second, verified=True, header=unpack_header(second))
    assert (decoded.base_offset, decoded.last_offset) == (0, 1)
    assert (given.base_offset, given.last_offset, given.max_timestamp) == (2, 2, 2_000)
    assert [(r.offset, r.value) for r in decode_all(log.read(0, 1 << 20))] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert log.offset_for_timestamp(1_500) == 2
    with pytest.raises(CorruptRecordError):
        log.append_nowait(second + b"x", verified=True, header=unpack_header(second))
    assert log.log_end_offset == 3


async def test_wait_durable_after_append_nowait(store: LogStore) -> None:
    """append_nowait + wait_durable = append: offsets in call order, nothing appended twice, and with
    flush=always nothing is left unsynced once wait_durable returns (concurrent waiters share fsyncs)."""
    store.create_topic("d", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = store.partition("d", 0)
    results = [log.append_nowait(batch(str(i).encode())) for i in range(5)]
    assert [r.base_offset for r in results] == list(range(5))
    flusher = getattr(log, "flusher", None)  # the segment store's group-commit state; memory has none
    if flusher is not None:
        assert flusher.pending  # written, not yet synced: there is something to wait for
        syncs_before = flusher.syncs
    await asyncio.gather(*(log.wait_durable() for _ in range(5)))
    assert log.high_watermark == 5
    assert [r.value for r in decode_all(log.read(0, 1 << 20))] == [str(i).encode() for i in range(5)]
    if flusher is not None:
        assert not flusher.pending
        assert 1 <= flusher.syncs - syncs_before <= 2  # five waiters, one (at most two) fsync rounds
    await log.wait_durable()  # nothing new written: returns at once, appends nothing
    assert log.high_watermark == 5


async def test_tail_headers_cover_the_last_bytes_oldest_first(store: LogStore) -> None:
    store.create_topic("tail", 1, TopicConfig(segment_bytes=1024, index_interval_bytes=128))
    for i in range(40):
        await store.append("tail", 0, batch(bytes([65 + i % 26]) * 100, ts=1_000 + i))
    log = store.partition("tail", 0)
    everything = log.tail_headers(1 << 30)
    assert [h.base_offset for h in everything] == list(range(40))
    size = everything[0].size
    tail = log.tail_headers(5 * size)
    assert 5 <= len(tail) <= 40
    assert [h.base_offset for h in tail] == list(range(40 - len(tail), 40))  # a suffix, oldest first
    assert [h.max_timestamp for h in tail] == [1_000 + h.base_offset for h in tail]
    assert log.tail_headers(1)[-1].base_offset == 39
    store.create_topic("empty", 1)
    assert store.partition("empty", 0).tail_headers(1 << 20) == []


async def test_deletion_listeners_hear_every_topic_deletion(store: LogStore) -> None:
    heard: list[str] = []
    store.subscribe_deletions(heard.append)
    store.create_topic("gone", 1)
    store.create_topic("kept", 1)
    await store.delete_topic("gone")
    with pytest.raises(UnknownTopicError):
        await store.delete_topic("gone")
    assert heard == ["gone"]


async def test_delete_records_moves_the_log_start_up_and_never_down(store: LogStore) -> None:
    store.create_topic("t", 1)
    for i in range(4):
        await store.append("t", 0, batch(b"a%d" % i, b"b%d" % i))  # batches at 0, 2, 4, 6
    log = store.partition("t", 0)
    assert await log.delete_records(3) == 3  # mid-batch: the batch holding 3 is still served
    assert log.log_start_offset == 3 and log.high_watermark == 8
    assert [r.offset for r in decode_all(log.read(3, 1 << 20))][:2] == [2, 3]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 1 << 20)
    assert await log.delete_records(1) == 3, "a lower offset changes nothing"
    assert log.offset_for_timestamp(0) == 3
    for bad in (-1, 9):
        with pytest.raises(OffsetOutOfRangeError):
            await log.delete_records(bad)
    assert await log.delete_records(8) == 8  # everything
    assert log.read(8, 1 << 20) == b"" and log.high_watermark == 8
    appended = await store.append("t", 0, batch(b"after"))
    assert appended.base_offset == 8 and appended.log_start_offset == 8
    assert [r.value for r in decode_all(log.read(8, 1 << 20))] == [b"after"]
