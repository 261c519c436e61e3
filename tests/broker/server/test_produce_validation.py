"""Produce refuses batches Kafka refuses, over real sockets, with Kafka's codes and v8 record errors;
real clients' batches (every codec) still go through."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cramjam
import crc32c
import pytest

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.config import TopicConfig
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import Compression, RecordSpec, encode_batch
from broker.server.kafka import KafkaServer, KafkaServerConfig
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.raw_client import RawClient
from tests.broker.server.test_kafka_server import fetch_values, produce, produce_body, records, server

__all__ = ["server"]  # the fixture, shared with test_kafka_server


def _reseal(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


async def test_a_batch_claiming_a_million_offsets_for_one_record_is_refused(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    assert (await produce(client, records(b"first"))).base_offset == 0
    liar = bytearray(records(b"only-one"))
    struct.pack_into(">i", liar, 23, 1_000_000)  # last_offset_delta
    resp = await produce(client, _reseal(liar))
    assert resp.error_code == ErrorCode.INVALID_RECORD
    assert "1000000" in (resp.error_message or "")
    assert server.ctx.store.partition("t", 0).high_watermark == 1  # no offsets taken
    assert (await produce(client, records(b"next"))).base_offset == 1
    assert await fetch_values(client) == [b"first", b"next"]
    await client.close()


async def test_record_errors_name_the_bad_records_in_produce_v8(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    batch = bytearray(encode_batch([RecordSpec(b"a"), RecordSpec(b"b"), RecordSpec(b"c")]))
    second = 61 + 1 + batch[61] // 2
    batch[second + 3] = 2 * 7  # the second record's offset delta: 7 instead of 1
    resp = await produce(client, _reseal(batch))
    assert resp.error_code == ErrorCode.INVALID_RECORD
    assert [(index, message) for index, message in resp.record_errors] == [(1, "offset delta 7, expected 1")]
    assert resp.error_message

    append_time = bytearray(records(b"x", b"y"))
    append_time[22] |= 0x08  # LogAppendTime is the broker's to set
    resp = await produce(client, _reseal(append_time))
    assert resp.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [index for index, _ in resp.record_errors] == [0, 1]
    assert server.ctx.store.partition("t", 0).high_watermark == 0
    await client.close()


async def test_a_compressed_bomb_is_answered_message_too_large(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    payload = bytes(cramjam.zstd.compress(bytes(1 << 20))) * 1024  # 1 GiB of zeros in ~54 KiB
    after_crc = struct.pack(">hiqqqhii", int(Compression.ZSTD), 0, 0, 0, -1, -1, -1, 1) + payload
    bomb = struct.pack(">qiibI", 0, 49 + len(payload), 0, 2, crc32c.crc32c(after_crc)) + after_crc
    resp = await produce(client, bomb)
    assert resp.error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert "decompress" in (resp.error_message or "")
    assert (await produce(client, records(b"still-serving"))).error_code == ErrorCode.NONE
    await client.close()


def test_real_clients_compressed_batches_pass_validation(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    """librdkafka with each codec, and aiokafka's snappy (Java's xerial framing), produce and read back."""
    from aiokafka import AIOKafkaProducer
    from confluent_kafka import Consumer, Producer

    server = sluice_factory(tmp_path / "data")
    server.start()
    expected: list[bytes] = []
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for codec in ("gzip", "snappy", "lz4", "zstd"):
        producer = Producer({"bootstrap.servers": server.bootstrap, "compression.type": codec, "linger.ms": 5,
                             "enable.idempotence": True})
        for i in range(500):
            value = b"%s-%d-" % (codec.encode(), i) + b"payload " * 20
            expected.append(value)
            producer.produce("codecs", value, key=b"k%d" % (i % 7), on_delivery=delivered)
        assert producer.flush(30) == 0
        assert failures == []

    async def aiokafka_snappy() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=server.bootstrap, compression_type="snappy", linger_ms=5)
        await producer.start()
        try:
            for i in range(200):
                value = b"aiokafka-%d" % i
                expected.append(value)
                await producer.send("codecs", value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(aiokafka_snappy())
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "codecs", "auto.offset.reset": "earliest"})
    consumer.subscribe(["codecs"])
    got: list[bytes] = []
    try:
        while len(got) < len(expected):
            message = consumer.poll(10)
            assert message is not None, f"{len(got)} of {len(expected)} records read back"
            assert message.error() is None, message.error()
            read = message.value()
            assert read is not None
            got.append(read)
    finally:
        consumer.close()
    assert sorted(got) == sorted(expected)
    assert "rejected record batch" not in server.log_text()


@pytest.fixture
async def local_server() -> AsyncIterator[KafkaServer]:
    """Advertised at 127.0.0.1, for a real client to connect to in-process."""
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    srv = KafkaServer(MemoryLogStore(default_partitions=1), coordinator,
                      KafkaServerConfig(port=0, advertised_host="127.0.0.1"))
    await srv.start()
    yield srv
    await srv.stop()
    await coordinator.stop()


async def test_a_compacted_topic_refuses_keyless_records_from_librdkafka(local_server: KafkaServer) -> None:
    """confluent-kafka produces one keyed and one keyless record to a compacted topic: Kafka refuses
    the keyless one's batch with INVALID_RECORD, and so does Sluice."""
    from confluent_kafka import KafkaError, Producer

    local_server.ctx.store.create_topic("compacted", 1, TopicConfig().with_kafka_configs({"cleanup.policy": "compact"}))
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{local_server.port}", "linger.ms": 0, "retries": 0,
                         "enable.idempotence": False})
    reports: dict[bytes, int] = {}

    def delivered(err: KafkaError | None, msg: Any) -> None:
        reports[msg.value()] = err.code() if err is not None else 0

    producer.produce("compacted", b"keyed", key=b"k", on_delivery=delivered)
    assert await asyncio.to_thread(producer.flush, 10) == 0
    producer.produce("compacted", b"keyless", on_delivery=delivered)
    assert await asyncio.to_thread(producer.flush, 10) == 0
    assert reports == {b"keyed": 0, b"keyless": KafkaError.INVALID_RECORD}
    assert local_server.ctx.store.partition("compacted", 0).high_watermark == 1


async def test_zstd_needs_produce_v7_as_in_kafka(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    zstd = encode_batch([RecordSpec(b"squeezed")], compression=Compression.ZSTD)
    old = await client.request(ApiKey.PRODUCE, 5, produce_body(zstd))
    assert old.topics[0].partitions[0].error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert (await produce(client, zstd)).error_code == ErrorCode.NONE  # v8
    assert await fetch_values(client) == [b"squeezed"]
    await client.close()
