"""Log compaction on the segment and memory stores: latest per key, offsets kept, tombstones, lags, restarts."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.log.api import LogStore
from broker.log.cleaner import LogCleaner
from broker.log.config import TopicConfig
from broker.log.memory import MemoryLogStore
from broker.log.partition_log import PartitionLog
from broker.log.segment import SegmentLogStore, SegmentPartitionLog
from broker.protocol.records import (
    ATTR_TRANSACTIONAL,
    Compression,
    RecordSpec,
    decode_header,
    decode_records,
    encode_batch,
    iter_batches,
    reencode_batch,
)
from tests.broker.log.helpers import FakeClock, open_store

COMPACT = TopicConfig(segment_bytes=1024, index_interval_bytes=128).with_kafka_configs(
    {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "60000",
     "flush.policy": "os"})
Seen = dict[int, tuple[bytes | None, bytes | None]]


def read_like_a_consumer(log: PartitionLog) -> Seen:
    """offset -> (key, value) of every record, stepping over batches as consumers do (last offset + 1)."""
    out: Seen = {}
    offset = log.log_start_offset
    while offset < log.high_watermark:
        data = log.read(offset, 4096)
        assert data, f"nothing at {offset} below {log.high_watermark}"
        for pos, header in iter_batches(data):
            for record in decode_records(memoryview(data)[pos : pos + header.size], header):
                if record.offset >= offset:
                    out[record.offset] = (record.key, record.value)
            offset = header.last_offset + 1
    return out


async def produce(store: LogStore, topic: str, pairs: Sequence[tuple[bytes, bytes | None]]) -> None:
    for key, value in pairs:
        await store.append(topic, 0, encode_batch([RecordSpec(value, key=key)], timestamp=1_700_000_000_000))


def latest_per_key(seen: Seen) -> dict[bytes | None, tuple[int, bytes | None]]:
    latest: dict[bytes | None, tuple[int, bytes | None]] = {}
    for offset in sorted(seen):
        key, value = seen[offset]
        latest[key] = (offset, value)
    return latest


def part(store: SegmentLogStore, topic: str = "c") -> SegmentPartitionLog:
    log = store.partition(topic, 0)
    assert isinstance(log, SegmentPartitionLog)
    return log


async def test_cleaner_keeps_latest_per_key_with_offsets_and_survives_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("c", 1, COMPACT)
    pairs = [(b"k%d" % (i % 7), b"v%d-%s" % (i, b"x" * 40)) for i in range(300)]
    await produce(store, "c", pairs)
    log = part(store)
    before = read_like_a_consumer(log)
    hw, segments = log.high_watermark, log.segment_count
    assert segments > 10
    await store.flush()

    stats = await LogCleaner(store, clock=clock).clean_once()
    assert len(stats) == 1 and stats[0].records_removed > 0
    after = read_like_a_consumer(log)
    assert log.high_watermark == hw and log.log_start_offset == 0
    assert latest_per_key(after) == latest_per_key(before)  # nothing a consumer needs is lost
    assert all(before[offset] == kv for offset, kv in after.items())  # offsets never change
    assert len(after) < len(before) // 3
    # Within the cleaned segments exactly one record per key remains.
    cleaned_end = log.cleanable_segments()[-1].end_offset
    cleaned_keys = [kv[0] for offset, kv in after.items() if offset < cleaned_end]
    assert len(cleaned_keys) == len(set(cleaned_keys))

    await store.append("c", 0, encode_batch([RecordSpec(b"new", key=b"k1")]))
    await store.close()
    with caplog.at_level(logging.WARNING):
        reopened = await open_store(tmp_path, clock=clock)
    assert "truncated" not in caplog.text
    again = read_like_a_consumer(part(reopened))
    assert {o: kv for o, kv in again.items() if o < hw} == after
    assert again[hw] == (b"k1", b"new")
    await reopened.close()


async def test_tombstones_go_after_delete_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("c", 1, COMPACT)
    await produce(store, "c", [(b"gone", b"value"), (b"kept", b"value")])
    await produce(store, "c", [(b"gone", None)])
    await produce(store, "c", [(b"filler-%d" % i, b"y" * 200) for i in range(20)])  # roll past them
    await store.flush()
    log = part(store)
    cleaner = LogCleaner(store, clock=clock)

    await cleaner.clean_once()
    values = {kv[0]: kv[1] for kv in read_like_a_consumer(log).values()}
    assert values[b"gone"] is None  # the tombstone stays for delete.retention.ms ...
    assert b"value" not in [v for k, v in values.items() if k == b"gone"]

    clock.now += 61  # ... and goes after it, even though nothing new made the log dirty
    stats = await cleaner.clean_once()
    assert stats and stats[0].tombstones_removed == 1
    keys = [kv[0] for kv in read_like_a_consumer(log).values()]
    assert b"gone" not in keys and b"kept" in keys
    await store.close()


async def test_min_compaction_lag_and_dirty_ratio_hold_cleaning_back(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    config = COMPACT.with_kafka_configs({"min.compaction.lag.ms": "10000", "min.cleanable.dirty.ratio": "0.9"})
    store.create_topic("c", 1, config)
    await produce(store, "c", [(b"k", b"v%d-%s" % (i, b"x" * 100)) for i in range(60)])
    await store.flush()
    cleaner = LogCleaner(store, clock=clock)
    assert await cleaner.clean_once() == []  # younger than the lag
    clock.now += 11
    assert len(await cleaner.clean_once()) == 1
    await produce(store, "c", [(b"k", b"more-%d-%s" % (i, b"x" * 100)) for i in range(10)])
    await store.flush()
    clock.now += 11
    assert await cleaner.clean_once() == []  # a little dirt on a clean log: below the 0.9 ratio
    await store.close()


async def test_compact_only_topics_are_never_trimmed(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("c", 1, COMPACT.with_kafka_configs({"retention.ms": "1", "retention.bytes": "10"}))
    store.create_topic("both", 1, COMPACT.with_kafka_configs({"cleanup.policy": "compact,delete",
                                                              "retention.ms": "1"}))
    for topic in ("c", "both"):
        await produce(store, topic, [(b"k%d" % i, b"x" * 100) for i in range(40)])
    await store.flush()
    clock.now += 10
    store.enforce_retention()
    assert part(store, "c").log_start_offset == 0
    assert part(store, "both").log_start_offset > 0
    await store.close()


@pytest.mark.parametrize(("setting", "expected"), [
    ("zstd", Compression.ZSTD), ("uncompressed", Compression.NONE), ("producer", Compression.GZIP)])
async def test_compression_type_recompresses_appends(tmp_path: Path, setting: str, expected: Compression) -> None:
    store = await open_store(tmp_path)
    store.create_topic("z", 1, TopicConfig().with_kafka_configs({"compression.type": setting}))
    sent = [RecordSpec(b"value-%d" % i, key=b"k%d" % i, headers=(("h", b"x"),)) for i in range(50)]
    await store.append("z", 0, encode_batch(sent, compression=Compression.GZIP, timestamp=1_700_000_000_000))
    data = store.partition("z", 0).read(0, 1 << 20)
    [(pos, header)] = list(iter_batches(data))
    assert header.compression is expected
    assert [(r.key, r.value, r.headers, r.offset) for r in decode_records(data, header)] == [
        (s.key, s.value, s.headers, i) for i, s in enumerate(sent)]
    await store.close()


async def test_transactional_records_neither_shadow_nor_are_shadowed(tmp_path: Path) -> None:
    """Until the cleaner consults the transaction layer, an (possibly aborted) transactional record must
    not remove the committed value before it, and is itself kept."""
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("c", 1, COMPACT)
    await produce(store, "c", [(b"k", b"plain")])
    plain = encode_batch([RecordSpec(b"in-a-transaction", key=b"k")], producer_id=7, producer_epoch=0,
                         base_sequence=0, timestamp=1_700_000_000_000)
    header = decode_header(plain)
    transactional = reencode_batch(header._replace(attributes=header.attributes | ATTR_TRANSACTIONAL),
                                   decode_records(plain, header))
    await store.append("c", 0, transactional)
    await produce(store, "c", [(b"filler-%d" % i, b"y" * 200) for i in range(20)])
    await store.flush()
    await LogCleaner(store, clock=clock).clean_once()
    values = [kv[1] for kv in read_like_a_consumer(part(store)).values() if kv[0] == b"k"]
    assert values == [b"plain", b"in-a-transaction"]
    await store.close()


async def test_the_memory_store_is_compacted_by_the_same_rules() -> None:
    store = MemoryLogStore()
    store.create_topic("c", 1, COMPACT)
    await produce(store, "c", [(b"k%d" % (i % 5), b"v%d" % i) for i in range(100)])
    await produce(store, "c", [(b"k0", None)])
    await produce(store, "c", [(b"last", b"anchor")])  # the newest batch is never cleaned
    log = store.partition("c", 0)
    before = read_like_a_consumer(log)
    shift = 0.0
    cleaner = LogCleaner(store, clock=lambda: time.time() + shift)
    [stats] = await cleaner.clean_once()
    after = read_like_a_consumer(log)
    assert latest_per_key(after) == latest_per_key(before) and log.high_watermark == 102
    assert all(before[offset] == kv for offset, kv in after.items())
    assert sorted(after) == [96, 97, 98, 99, 100, 101]  # k1..k4's latest, k0's tombstone, the anchor
    assert stats.records_removed == 96
    shift = 61.0  # past delete.retention.ms: the tombstone goes, even with nothing new to clean
    [stats] = await cleaner.clean_once()
    assert stats.tombstones_removed == 1
    assert b"k0" not in [kv[0] for kv in read_like_a_consumer(log).values()]
