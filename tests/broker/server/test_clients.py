"""Real Kafka client libraries nobody here wrote, each moving 100k keyed records through Sluice:
confluent-kafka (librdkafka, idempotent producer + group consumer), aiokafka (producer + group
consumer) and kafka-python (producer with its default idempotence + group consumer)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.broker.server.conftest import SluiceProcess, check_records, values_in_key_order

N = 100_000
# The group consumers' session timeout: generous, as nothing here waits for a member to expire and a
# consumer starved of CPU for 6 s (kafka-python's, at load 15-23) was expelled mid-read.
SESSION_MS = 30_000
PARTITIONS = 3
Received = list[tuple[int, int, bytes | None, bytes | None]]


def _key(i: int) -> bytes:
    return b"dev-%d" % (i % 101)


def _value(i: int) -> bytes:
    return b"v:%d" % i


def _expected() -> set[bytes]:
    return {_value(i) for i in range(N)}


def _producer_ids(port: int, topic: str) -> set[int]:
    """Producer ids in the stored batches of partition 0 (>= 0 means the producer was idempotent)."""
    from broker.protocol.kafka import ApiKey
    from broker.protocol.records import split_complete_batches
    from tests.broker.server.raw_client import RawClient
    from tests.broker.server.test_kafka_server import fetch_body

    async def fetch() -> bytes:
        client = await RawClient.connect(port)
        resp = await client.request(ApiKey.FETCH, 11, fetch_body(0, topic=topic))
        await client.close()
        return bytes(resp.topics[0].partitions[0].records)

    headers, _ = split_complete_batches(asyncio.run(fetch()))
    assert headers
    return {h.producer_id for h in headers}


def test_confluent_kafka_idempotent_producer_and_group_consumer(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    from confluent_kafka import Consumer, Producer

    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": server.bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random",
        "linger.ms": 5, "batch.num.messages": 5000,
    })

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(N):
        while True:
            try:
                producer.produce("confluent-test", _value(i), _key(i), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert errors == []
    assert min(_producer_ids(server.port, "confluent-test")) >= 0

    consumer = Consumer({
        "bootstrap.servers": server.bootstrap, "group.id": "confluent-group", "auto.offset.reset": "earliest",
        "enable.auto.commit": True, "session.timeout.ms": SESSION_MS,
    })
    consumer.subscribe(["confluent-test"])
    received: Received = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < N and time.monotonic() < deadline:
            for msg in consumer.consume(10000, timeout=0.5):
                assert msg.error() is None, msg.error()
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None  # set on every consumed message
                received.append((partition, offset, msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(received) == N
    check_records(received, _expected(), PARTITIONS)
    values_in_key_order(received)


async def _aiokafka_round_trip(bootstrap: str) -> Received:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5,
                                max_batch_size=256 * 1024)
    await producer.start()
    try:
        pending = []
        for i in range(N):
            pending.append(await producer.send("aiokafka-test", _value(i), key=_key(i)))
        await producer.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "aiokafka-test", bootstrap_servers=bootstrap, group_id="aiokafka-group", auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000,
    )
    await consumer.start()
    received: Received = []
    try:
        deadline = time.monotonic() + 60
        while len(received) < N and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=10000)
            for tp, messages in batches.items():
                received.extend((tp.partition, m.offset, m.key, m.value) for m in messages)
        await consumer.commit()
    finally:
        await consumer.stop()
    return received


@pytest.mark.slow
def test_aiokafka_producer_and_group_consumer(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    received = asyncio.run(_aiokafka_round_trip(server.bootstrap))
    assert min(_producer_ids(server.port, "aiokafka-test")) >= 0
    assert len(received) == N
    check_records(received, _expected(), PARTITIONS)
    values_in_key_order(received)


@pytest.mark.slow
def test_kafka_python_producer_and_group_consumer(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, linger_ms=5, batch_size=256 * 1024)
    futures = [producer.send("kafka-python-test", _value(i), key=_key(i)) for i in range(N)]
    producer.flush(60)
    for future in futures[-10:]:
        future.get(timeout=10)
    assert all(f.succeeded() for f in futures)
    producer.close()
    assert min(_producer_ids(server.port, "kafka-python-test")) >= 0  # idempotence is kafka-python's default

    consumer = KafkaConsumer(
        "kafka-python-test", bootstrap_servers=server.bootstrap, group_id="kafka-python-group",
        auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000,
    )
    received: Received = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < N and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500, max_records=10000).items():
                received.extend((tp.partition, m.offset, m.key, m.value) for m in messages)
        consumer.commit()
    finally:
        consumer.close()
    assert len(received) == N
    check_records(received, _expected(), PARTITIONS)
    values_in_key_order(received)


def test_confluent_admin_client_creates_describes_and_deletes_topics(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    server = sluice_factory(tmp_path / "data")
    server.start()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    futures = admin.create_topics([NewTopic("admin-made", 5, 1, config={"retention.ms": "60000"})])
    futures["admin-made"].result(10)
    assert len(admin.list_topics(timeout=10).topics["admin-made"].partitions) == 5
    duplicate = admin.create_topics([NewTopic("admin-made", 1, 1)])["admin-made"]
    try:
        duplicate.result(10)
        raise AssertionError("creating an existing topic must fail")
    except Exception as exc:  # KafkaException(TOPIC_ALREADY_EXISTS)
        assert "TOPIC_ALREADY_EXISTS" in str(exc)
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "admin-made")])
    described = next(iter(configs.values())).result(10)
    assert described["retention.ms"].value == "60000"
    admin.delete_topics(["admin-made"])["admin-made"].result(10)
    assert "admin-made" not in admin.list_topics(timeout=10).topics
