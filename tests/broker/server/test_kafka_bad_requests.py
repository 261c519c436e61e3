"""Requests Kafka cannot decode, sent over real sockets to the listener on port 0.

Kafka's generated readers refuse a null (-1) array where the schema does not allow null ("non-nullable
field X was serialized as null"); the broker turns that into InvalidRequestException and closes the
connection. Sluice does the same, with one WARNING line and no traceback; other connections go on.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey, decode_response_body
from broker.protocol.kafka_codes import ErrorCode
from broker.server import handlers_produce, kafka
from broker.server.kafka import KafkaServer, KafkaServerConfig
from broker.server.stats import UNKNOWN_API
from sluice.front_metrics import KafkaCollector
from tests.broker.server.raw_client import RawClient

NULL_ARRAY = struct.pack(">i", -1)


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


# (API, version, body whose first array is null); each body is otherwise complete for that version.
NULL_ARRAY_REQUESTS = [
    (ApiKey.CREATE_TOPICS, 2, NULL_ARRAY + struct.pack(">ib", 1000, 0)),
    (ApiKey.DESCRIBE_CONFIGS, 1, NULL_ARRAY + b"\x00"),
    (ApiKey.DELETE_TOPICS, 1, NULL_ARRAY + struct.pack(">i", 1000)),
    (ApiKey.DESCRIBE_GROUPS, 0, NULL_ARRAY),
    (ApiKey.LIST_OFFSETS, 1, struct.pack(">i", -1) + NULL_ARRAY),
    (ApiKey.PRODUCE, 3, struct.pack(">hhi", -1, 1, 1000) + NULL_ARRAY),
    # Produce is read by its own decoder (records as views): a null topic name, a null partition list
    (ApiKey.PRODUCE, 3, struct.pack(">hhiih", -1, 1, 1000, 1, -1) + struct.pack(">i", 0)),
    (ApiKey.PRODUCE, 3, struct.pack(">hhii", -1, 1, 1000, 1) + _string("t") + NULL_ARRAY),
    (ApiKey.JOIN_GROUP, 0, _string("g") + struct.pack(">i", 10_000) + _string("") + _string("consumer") + NULL_ARRAY),
    (ApiKey.SYNC_GROUP, 0, _string("g") + struct.pack(">i", 1) + _string("m") + NULL_ARRAY),
    # nested: one CreateTopics topic whose assignments array is null
    (ApiKey.CREATE_TOPICS, 2, struct.pack(">i", 1) + _string("t") + struct.pack(">ih", 1, 1) + NULL_ARRAY
     + struct.pack(">i", 0) + struct.pack(">ib", 1000, 0)),
]


@pytest.fixture
async def server() -> AsyncIterator[KafkaServer]:
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    srv = KafkaServer(MemoryLogStore(default_partitions=1), coordinator, KafkaServerConfig(port=0))
    await srv.start()
    yield srv
    await srv.stop()
    await coordinator.stop()


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">hhi", api_key, version, correlation_id) + _string("bad-client") + body
    return struct.pack(">i", len(payload)) + payload


async def _api_versions_ok(port: int) -> bool:
    other = await RawClient.connect(port)
    try:
        resp = await other.request(ApiKey.API_VERSIONS, 0, {})
        return int(resp.error_code) == ErrorCode.NONE
    finally:
        await other.close()


@pytest.mark.parametrize(("api_key", "version", "body"), NULL_ARRAY_REQUESTS,
                         ids=[f"{ApiKey(k).name}-v{v}-{i}" for i, (k, v, _) in enumerate(NULL_ARRAY_REQUESTS)])
async def test_null_array_closes_the_connection_with_one_warning(
    server: KafkaServer, caplog: pytest.LogCaptureFixture, api_key: int, version: int, body: bytes
) -> None:
    client = await RawClient.connect(server.port)
    with caplog.at_level(logging.WARNING):
        client.writer.write(_frame(api_key, version, 5, body))
        assert await client.closed_by_server()
        while server._connections:  # the connection task logs before it ends
            await asyncio.sleep(0.01)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "was serialized as null" in warnings[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert server.stats.closed_bad_input == 1
    assert await _api_versions_ok(server.port)
    await client.close()


async def test_unknown_api_keys_share_one_metric_series(server: KafkaServer) -> None:
    client = await RawClient.connect(server.port)
    for corr, key in enumerate((99, 1000, 32000), start=1):
        client.writer.write(_frame(key, 0, corr, b""))
        assert struct.unpack(">ih", await client.next_frame()) == (corr, ErrorCode.UNSUPPORTED_VERSION)
    await client.close()
    assert server.stats.requests == {UNKNOWN_API: 3}
    series = {
        sample.labels["api"]: sample.value
        for family in KafkaCollector(server.stats).collect() if family.name == "sluice_kafka_requests"
        for sample in family.samples
    }
    assert series == {"unknown": 3}


async def test_a_failing_handler_is_answered_unknown_server_error_and_the_connection_goes_on(
    server: KafkaServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug inside a handler: answered as Kafka does (UNKNOWN_SERVER_ERROR in every error code of that
    API's response), logged once with its traceback, counted; the connection keeps working."""

    async def broken_metadata(*args: Any) -> Any:
        raise RuntimeError("injected handler bug")

    def broken_produce(*args: Any) -> Any:
        async def finish() -> Any:
            raise RuntimeError("injected bug after the append")
        return finish()

    monkeypatch.setitem(kafka._HANDLERS, ApiKey.METADATA, broken_metadata)
    monkeypatch.setattr(handlers_produce, "handle_produce", broken_produce)
    client = await RawClient.connect(server.port)
    with caplog.at_level(logging.WARNING):
        meta = await client.request(ApiKey.METADATA, 8, {
            "topics": [{"name": "a"}, {"name": "b"}], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False})
        assert [(t.name, int(t.error_code)) for t in meta.topics] == [
            ("a", ErrorCode.UNKNOWN_SERVER_ERROR), ("b", ErrorCode.UNKNOWN_SERVER_ERROR)]
        produced = await client.request(ApiKey.PRODUCE, 8, {
            "transactional_id": None, "acks": -1, "timeout": 5000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x"}]}]})
        assert [(p.index, p.error_code) for p in produced.topics[0].partitions] == [
            (0, ErrorCode.UNKNOWN_SERVER_ERROR)]
        assert await _api_versions_ok(server.port)
        versions = await client.request(ApiKey.API_VERSIONS, 0, {})
        assert int(versions.error_code) == ErrorCode.NONE
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors] == [
        "METADATA v8 request failed; answered UNKNOWN_SERVER_ERROR",
        "PRODUCE v8 request failed; answered UNKNOWN_SERVER_ERROR",
    ]
    assert all(r.exc_info for r in errors)  # a bug: its traceback is logged, once
    assert server.stats.errors[ErrorCode.UNKNOWN_SERVER_ERROR] == 3
    await client.close()


async def test_join_group_with_a_32_kib_client_id_is_answered(
        server: KafkaServer, caplog: pytest.LogCaptureFixture) -> None:
    """The header's client id may have 32 767 bytes; the member id made from it must still fit the
    JoinGroup answer's string (before: the answer failed to encode, the connection died with a
    traceback and the client never heard back)."""
    client_id = "c" * 0x7FFF
    body = (_string("long-client") + struct.pack(">i", 10_000) + _string("") + _string("consumer")
            + struct.pack(">i", 1) + _string("range") + struct.pack(">i", 0))
    payload = struct.pack(">hhi", ApiKey.JOIN_GROUP, 0, 7) + _string(client_id) + body
    client = await RawClient.connect(server.port)
    with caplog.at_level(logging.WARNING):
        client.writer.write(struct.pack(">i", len(payload)) + payload)
        corr, answer = decode_response_body(ApiKey.JOIN_GROUP, 0, await client.next_frame(), False)
    assert corr == 7 and int(answer.error_code) == ErrorCode.NONE
    assert answer.member_id.startswith("c" * 32_000) and len(answer.member_id.encode()) <= 0x7FFF
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    await client.close()
