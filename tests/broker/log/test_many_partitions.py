"""Many partitions under a low descriptor limit, through a real `sluice serve` and librdkafka.

Before the descriptor cache every partition held three descriptors from its creation on: under a
limit of 256 a 1,500-partition create failed half-way with EMFILE, left a half-opened topic behind,
and the broker refused new clients.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.sluice_server import SluiceProcess

NOFILE = 256
PARTITIONS = 1_500


@pytest.fixture
def limited_sluice(tmp_path: Path) -> Iterator[SluiceProcess]:
    """A segment-store Sluice whose process may open at most NOFILE descriptors (inherited at fork)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        server = SluiceProcess(tmp_path / "data", env={
            "SLUICE_STORAGE__BACKEND": "segment", "SLUICE_STORAGE__MAX_PARTITIONS": "2000",
            "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false"})
        server.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield server
    finally:
        server.stop()


def _create(admin: AdminClient, *topics: NewTopic) -> dict[str, KafkaError | None]:
    out: dict[str, KafkaError | None] = {}
    for name, future in admin.create_topics(list(topics), operation_timeout=30).items():
        try:
            future.result(timeout=60)
            out[name] = None
        except Exception as exc:  # confluent-kafka raises KafkaException wrapping the error
            out[name] = exc.args[0]
    return out


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_wide_topic_under_a_low_fd_limit_keeps_the_broker_serving(limited_sluice: SluiceProcess) -> None:
    admin = AdminClient({"bootstrap.servers": limited_sluice.bootstrap})
    assert _create(admin, NewTopic("wide", PARTITIONS, 1)) == {"wide": None}
    producer = Producer({"bootstrap.servers": limited_sluice.bootstrap, "linger.ms": 5})
    for p in range(PARTITIONS):
        producer.produce("wide", value=b"v%d" % p, partition=p)
    assert producer.flush(60) == 0
    assert limited_sluice.proc is not None
    assert _open_fds(limited_sluice.proc.pid) < NOFILE

    # The next create works too (it failed half-way before), and new clients are served.
    assert _create(admin, NewTopic("after", 3, 1)) == {"after": None}
    consumer = Consumer({"bootstrap.servers": limited_sluice.bootstrap, "group.id": "g",
                         "enable.auto.commit": False})
    picks = [0, 777, PARTITIONS - 1]
    consumer.assign([TopicPartition("wide", p, 0) for p in picks])
    seen: dict[int, bytes] = {}
    for _ in range(100):
        msg = consumer.poll(1.0)
        if msg is None:
            if len(seen) == len(picks):
                break
            continue
        assert msg.error() is None, msg.error()
        partition, value = msg.partition(), msg.value()
        assert partition is not None and value is not None
        seen[partition] = value
    consumer.close()
    assert seen == {p: b"v%d" % p for p in picks}


def test_partition_caps_are_refused_as_kafka_refuses_them(limited_sluice: SluiceProcess) -> None:
    admin = AdminClient({"bootstrap.servers": limited_sluice.bootstrap})
    # Kafka's controller fails the whole request above 10,000 partitions (KAFKA-17870): every topic.
    results = _create(admin, NewTopic("big-a", 6_000, 1), NewTopic("big-b", 6_000, 1), NewTopic("small", 1, 1))
    for name, error in results.items():
        assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, (name, error)
        assert "Excessively large number of partitions per request" in error.str()
    # The broker-wide cap (storage.max_partitions = 2000 here).
    assert _create(admin, NewTopic("most", 1_500, 1)) == {"most": None}
    error = _create(admin, NewTopic("one-too-many", 501, 1))["one-too-many"]
    assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, error
    assert "storage.max_partitions" in error.str()
    assert _create(admin, NewTopic("rest", 500, 1)) == {"rest": None}
    listed = set(admin.list_topics(timeout=10).topics)
    assert {"most", "rest"} <= listed
    assert not listed & {"big-a", "big-b", "small", "one-too-many"}
