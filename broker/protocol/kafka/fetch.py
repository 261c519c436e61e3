"""Fetch (API key 1) v4–11, hand-written with ``struct`` (the hot read path; see bench/RESULTS.md).

Request: replica_id int32, max_wait_ms int32, min_bytes int32, max_bytes int32, isolation_level int8,
session_id int32 (v7+), session_epoch int32 (v7+), topics [topic string, partitions [partition int32,
current_leader_epoch int32 (v9+), fetch_offset int64, log_start_offset int64 (v5+),
partition_max_bytes int32]], forgotten_topics_data [topic string, partitions [int32]] (v7+),
rack_id string (v11+).
Response: throttle_time_ms int32, error_code int16 (v7+), session_id int32 (v7+), responses [topic
string, partitions [partition_index int32, error_code int16, high_watermark int64,
last_stable_offset int64, log_start_offset int64 (v5+), aborted_transactions nullable
[producer_id int64, first_offset int64], preferred_read_replica int32 (v11+), records nullable bytes]].
The stored batch bytes go into ``records`` untouched.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.protocol.kafka._wire import (
    I8,
    I16,
    I32,
    I64,
    read_array_len,
    read_bytes,
    read_i8,
    read_i16,
    read_i32,
    read_i64,
    read_string,
    write_string,
)

__all__ = [
    "FetchPartition",
    "FetchPartitionResponse",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchTopicResponse",
    "decode_fetch_request",
    "decode_fetch_response",
    "encode_fetch_request",
    "encode_fetch_response",
    "encode_fetch_response_parts",
]

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 11
_PART_HEAD = struct.Struct(">ihqqq")  # index, error, hw, lso, log start


@dataclass(frozen=True, slots=True)
class FetchPartition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchTopic:
    topic: str
    partitions: tuple[FetchPartition, ...]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: tuple[FetchTopic, ...]
    session_id: int = 0
    session_epoch: int = -1
    forgotten: tuple[tuple[str, tuple[int, ...]], ...] = ()
    rack_id: str = ""


@dataclass(frozen=True, slots=True)
class FetchPartitionResponse:
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes | None
    preferred_read_replica: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True, slots=True)
class FetchTopicResponse:
    topic: str
    partitions: tuple[FetchPartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class FetchResponse:
    topics: tuple[FetchTopicResponse, ...]
    throttle_time_ms: int = 0
    error_code: int = 0
    session_id: int = 0


def decode_fetch_request(buf: bytes | memoryview, pos: int, version: int) -> FetchRequest:
    replica, pos = read_i32(buf, pos)
    max_wait, pos = read_i32(buf, pos)
    min_bytes, pos = read_i32(buf, pos)
    max_bytes, pos = read_i32(buf, pos)
    isolation, pos = read_i8(buf, pos)
    session_id, session_epoch = 0, -1
    if version >= 7:
        session_id, pos = read_i32(buf, pos)
        session_epoch, pos = read_i32(buf, pos)
    ntopics, pos = read_array_len(buf, pos)
    topics: list[FetchTopic] = []
    for _ in range(max(ntopics, 0)):
        name, pos = read_string(buf, pos)
        nparts, pos = read_array_len(buf, pos)
        parts: list[FetchPartition] = []
        for _p in range(max(nparts, 0)):
            partition, pos = read_i32(buf, pos)
            leader_epoch = -1
            if version >= 9:
                leader_epoch, pos = read_i32(buf, pos)
            offset, pos = read_i64(buf, pos)
            start = -1
            if version >= 5:
                start, pos = read_i64(buf, pos)
            pmax, pos = read_i32(buf, pos)
            parts.append(FetchPartition(partition, offset, pmax, leader_epoch, start))
        topics.append(FetchTopic(name or "", tuple(parts)))
    forgotten: list[tuple[str, tuple[int, ...]]] = []
    if version >= 7:
        nforgot, pos = read_array_len(buf, pos)
        for _ in range(max(nforgot, 0)):
            name, pos = read_string(buf, pos)
            count, pos = read_array_len(buf, pos)
            ids = []
            for _i in range(max(count, 0)):
                pid, pos = read_i32(buf, pos)
                ids.append(pid)
            forgotten.append((name or "", tuple(ids)))
    rack = ""
    if version >= 11:
        rack_value, pos = read_string(buf, pos)
        rack = rack_value or ""
    return FetchRequest(
        replica, max_wait, min_bytes, max_bytes, isolation, tuple(topics), session_id, session_epoch,
        tuple(forgotten), rack,
    )


def encode_fetch_request(req: FetchRequest, version: int) -> bytes:
    out = bytearray(I32.pack(req.replica_id) + I32.pack(req.max_wait_ms) + I32.pack(req.min_bytes))
    out += I32.pack(req.max_bytes) + I8.pack(req.isolation_level)
    if version >= 7:
        out += I32.pack(req.session_id) + I32.pack(req.session_epoch)
    out += I32.pack(len(req.topics))
    for topic in req.topics:
        write_string(out, topic.topic)
        out += I32.pack(len(topic.partitions))
        for p in topic.partitions:
            out += I32.pack(p.partition)
            if version >= 9:
                out += I32.pack(p.current_leader_epoch)
            out += I64.pack(p.fetch_offset)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            out += I32.pack(p.partition_max_bytes)
    if version >= 7:
        out += I32.pack(len(req.forgotten))
        for name, ids in req.forgotten:
            write_string(out, name)
            out += I32.pack(len(ids))
            for i in ids:
                out += I32.pack(i)
    if version >= 11:
        write_string(out, req.rack_id)
    return bytes(out)


def encode_fetch_response_parts(resp: FetchResponse, version: int) -> list[bytes]:
    """The response body as a list of buffers: small encoded pieces and the stored record bytes
    as they are (no copy), for a vectored socket write."""
    parts: list[bytes] = []
    out = bytearray(I32.pack(resp.throttle_time_ms))
    if version >= 7:
        out += I16.pack(resp.error_code) + I32.pack(resp.session_id)
    out += I32.pack(len(resp.topics))
    for topic in resp.topics:
        write_string(out, topic.topic)
        out += I32.pack(len(topic.partitions))
        for p in topic.partitions:
            if version >= 5:
                out += _PART_HEAD.pack(p.partition, p.error_code, p.high_watermark, p.last_stable_offset,
                                       p.log_start_offset)
            else:
                out += _PART_HEAD.pack(p.partition, p.error_code, p.high_watermark, p.last_stable_offset, 0)[:-8]
            if p.aborted_transactions is None:
                out += I32.pack(-1)
            else:
                out += I32.pack(len(p.aborted_transactions))
                for producer_id, first_offset in p.aborted_transactions:
                    out += I64.pack(producer_id) + I64.pack(first_offset)
            if version >= 11:
                out += I32.pack(p.preferred_read_replica)
            if p.records is None:
                out += I32.pack(-1)
            else:
                out += I32.pack(len(p.records))
                if len(p.records) > 4096:
                    parts.append(bytes(out))
                    parts.append(p.records)
                    out = bytearray()
                else:
                    out += p.records
    if out:
        parts.append(bytes(out))
    return parts


def encode_fetch_response(resp: FetchResponse, version: int) -> bytes:
    return b"".join(encode_fetch_response_parts(resp, version))


def decode_fetch_response(buf: bytes | memoryview, pos: int, version: int) -> FetchResponse:
    throttle, pos = read_i32(buf, pos)
    error, session = 0, 0
    if version >= 7:
        error, pos = read_i16(buf, pos)
        session, pos = read_i32(buf, pos)
    ntopics, pos = read_array_len(buf, pos)
    topics: list[FetchTopicResponse] = []
    for _ in range(ntopics):
        name, pos = read_string(buf, pos)
        nparts, pos = read_array_len(buf, pos)
        parts: list[FetchPartitionResponse] = []
        for _p in range(nparts):
            index, pos = read_i32(buf, pos)
            perr, pos = read_i16(buf, pos)
            hw, pos = read_i64(buf, pos)
            lso, pos = read_i64(buf, pos)
            start = -1
            if version >= 5:
                start, pos = read_i64(buf, pos)
            naborted, pos = read_array_len(buf, pos)
            aborted: list[tuple[int, int]] | None = None if naborted < 0 else []
            for _a in range(max(naborted, 0)):
                producer_id, pos = read_i64(buf, pos)
                first, pos = read_i64(buf, pos)
                assert aborted is not None
                aborted.append((producer_id, first))
            replica = -1
            if version >= 11:
                replica, pos = read_i32(buf, pos)
            records, pos = read_bytes(buf, pos)
            parts.append(FetchPartitionResponse(
                index, perr, hw, lso, start, records, replica, None if aborted is None else tuple(aborted)
            ))
        topics.append(FetchTopicResponse(name or "", tuple(parts)))
    return FetchResponse(tuple(topics), throttle, error, session)
