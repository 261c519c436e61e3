"""A consumer whose committed offset lies past what survived a crash is told OFFSET_OUT_OF_RANGE, as
Kafka tells it, instead of silently waiting for the log to grow back past its position."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from broker.protocol.records import iter_batches
from tests.sluice_server import SluiceProcess


def test_a_committed_offset_beyond_a_lost_tail_is_out_of_range(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"SLUICE_STORAGE__BACKEND": "segment", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false"}
    server = SluiceProcess(data, env=env).start()
    try:
        producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
        for i in range(5):
            producer.produce("t", value=b"%d" % i, partition=0)
            assert producer.flush(10) == 0  # one batch per record
        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g"})
        consumer.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
        consumer.close()
    finally:
        server.stop()

    # A power cut lost the last two batches (their fsync had not happened): cut them off by hand.
    segment = data / "logs" / "t-0" / f"{0:020d}.log"
    raw = segment.read_bytes()
    ends = [pos + header.size for pos, header in iter_batches(raw)]
    assert len(ends) == 5
    with segment.open("r+b") as f:
        f.truncate(ends[2])
    (data / "logs" / ".clean-shutdown").unlink()

    server = SluiceProcess(data, env=env).start()
    try:
        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g",
                             "auto.offset.reset": "error", "enable.auto.commit": False})
        consumer.subscribe(["t"])
        error: KafkaError | None = None
        for _ in range(30):
            msg = consumer.poll(1.0)
            if msg is not None:
                error = msg.error()
                assert error is not None, f"record {msg.offset()} delivered past a lost tail"
                break
        consumer.close()
        assert error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET, error
        assert "out of range" in error.str().lower()
        log = server.log.read_text()
        assert "Traceback" not in log
    finally:
        server.stop()
