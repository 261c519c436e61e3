"""The Kafka listener in-process on port 0, driven over real sockets: bad input, idempotence,
acks=0, long-poll fetch, ListOffsets and Metadata's advertised address."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from broker.server.kafka import KafkaServer, KafkaServerConfig
from tests.broker.server.raw_client import RawClient

MAX_REQUEST = 64 * 1024


@pytest.fixture
async def server() -> AsyncIterator[KafkaServer]:
    store = MemoryLogStore(default_partitions=1)
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    srv = KafkaServer(store, coordinator, KafkaServerConfig(port=0, advertised_host="sluice.example",
                                                            max_request_bytes=MAX_REQUEST))
    await srv.start()
    yield srv
    await srv.stop()
    await coordinator.stop()


def produce_body(batch: bytes, topic: str = "t", acks: int = -1) -> dict[str, Any]:
    return {"transactional_id": None, "acks": acks, "timeout": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


def fetch_body(offset: int, max_wait: int = 0, topic: str = "t", min_bytes: int = 1) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": max_wait, "min_bytes": min_bytes, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                         "fetch_offset": offset, "log_start_offset": -1,
                                                         "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


METADATA_ALL = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}


async def produce(client: RawClient, batch: bytes, topic: str = "t") -> Any:
    resp = await client.request(ApiKey.PRODUCE, 8, produce_body(batch, topic))
    return resp.topics[0].partitions[0]


def records(*values: bytes, **kw: Any) -> bytes:
    return encode_batch([RecordSpec(v) for v in values], **kw)


async def fetch_values(client: RawClient, topic: str = "t") -> list[bytes | None]:
    resp = await client.request(ApiKey.FETCH, 11, fetch_body(0, topic=topic))
    return [r.value for r in decode_all(bytes(resp.topics[0].partitions[0].records))]


async def _assert_others_unaffected(server: KafkaServer, good: RawClient) -> None:
    other = await RawClient.connect(server.port)
    meta = await other.request(ApiKey.METADATA, 8, METADATA_ALL)
    assert [t.name for t in meta.topics] == ["t"]
    assert await fetch_values(good) == [b"kept-1", b"kept-2"]
    await other.close()


@pytest.mark.parametrize(
    ("name", "payload", "log_fragment"),
    [
        # Metadata v8 header whose client id claims 32767 bytes in a 12-byte frame
        ("garbage", struct.pack(">i", 12) + b"\x00\x03\x00\x08\x00\x00\x00\x09\x7f\xff\xab\xcd",
         "closing Kafka connection"),
        ("oversized", struct.pack(">i", MAX_REQUEST + 1) + b"\x00" * 100, "exceeds the maximum request size"),
        ("negative length", struct.pack(">i", -1) + b"\x00" * 8, "negative frame length"),
        ("truncated", struct.pack(">i", 1000) + b"\x00\x03\x00\x08", "truncated frame"),
    ],
)
async def test_bad_frames_close_only_that_connection(
    server: KafkaServer, caplog: pytest.LogCaptureFixture, name: str, payload: bytes, log_fragment: str
) -> None:
    good = await RawClient.connect(server.port)
    assert (await produce(good, records(b"kept-1", b"kept-2"))).error_code == ErrorCode.NONE
    bad = await RawClient.connect(server.port)
    with caplog.at_level(logging.WARNING, logger="broker.server.kafka"):
        bad.writer.write(payload)
        if name == "truncated":
            bad.writer.write_eof()
        assert await bad.closed_by_server()
        deadline = time.monotonic() + 5
        while not any(log_fragment in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING):
            assert time.monotonic() < deadline, f"no WARNING containing {log_fragment!r}"
            await asyncio.sleep(0.01)
    await _assert_others_unaffected(server, good)
    await bad.close()
    await good.close()


async def test_unknown_api_key_and_version_are_answered_unsupported(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    client.writer.write(struct.pack(">ihhih", 10, 99, 0, 31, -1))  # API key 99, no body
    frame = await client.next_frame()
    assert struct.unpack(">ih", frame) == (31, ErrorCode.UNSUPPORTED_VERSION)
    client.writer.write(struct.pack(">ihhih", 10, ApiKey.API_VERSIONS, 7, 32, -1))  # ApiVersions v7
    corr, body = await client.receive(ApiKey.API_VERSIONS, 0)
    assert corr == 32 and int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
    assert any(k.api_key == ApiKey.PRODUCE and k.max_version == 8 for k in body.api_keys)
    versions = await client.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                             "client_software_version": "1"})
    assert int(versions.error_code) == 0  # the connection still works
    await client.close()


async def test_bad_crc_is_answered_corrupt_message_and_not_stored(
    server: KafkaServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = await RawClient.connect(server.port)
    assert (await produce(client, records(b"kept-1", b"kept-2"))).error_code == ErrorCode.NONE
    bad = bytearray(records(b"flipped"))
    bad[-1] ^= 0xFF
    with caplog.at_level(logging.WARNING, logger="broker.server.kafka"):
        resp = await produce(client, bytes(bad))
    assert resp.error_code == ErrorCode.CORRUPT_MESSAGE
    assert "CRC mismatch" in (resp.error_message or "")
    assert any("rejected record batch" in r.getMessage() for r in caplog.records)
    assert server.ctx.store.partition("t", 0).high_watermark == 2
    await _assert_others_unaffected(server, client)
    wrong_magic = bytearray(records(b"x"))
    wrong_magic[16] = 1  # Kafka: Produce v3+ takes magic 2 only (INVALID_RECORD); unknown magic is corrupt
    assert (await produce(client, bytes(wrong_magic))).error_code == ErrorCode.INVALID_RECORD
    wrong_magic[16] = 7
    assert (await produce(client, bytes(wrong_magic))).error_code == ErrorCode.CORRUPT_MESSAGE
    await client.close()


async def test_idempotent_retry_is_not_appended_twice(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    init = await client.request(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout": 1000})
    pid, epoch = init.producer_id, init.producer_epoch
    assert pid >= 0 and int(init.error_code) == 0

    def batch(seq: int, *values: bytes, ep: int = epoch) -> bytes:
        return records(*values, producer_id=pid, producer_epoch=ep, base_sequence=seq)

    first = await produce(client, batch(0, b"a", b"b"))
    second = await produce(client, batch(2, b"c"))
    assert (first.error_code, first.base_offset, second.base_offset) == (0, 0, 2)
    retry = await produce(client, batch(0, b"a", b"b"))
    assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 0)
    gap = await produce(client, batch(7, b"z"))
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (await produce(client, batch(3, b"d", ep=epoch + 1))).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (await produce(client, batch(0, b"e", ep=epoch + 1))).base_offset == 3
    assert (await produce(client, batch(4, b"old", ep=epoch))).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert await fetch_values(client) == [b"a", b"b", b"c", b"e"]
    await client.close()


async def test_acks_zero_gets_no_response(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    client.send(ApiKey.PRODUCE, 8, produce_body(records(b"fire-and-forget"), acks=0))
    corr = client.send(ApiKey.METADATA, 8, METADATA_ALL)
    got, meta = await client.receive(ApiKey.METADATA, 8)
    assert got == corr  # the first answer is the metadata one
    assert [t.name for t in meta.topics] == ["t"]
    assert await fetch_values(client) == [b"fire-and-forget"]
    await client.close()


async def test_fetch_long_poll_is_woken_by_an_append_and_honours_max_wait(server: KafkaServer) -> None:
    consumer = await RawClient.connect(server.port)
    producer = await RawClient.connect(server.port)
    await produce(producer, records(b"first"))
    started = time.monotonic()
    empty = await consumer.request(ApiKey.FETCH, 11, fetch_body(1, max_wait=300))
    assert time.monotonic() - started >= 0.29
    part = empty.topics[0].partitions[0]
    assert (part.error_code, part.high_watermark, part.records) == (0, 1, b"")
    corr = consumer.send(ApiKey.FETCH, 11, fetch_body(1, max_wait=10_000))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await produce(producer, records(b"second"))
    got, woken = await consumer.receive(ApiKey.FETCH, 11)
    assert got == corr and time.monotonic() - started < 5
    part = woken.topics[0].partitions[0]
    assert part.high_watermark == 2 and part.last_stable_offset == 2 and part.preferred_read_replica == -1
    assert [r.value for r in decode_all(bytes(part.records))] == [b"second"]
    far = await consumer.request(ApiKey.FETCH, 11, fetch_body(50))
    assert far.topics[0].partitions[0].error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    await consumer.close()
    await producer.close()


async def test_fetch_returns_a_whole_batch_larger_than_max_bytes(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    big = records(*(b"x" * 1000 for _ in range(50)))
    await produce(client, big)
    body = fetch_body(0)
    body["max_bytes"] = 100
    body["topics"][0]["partitions"][0]["partition_max_bytes"] = 100
    resp = await client.request(ApiKey.FETCH, 11, body)
    assert bytes(resp.topics[0].partitions[0].records)[12:] == big[12:]
    await client.close()


async def test_list_offsets_and_advertised_metadata(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    await produce(client, records(b"old", timestamp=1_000_000))
    await produce(client, records(b"new", timestamp=2_000_000))

    async def offset_for(ts: int) -> int:
        resp = await client.request(ApiKey.LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}]}]})
        return int(resp.topics[0].partitions[0].offset)

    assert (await offset_for(-1), await offset_for(-2), await offset_for(1_500_000), await offset_for(3_000_000)) == (
        2, 0, 1, -1)
    meta = await client.request(ApiKey.METADATA, 8, METADATA_ALL)
    assert [(b.node_id, b.host, b.port) for b in meta.brokers] == [(0, "sluice.example", server.port)]
    assert meta.controller_id == 0
    assert [(p.partition_index, p.leader_id) for p in meta.topics[0].partitions] == [(0, 0)]
    await client.close()


async def test_auto_creation_off_answers_unknown_topic() -> None:
    store = MemoryLogStore(auto_create_topics=False)
    srv = KafkaServer(store, None, KafkaServerConfig(port=0))
    await srv.start()
    try:
        client = await RawClient.connect(srv.port)
        resp = await produce(client, records(b"nowhere"), topic="missing")
        assert resp.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        meta = await client.request(ApiKey.METADATA, 8, {**METADATA_ALL, "topics": [{"name": "missing"}],
                                                         "allow_auto_topic_creation": True})
        assert int(meta.topics[0].error_code) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert not store.has_topic("missing")
        await client.close()
    finally:
        await srv.stop()


async def test_a_failed_acks_zero_produce_closes_the_connection(server: KafkaServer) -> None:
    # Kafka closes the socket when an acks=0 produce fails (there is no answer to carry the error), so the
    # producer notices and refreshes its metadata; answers of the requests before it are still written.
    client = await RawClient.connect(server.port)
    corr = client.send(ApiKey.METADATA, 8, METADATA_ALL)
    corrupt = bytearray(records(b"bad crc"))
    corrupt[-1] ^= 0xFF
    client.send(ApiKey.PRODUCE, 8, produce_body(bytes(corrupt), acks=0))
    got, _ = await client.receive(ApiKey.METADATA, 8)
    assert got == corr
    assert await asyncio.wait_for(client.reader.read(), 5) == b""  # closed by the broker, nothing more sent
    assert server.stats.acks_zero_closed == 1
    await client.close()
    other = await RawClient.connect(server.port)
    assert await fetch_values(other) == []  # the corrupt batch was not stored
    await other.close()
