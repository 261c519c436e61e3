"""Codec round trips without sockets, for every API and version the broker serves.

Requests: a client-side encoding, fed one byte at a time, decodes to the same dataclass.
Responses: what the broker's handlers answer encodes and decodes back unchanged; the hand-written
Produce/Fetch encoders are cross-checked against kio's reader (generated from Kafka's schemas).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import (
    SUPPORTED_APIS,
    ApiKey,
    FrameDecoder,
    MalformedRequestError,
    RequestHeader,
    UnsupportedRequestError,
    build_entity,
    decode_request,
    decode_response_body,
    encode_request,
    encode_response,
    encode_unsupported_version,
    is_flexible,
)
from broker.protocol.kafka import fetch as fetch_codec
from broker.protocol.kafka import produce as produce_codec
from broker.protocol.kafka.codec import load_request_schema  # kio's classes, int64 durations as ints
from broker.protocol.kafka_codes import ErrorCode
from broker.security import AclStore, Authorizer
from broker.server.handlers_common import BrokerContext, ConnectionInfo
from broker.server.kafka import handle_request
from tests.broker.protocol.kafka.samples import BATCH, SAMPLE_REQUESTS

CASES = [
    (key, v) for key, spec in sorted(SUPPORTED_APIS.items()) for v in range(spec.min_version, spec.max_version + 1)
]


def _ids(case: tuple[int, int]) -> str:
    return f"{ApiKey(case[0]).name}-v{case[1]}"


def test_every_served_api_has_a_sample() -> None:
    assert set(SAMPLE_REQUESTS) == set(SUPPORTED_APIS)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_request_round_trips_byte_by_byte(case: tuple[int, int]) -> None:
    key, version = case
    header = RequestHeader(key, version, 4242, "codec-test", is_flexible(key, version))
    frame = encode_request(header, SAMPLE_REQUESTS[key])
    decoder = FrameDecoder()
    frames: list[bytes] = []
    for i in range(len(frame)):
        frames += decoder.feed(frame[i : i + 1])
    assert len(frames) == 1
    request = decode_request(frames[0])
    assert request.header == header
    assert request.body == build_entity(load_request_schema(key, version), SAMPLE_REQUESTS[key])


async def _context() -> BrokerContext:
    store = MemoryLogStore(default_partitions=2)
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    return BrokerContext(store, coordinator, "broker.example", 19092)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@pytest.mark.parametrize("case", CASES, ids=_ids)
async def test_response_round_trips(case: tuple[int, int], tmp_path: Path) -> None:
    key, version = case
    ctx = await _context()
    ctx.authorizer = Authorizer(AclStore(tmp_path), ["ANONYMOUS"])  # the ACL APIs answer (SECURITY_DISABLED without)
    try:
        header = RequestHeader(key, version, 77, "codec-test", is_flexible(key, version))
        # Produce first so Fetch/ListOffsets/DescribeConfigs have a topic with data.
        await handle_request(ctx, decode_request(encode_request(
            RequestHeader(0, 8, 1, "setup", False), SAMPLE_REQUESTS[ApiKey.PRODUCE])[4:]),
            ConnectionInfo("127.0.0.1", 1))
        request = decode_request(encode_request(header, SAMPLE_REQUESTS[key])[4:])
        body = await handle_request(ctx, request, ConnectionInfo("127.0.0.1", 1))
        frame = encode_response(header, body)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        corr, decoded = decode_response_body(key, version, frame[4:], header.flexible)
        assert corr == 77
        if key in (ApiKey.PRODUCE, ApiKey.FETCH):
            # Fields the version lacks are dropped, so compare re-encoded bytes.
            assert encode_response(header, decoded) == frame
            # The same bytes read by kio's schema-generated reader give the same values.
            pos = 4
            kio_body: Any  # the schema class is picked by key and version at run time (kio types it as a Protocol)
            kio_body, end = entity_reader(load_response_schema(key, version))(frame[4:], pos)
            assert pos + end == len(frame) - 4
            if key == ApiKey.FETCH:
                part = kio_body.responses[0].partitions[0]
                assert (part.high_watermark, part.records) == (3, BATCH[:0] + part.records)
                assert bytes(part.records)[12:] == BATCH[12:]  # stored bytes untouched apart from base offset
            else:
                assert kio_body.responses[0].partition_responses[0].base_offset == 3
        else:
            assert decoded == build_entity(load_response_schema(key, version), body)
            # Members answer MEMBER_ID_REQUIRED / UNKNOWN_MEMBER_ID to a stranger, transactions
            # INVALID_PRODUCER_ID_MAPPING / TRANSACTIONAL_ID_NOT_FOUND (tests/broker/server/test_transactions.py),
            # OffsetDelete of a group nobody has GROUP_ID_NOT_FOUND (tests/broker/server/test_group_admin.py).
            stranger_apis = (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
                             ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN,
                             ApiKey.TXN_OFFSET_COMMIT, ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.OFFSET_DELETE)
            if key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
                # Outside a login (broker/server/sasl_gate.py) both are refused, as by Kafka's request handler.
                assert decoded.error_code == ErrorCode.ILLEGAL_SASL_STATE
            elif key not in stranger_apis:
                assert getattr(decoded, "error_code", 0) == 0
    finally:
        await ctx.coordinator.stop()


@pytest.mark.parametrize("version", range(3, 9))
def test_produce_response_encoder_matches_kafka_schema(version: int) -> None:
    resp = produce_codec.ProduceResponse((produce_codec.ProduceTopicResponse("t", (
        produce_codec.ProducePartitionResponse(0, 0, 10, -1, 3 if version >= 5 else -1),
        produce_codec.ProducePartitionResponse(1, 2, -1, -1, -1, error_message="bad crc" if version >= 8 else None),
    )),), throttle_time_ms=5)
    raw = produce_codec.encode_produce_response(resp, version)
    kio_resp: Any  # schema class picked by version at run time: kio can only type it as the Payload protocol
    kio_resp, end = entity_reader(load_response_schema(0, version))(raw, 0)
    assert end == len(raw)
    parts = kio_resp.responses[0].partition_responses
    assert [(p.index, int(p.error_code), p.base_offset) for p in parts] == [(0, 0, 10), (1, 2, -1)]
    assert produce_codec.decode_produce_response(raw, 0, version) == resp


@pytest.mark.parametrize("version", range(4, 12))
def test_fetch_codecs_match_kafka_schema(version: int) -> None:
    req = fetch_codec.FetchRequest(-1, 500, 1, 1000, 0, (fetch_codec.FetchTopic("t", (
        fetch_codec.FetchPartition(0, 42, 1 << 20, -1 if version < 9 else 3, -1 if version < 5 else 0),)),),
        rack_id="")
    raw = fetch_codec.encode_fetch_request(req, version)
    kio_req: Any  # schema class picked by version at run time: kio can only type it as the Payload protocol
    kio_req, end = entity_reader(load_request_schema(1, version))(raw, 0)
    assert end == len(raw) and kio_req.topics[0].partitions[0].fetch_offset == 42
    assert fetch_codec.decode_fetch_request(raw, 0, version) == req
    resp = fetch_codec.FetchResponse((fetch_codec.FetchTopicResponse("t", (
        fetch_codec.FetchPartitionResponse(0, 0, 9, 9, 0 if version >= 5 else -1, BATCH),
        fetch_codec.FetchPartitionResponse(1, 1, 4, 4, 0 if version >= 5 else -1, b""),
    )),))
    raw = fetch_codec.encode_fetch_response(resp, version)
    kio_resp: Any  # schema class picked by version at run time: kio can only type it as the Payload protocol
    kio_resp, end = entity_reader(load_response_schema(1, version))(raw, 0)
    assert end == len(raw)
    parts = kio_resp.responses[0].partitions
    assert [(p.partition_index, int(p.error_code), p.high_watermark, bytes(p.records)) for p in parts] == [
        (0, 0, 9, BATCH), (1, 1, 4, b"")]
    assert fetch_codec.decode_fetch_response(raw, 0, version) == resp


def test_unknown_api_key_and_version_raise_unsupported() -> None:
    frame = encode_request(RequestHeader(3, 8, 1, "x", False), SAMPLE_REQUESTS[ApiKey.METADATA])[4:]
    unknown_key = b"\x00\x63" + frame[2:]
    with pytest.raises(UnsupportedRequestError, match="unknown API key 99"):
        decode_request(unknown_key)
    too_new = frame[:2] + b"\x00\x0c" + frame[4:]
    with pytest.raises(UnsupportedRequestError, match="METADATA v12 is not supported"):
        decode_request(too_new)


def test_unsupported_api_versions_answer_lists_versions_in_v0() -> None:
    frame = encode_unsupported_version(ApiKey.API_VERSIONS, 9, 5)
    corr, body = decode_response_body(ApiKey.API_VERSIONS, 0, frame[4:], False)
    assert corr == 5 and int(body.error_code) == 35
    assert {a.api_key for a in body.api_keys} == set(SUPPORTED_APIS)


def test_truncated_request_is_malformed() -> None:
    frame = encode_request(RequestHeader(3, 8, 1, "x", False), SAMPLE_REQUESTS[ApiKey.METADATA])[4:]
    with pytest.raises(MalformedRequestError):
        decode_request(frame[:-3])
    with pytest.raises(MalformedRequestError):
        decode_request(frame[:5])


def _produce_frame(version: int = 8) -> bytes:
    return encode_request(RequestHeader(ApiKey.PRODUCE, version, 1, "x", False), SAMPLE_REQUESTS[ApiKey.PRODUCE])[4:]


def test_produce_records_are_views_of_the_request_buffer_not_copies() -> None:
    """A large request arrives as a view of its pooled buffer (FrameAssembler); its records reach the
    store from there (kio's reader copied them: a fresh megabyte per request)."""
    buffer = bytearray(_produce_frame())
    request = decode_request(memoryview(buffer).toreadonly())
    records = request.body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records.obj is buffer and bytes(records) == BATCH


def test_every_truncation_of_a_produce_request_is_malformed() -> None:
    frame = _produce_frame()
    for end in range(len(frame)):
        with pytest.raises(MalformedRequestError):
            decode_request(frame[:end])


def test_a_produce_topic_name_that_is_not_utf8_is_malformed() -> None:
    frame = _produce_frame().replace(b"\x00\x07samples", b"\x00\x07sample\xff")
    with pytest.raises(MalformedRequestError, match="UTF-8"):
        decode_request(frame)
