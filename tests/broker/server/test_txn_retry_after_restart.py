"""A transactional batch the broker appended but never answered (kill -9 between the append and the
Produce answer) is retried by the client after the restart; the restarted broker must recognise the
retry (producer id, epoch and sequence rebuilt from the log) and not append it a second time. Real
clients write (librdkafka through confluent-kafka, and aiokafka, as the processors use) and read
(librdkafka, read_committed and read_uncommitted); ``AckProxy`` loses the answers. Before the fix the
restart rebuilt only non-transactional producers, and every record of the retried batches was
committed twice (the duplicated alert stretches of test_exactly_once_broker_kill)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.broker.server.ack_proxy import AckProxy
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.test_transactions import TOPIC, _consume_all, _create_topic

pytestmark = pytest.mark.slow


def kill9_and_restart(server: SluiceProcess) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    server.start()


async def test_unanswered_transactional_batches_retried_after_kill_9_are_not_appended_twice(
        tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    from aiokafka import AIOKafkaProducer
    from confluent_kafka import Producer

    server: SluiceProcess | None = None
    proxy = AckProxy(lambda: server.port if server is not None else 0)
    proxy.start()
    try:
        server = sluice_factory(tmp_path / "data", env={"SLUICE_KAFKA__ADVERTISED_PORT": str(proxy.port)})
        server.start()
        await asyncio.to_thread(_create_topic, server, 2)
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
    finally:
        proxy.stop()
