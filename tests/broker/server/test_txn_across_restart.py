"""Transactions across a kill -9 of the broker whose producer survives it.

A transactional batch the broker appended but never answered (kill -9 between the append and the
Produce answer) is retried by the client after the restart; the restarted broker must recognise the
retry (producer id, epoch and sequence rebuilt from the log) and not append it a second time. Real
clients write (librdkafka through confluent-kafka, and aiokafka, as the processors use) and read
(librdkafka, read_committed and read_uncommitted); ``AckProxy`` loses the answers. Before the fix the
restart rebuilt only non-transactional producers, and every record of the retried batches was
committed twice (the duplicated alert stretches of test_exactly_once_broker_kill).

A transaction the producer goes on writing after the restart must keep its first offset from before
the restart (the last stable offset and the aborted range start there)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.server.ack_proxy import AckProxy
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.test_transactions import TOPIC, _consume_all, _create_topic, _produce_txn

pytestmark = pytest.mark.slow


def kill9_and_restart(server: SluiceProcess) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    server.start()


@pytest.fixture
def proxied(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> Iterator[tuple[SluiceProcess, AckProxy]]:
    """A broker whose clients reach it through ``AckProxy`` (also across its restarts on a new port)."""
    server: SluiceProcess | None = None
    proxy = AckProxy(lambda: server.port if server is not None else 0)
    proxy.start()
    try:
        server = sluice_factory(tmp_path / "data", env={"SLUICE_KAFKA__ADVERTISED_PORT": str(proxy.port)})
        server.start()
        _create_topic(server, partitions=2)
        yield server, proxy
    finally:
        proxy.stop()


async def test_unanswered_transactional_batches_retried_after_kill_9_are_not_appended_twice(
        proxied: tuple[SluiceProcess, AckProxy]) -> None:
    from aiokafka import AIOKafkaProducer
    from confluent_kafka import Producer

    server, proxy = proxied
    bootstrap = f"127.0.0.1:{proxy.port}"
    rdkafka = Producer({"bootstrap.servers": bootstrap, "transactional.id": "retried-rdkafka",
                        "transaction.timeout.ms": 60_000, "linger.ms": 1})
    await asyncio.to_thread(rdkafka.init_transactions, 30)
    aio = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="retried-aiokafka")
    await aio.start()
    try:
        rdkafka.begin_transaction()
        await aio.begin_transaction()
        proxy.withhold_produce_answers(2)
        from_rdkafka = [b"rdkafka-%d" % i for i in range(50)]
        for value in from_rdkafka:
            rdkafka.produce(TOPIC, value, partition=0)
        rdkafka.poll(0)
        from_aiokafka = [b"aiokafka-%d" % i for i in range(50)]
        batch = aio.create_batch()
        for value in from_aiokafka:
            assert batch.append(key=None, value=value, timestamp=None) is not None
        sent = await aio.send_batch(batch, TOPIC, partition=1)
        assert await asyncio.to_thread(proxy.answers_withheld.wait, 60), "the batches never reached the broker"
        await asyncio.to_thread(kill9_and_restart, server)
        # both clients retry on the restarted broker; the answers carry the offsets of the first appends
        assert (await asyncio.wait_for(sent, 60)).offset == 0
        assert await asyncio.to_thread(rdkafka.flush, 60) == 0
        await asyncio.to_thread(rdkafka.commit_transaction, 60)
        await aio.commit_transaction()
    finally:
        await aio.stop()
    expected = sorted(from_rdkafka + from_aiokafka)
    for isolation in ("read_committed", "read_uncommitted"):
        assert sorted(await asyncio.to_thread(_consume_all, server, isolation, len(expected))) == expected
    assert "Traceback" not in server.log_text()


def test_a_transaction_written_on_both_sides_of_a_kill_9_aborts_whole(
        proxied: tuple[SluiceProcess, AckProxy]) -> None:
    """The producer survives the broker's kill -9 and writes more of its open transaction after the
    restart, then aborts: read_committed readers see none of it, neither side of the restart (and,
    while it is open, the last stable offset holds them before its first batch, not its first batch
    after the restart)."""
    from confluent_kafka import Producer

    server, proxy = proxied
    bootstrap = f"127.0.0.1:{proxy.port}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "survivor",
                         "transaction.timeout.ms": 60_000, "linger.ms": 1})
    producer.init_transactions(30)
    producer.begin_transaction()
    before = [b"before-%d" % i for i in range(20)]
    for value in before:
        producer.produce(TOPIC, value, partition=0)
    assert producer.flush(30) == 0
    kill9_and_restart(server)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    plain.produce(TOPIC, b"plain", partition=0)  # between the transaction's two halves
    assert plain.flush(30) == 0
    after = [b"after-%d" % i for i in range(20)]
    for value in after:
        producer.produce(TOPIC, value, partition=0)
    assert producer.flush(30) == 0
    assert _consume_all(server, "read_committed", 0) == []  # the open transaction holds the LSO
    producer.abort_transaction(30)
    committed = [b"committed-%d" % i for i in range(5)]
    _produce_txn(producer, committed, commit=True)
    assert sorted(_consume_all(server, "read_committed", 6)) == sorted([b"plain", *committed])
    assert "Traceback" not in server.log_text()
