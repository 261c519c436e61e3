"""ListOffsets by timestamp through a real client (kafka-python's offsets_for_times): the answer is the
offset and timestamp of the first record whose timestamp is ≥ the one asked for, inside a batch too."""

from __future__ import annotations

from pathlib import Path

from tests.broker.server.conftest import SluiceProcess

BASE = 1_700_000_000_000
# One batch, timestamps out of order (device data often is): offset -> timestamp.
STAMPS = [BASE + 1_000, BASE + 5_000, BASE + 3_000, BASE + 7_000, BASE + 6_000]


def test_offsets_for_times_returns_the_found_records_offset_and_timestamp(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    server = sluice_factory(tmp_path / "data")
    server.start()
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, linger_ms=200)
    futures = [producer.send("times", b"v%d" % i, timestamp_ms=ts) for i, ts in enumerate(STAMPS)]
    producer.flush(30)
    assert [f.get(timeout=10).offset for f in futures] == [0, 1, 2, 3, 4]
    producer.close()
    # Later batch, so the lookup must also cross from one batch to the next.
    producer = KafkaProducer(bootstrap_servers=server.bootstrap)
    assert producer.send("times", b"late", timestamp_ms=BASE + 9_000).get(timeout=10).offset == 5
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap)
    tp = TopicPartition("times", 0)
    try:
        def lookup(ts: int) -> tuple[int, int] | None:
            found = consumer.offsets_for_times({tp: ts})[tp]
            return None if found is None else (found.offset, found.timestamp)

        assert lookup(BASE) == (0, BASE + 1_000)
        assert lookup(BASE + 2_000) == (1, BASE + 5_000)  # first by offset, not the closest timestamp
        assert lookup(BASE + 5_500) == (3, BASE + 7_000)
        assert lookup(BASE + 7_000) == (3, BASE + 7_000)
        assert lookup(BASE + 8_000) == (5, BASE + 9_000)
        assert lookup(BASE + 10_000) is None
    finally:
        consumer.close()
