"""Kafka transactions against a real Sluice process, with librdkafka (confluent-kafka) on both ends:
committed records are read exactly once by read_committed consumers, aborted ones never; a second
producer with the same transactional.id fences the first; a transaction left open by a kill -9 of
the broker is completed or aborted after the restart, never half-visible."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.broker.server.conftest import SluiceProcess

TOPIC = "txn-test"


def _producer(server: SluiceProcess, txn_id: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60_000, "linger.ms": 1, **extra})
    producer.init_transactions(30)
    return producer


def _produce_txn(producer: Any, values: list[bytes], *, commit: bool, topic: str = TOPIC) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, key=value[:1])
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _consume_all(server: SluiceProcess, isolation: str, expected: int, topic: str = TOPIC,
                 timeout_s: float = 20.0) -> list[bytes]:
    """Values read from the beginning until ``expected`` arrived and 1 s passed without more (to catch extras)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "unused",
                         "isolation.level": isolation, "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if len(values) >= expected:
                    quiet_until = quiet_until or time.monotonic() + 1.0
                    if time.monotonic() >= quiet_until:
                        break
                continue
            if msg.error() is not None:
                continue  # partition EOF and the like
            value = msg.value()
            assert value is not None
            values.append(bytes(value))
            quiet_until = None
    finally:
        consumer.close()
    return values


def _create_topic(server: SluiceProcess, partitions: int = 2) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions)])[TOPIC].result(15)


def test_committed_exactly_once_aborted_never(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server)
    producer = _producer(server, "txn-basic")
    first = [b"c1-%d" % i for i in range(200)]
    aborted = [b"ab-%d" % i for i in range(100)]
    second = [b"c2-%d" % i for i in range(200)]
    _produce_txn(producer, first, commit=True)
    _produce_txn(producer, aborted, commit=False)
    _produce_txn(producer, second, commit=True)

    committed = _consume_all(server, "read_committed", len(first) + len(second))
    assert sorted(committed) == sorted(first + second)  # each exactly once, no aborted record
    everything = _consume_all(server, "read_uncommitted", len(first) + len(aborted) + len(second))
    assert sorted(everything) == sorted(first + aborted + second)
    # Per partition, committed records keep their produce order.
    for prefix, batch in ((b"c1", first), (b"c2", second)):
        got = [v for v in committed if v.startswith(prefix)]
        for key in {v[:1] for v in batch}:
            assert [v for v in got if v[:1] == key] == [v for v in batch if v[:1] == key]


def test_a_second_producer_fences_the_first(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    from confluent_kafka import KafkaException

    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server)
    zombie = _producer(server, "txn-fence")
    zombie.begin_transaction()
    for i in range(50):
        zombie.produce(TOPIC, b"zombie-%d" % i)
    zombie.flush(30)

    successor = _producer(server, "txn-fence")  # bumps the epoch and aborts the zombie's open transaction
    _produce_txn(successor, [b"new-%d" % i for i in range(50)], commit=True)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(15)
    assert raised.value.args[0].fatal(), raised.value.args[0]
    committed = _consume_all(server, "read_committed", 50)
    assert sorted(committed) == sorted(b"new-%d" % i for i in range(50))


def test_read_committed_stops_at_an_open_transaction(tmp_path: Path,
                                                     sluice_factory: type[SluiceProcess]) -> None:
    from confluent_kafka import Producer

    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server, partitions=1)
    txn = _producer(server, "txn-lso")
    txn.begin_transaction()
    txn.produce(TOPIC, b"in-txn")
    txn.flush(30)
    plain = Producer({"bootstrap.servers": server.bootstrap})
    plain.produce(TOPIC, b"after-the-open-txn")
    plain.flush(30)

    # The plain record lies after the open transaction's first offset: not readable committed yet.
    assert _consume_all(server, "read_committed", 0, timeout_s=3) == []
    txn.commit_transaction(30)
    assert _consume_all(server, "read_committed", 2) == [b"in-txn", b"after-the-open-txn"]


@pytest.mark.slow
def test_open_transaction_survives_kill_9_and_is_aborted_by_its_successor(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server)
    producer = _producer(server, "txn-crash")
    done = [b"done-%d" % i for i in range(100)]
    _produce_txn(producer, done, commit=True)
    producer.begin_transaction()
    for i in range(100):
        producer.produce(TOPIC, b"open-%d" % i)
    producer.flush(30)
    assert server.proc is not None
    server.proc.kill()  # kill -9 with the transaction open
    server.proc.wait()
    port = server.port
    server.start()
    assert server.port != 0 and port != 0

    # Nothing of the open transaction is visible committed; the successor fences and aborts it.
    successor = _producer(server, "txn-crash")
    after = [b"after-%d" % i for i in range(100)]
    _produce_txn(successor, after, commit=True)
    committed = _consume_all(server, "read_committed", len(done) + len(after))
    assert sorted(committed) == sorted(done + after)
    assert "Traceback" not in server.log_text()


