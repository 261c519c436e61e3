"""Fetch sizes as KIP-74 and Kafka's ReplicaManager.readFromLog define them: the response stays within
max_bytes and each partition within partition_max_bytes, except that the first partition with data gets
at least one whole batch. Exact byte counts over real sockets, and librdkafka with tight limits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.protocol.kafka import ApiKey
from broker.protocol.records import RecordSpec, encode_batch
from broker.server.kafka import KafkaServer
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.raw_client import RawClient
from tests.broker.server.test_kafka_server import produce, server

__all__ = ["server"]  # the fixture, shared with test_kafka_server

PARTITIONS = 6


def batch_of(size: int) -> bytes:
    """One single-record batch of exactly ``size`` bytes."""
    batch = encode_batch([RecordSpec(b"x" * (size - 100))])
    return encode_batch([RecordSpec(b"x" * (size - 100 - (len(batch) - size)))])


def fetch_all(max_bytes: int, partition_max_bytes: int, offsets: dict[int, int] | None = None) -> dict[str, Any]:
    offsets = offsets or {}
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "sized", "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": offsets.get(p, 0),
                 "log_start_offset": -1, "partition_max_bytes": partition_max_bytes} for p in range(PARTITIONS)]}],
            "forgotten_topics_data": [], "rack_id": ""}


async def sizes(client: RawClient, max_bytes: int, partition_max_bytes: int,
                offsets: dict[int, int] | None = None) -> list[int]:
    resp = await client.request(ApiKey.FETCH, 11, fetch_all(max_bytes, partition_max_bytes, offsets))
    return [len(p.records or b"") for p in resp.topics[0].partitions]


async def fill(server: KafkaServer, client: RawClient, batch_sizes: dict[int, list[int]]) -> None:
    server.ctx.store.create_topic("sized", PARTITIONS)
    for partition, sizes_ in batch_sizes.items():
        for size in sizes_:
            body = {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
                {"name": "sized", "partition_data": [{"index": partition, "records": batch_of(size)}]}]}
            resp = await client.request(ApiKey.PRODUCE, 8, body)
            assert resp.topics[0].partitions[0].error_code == 0


async def test_partitions_after_the_first_with_data_stay_within_the_budget(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    assert len(batch_of(10_000)) == 10_000
    await fill(server, client, {p: [10_000] * 3 for p in range(PARTITIONS)})
    # each partition may take 15,000 of the 25,000: one 10,000-byte batch for the first two, then
    # 5,000 left, less than a batch, for the rest (it used to be one batch each: 60,000)
    assert await sizes(client, 25_000, 15_000) == [10_000, 10_000, 0, 0, 0, 0]
    assert await sizes(client, 100_000, 25_000) == [20_000] * 5 + [0]
    assert await sizes(client, 100_000, 5_000) == [10_000, 0, 0, 0, 0, 0]  # only the first may exceed
    assert await sizes(client, 0, 1 << 20) == [10_000, 0, 0, 0, 0, 0]
    await client.close()


async def test_the_first_partition_with_data_gets_a_batch_larger_than_every_limit(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    await fill(server, client, {0: [1_000], 1: [50_000], 2: [1_000]})
    # partition 0 read from its end (no data): partition 1 is the first with data
    assert await sizes(client, 20_000, 20_000, {0: 1}) == [0, 50_000, 0, 0, 0, 0]
    assert await sizes(client, 20_000, 20_000) == [1_000, 0, 1_000, 0, 0, 0]
    await client.close()


async def test_out_of_range_is_still_reported_once_the_budget_is_spent(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    await fill(server, client, {0: [10_000]})
    resp = await client.request(ApiKey.FETCH, 11, fetch_all(5_000, 5_000, {3: 99}))
    parts = resp.topics[0].partitions
    assert len(parts[0].records) == 10_000
    assert parts[3].error_code == 1  # OFFSET_OUT_OF_RANGE
    assert (await produce(client, encode_batch([RecordSpec(b"v")]), topic="sized")).error_code == 0
    await client.close()


def test_librdkafka_with_tight_fetch_limits_over_many_partitions(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    """librdkafka refuses a response larger than receive.message.max.bytes (at least fetch.max.bytes
    + 512) and reconnects; with 140 KB batches and fetch.max.bytes 200,000, one extra batch per
    response used to do exactly that, in a loop."""
    from confluent_kafka import Consumer

    server = sluice_factory(tmp_path / "data", partitions=8)
    server.start()

    async def produce_batches() -> None:
        client = await RawClient.connect(server.port)
        for partition in range(8):
            for n in range(3):
                body = {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
                    {"name": "big", "partition_data": [
                        {"index": partition, "records": encode_batch([RecordSpec(b"%d-%d:" % (partition, n)
                                                                                 + b"x" * 140_000)])}]}]}
                resp = await client.request(ApiKey.PRODUCE, 8, body)
                assert resp.topics[0].partitions[0].error_code == 0
        await client.close()

    asyncio.run(produce_batches())
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "tight", "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 200_000, "max.partition.fetch.bytes": 160_000,
                         "receive.message.max.bytes": 200_512, "message.max.bytes": 180_000,
                         "fetch.wait.max.ms": 100})
    consumer.subscribe(["big"])
    got: set[bytes] = set()
    errors: list[str] = []
    try:
        for _ in range(200):
            message = consumer.poll(0.5)
            if message is None:
                if len(got) == 24:
                    break
                continue
            if message.error() is not None:
                errors.append(str(message.error()))
                break
            value = message.value()
            assert value is not None
            got.add(value.split(b":")[0])
            if len(got) == 24:
                break
    finally:
        consumer.close()
    assert errors == []
    assert got == {b"%d-%d" % (p, n) for p in range(8) for n in range(3)}