def test_abandoned_transaction_times_out(tmp_path: Path, sluice_factory: type[SluiceProcess],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_KAFKA__TRANSACTION_ABORT_CHECK_INTERVAL_MS", "100")
    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server, partitions=1)
    from confluent_kafka import Producer

    abandoned = _producer(server, "txn-timeout", **{"transaction.timeout.ms": 1000})
    abandoned.begin_transaction()
    abandoned.produce(TOPIC, b"never-committed")
    abandoned.flush(30)
    plain = Producer({"bootstrap.servers": server.bootstrap})
    plain.produce(TOPIC, b"plain")
    plain.flush(30)
    # Once the coordinator aborts the transaction, the LSO passes it and the plain record is readable.
    assert _consume_all(server, "read_committed", 1, timeout_s=20) == [b"plain"]


def test_aiokafka_consume_transform_produce_exactly_once(tmp_path: Path,
                                                         sluice_factory: type[SluiceProcess]) -> None:
    """aiokafka's transactional loop: outputs and input offsets commit together; an aborted round
    leaves neither, and is redone from the committed offset."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server, partitions=1)
    inputs = [b"%d" % i for i in range(300)]

    async def run() -> int | None:
        plain = AIOKafkaProducer(bootstrap_servers=server.bootstrap)
        await plain.start()
        for value in inputs:
            await plain.send(TOPIC, value)
        await plain.stop()

        consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=server.bootstrap, group_id="ctp",
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        producer = AIOKafkaProducer(bootstrap_servers=server.bootstrap, transactional_id="ctp-1")
        await consumer.start()
        await producer.start()
        tp = TopicPartition(TOPIC, 0)
        done, rounds = 0, 0
        try:
            while done < len(inputs):
                batches = await consumer.getmany(tp, timeout_ms=1000, max_records=50)
                records = batches.get(tp, [])
                if not records:
                    continue
                rounds += 1
                await producer.begin_transaction()
                for record in records:
                    assert record.value is not None
                    await producer.send("txn-out", b"x" + record.value)
                await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, "ctp")
                if rounds == 3:  # a failed round: nothing of it may stay, and it is redone
                    await producer.abort_transaction()
                    committed = await consumer.committed(tp)
                    consumer.seek(tp, committed or 0)
                    continue
                await producer.commit_transaction()
                done = records[-1].offset + 1
            final = await consumer.committed(tp)
        finally:
            await producer.stop()
            await consumer.stop()
        return final

    committed = asyncio.run(run())
    assert committed == len(inputs)
    outputs = _consume_all(server, "read_committed", len(inputs), topic="txn-out")
    assert outputs == [b"x" + v for v in inputs]  # each exactly once, in order


def test_operators_see_open_transactions(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    """DescribeTransactions / ListTransactions (what kafka-transactions.sh calls) over the wire, and
    read_committed ListOffsets(latest) answering the last stable offset."""
    import asyncio

    from broker.protocol.kafka import ApiKey
    from tests.broker.server.raw_client import RawClient

    server = sluice_factory(tmp_path / "data")
    server.start()
    _create_topic(server, partitions=1)
    producer = _producer(server, "txn-ops")
    producer.begin_transaction()
    producer.produce(TOPIC, b"open")
    producer.flush(30)

    async def ask() -> tuple[Any, Any, Any]:
        client = await RawClient.connect(server.port)
        try:
            listed = await client.request(ApiKey.LIST_TRANSACTIONS, 1, {
                "state_filters": ["Ongoing"], "producer_id_filters": [], "duration_filter": -1})
            described = await client.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, {
                "transactional_ids": ["txn-ops", "nobody"]})
            offsets = await client.request(ApiKey.LIST_OFFSETS, 5, {
                "replica_id": -1, "isolation_level": 1,
                "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                                           "timestamp": -1}]}]})
        finally:
            await client.close()
        return listed, described, offsets

    listed, described, offsets = asyncio.run(ask())
    assert [(s.transactional_id, s.transaction_state) for s in listed.transaction_states] == [("txn-ops", "Ongoing")]
    ours, unknown = described.transaction_states
    assert (ours.error_code, ours.transaction_state) == (0, "Ongoing")
    assert [(t.topic, list(t.partitions)) for t in ours.topics] == [(TOPIC, [0])]
    assert unknown.error_code == 105  # TRANSACTIONAL_ID_NOT_FOUND
    assert offsets.topics[0].partitions[0].offset == 0  # the open transaction holds the LSO at its start
    producer.commit_transaction(30)
