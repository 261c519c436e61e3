"""Produce (API key 0) v3–8, hand-written with ``struct`` (measured faster than kio and
kafka-python's protocol module, see bench/RESULTS.md).

The broker reads requests with ``read_produce_request`` into the classes it is given (kio's, so the
handlers see one request shape for every API): each partition's records come out as a slice of the
request buffer (a view of it when it is a ``memoryview``), never a copy — kio's reader copied every
Produce request's records once more.

Request v3+: transactional_id nullable string, acks int16, timeout_ms int32,
topic_data [name string, partition_data [index int32, records nullable bytes]].
Response: responses [name string, partition_responses [index int32, error_code int16,
base_offset int64, log_append_time_ms int64, log_start_offset int64 (v5+),
record_errors [batch_index int32, batch_index_error_message nullable string] (v8+),
error_message nullable string (v8+)]], throttle_time_ms int32.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.protocol.kafka._wire import (
    I16,
    I32,
    I64,
    read_array_len,
    read_bytes,
    read_i16,
    read_i32,
    read_i64,
    read_string,
    write_bytes,
    write_string,
)
from broker.protocol.kafka.errors import MalformedRequestError

__all__ = [
    "ProducePartition",
    "ProducePartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResponse",
    "decode_produce_request",
    "decode_produce_response",
    "encode_produce_request",
    "encode_produce_response",
    "read_produce_request",
]

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 8


@dataclass(frozen=True, slots=True)
class ProducePartition:
    index: int
    records: bytes | None


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    name: str
    partitions: tuple[ProducePartition, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[ProduceTopic, ...]


@dataclass(frozen=True, slots=True)
class ProducePartitionResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: tuple[tuple[int, str | None], ...] = ()
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ProduceTopicResponse:
    name: str
    partitions: tuple[ProducePartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    topics: tuple[ProduceTopicResponse, ...]
    throttle_time_ms: int = 0


def decode_produce_request(buf: bytes | memoryview, pos: int, version: int) -> ProduceRequest:
    txn, pos = read_string(buf, pos)
    acks, pos = read_i16(buf, pos)
    timeout, pos = read_i32(buf, pos)
    ntopics, pos = read_array_len(buf, pos)
    topics: list[ProduceTopic] = []
    for _ in range(max(ntopics, 0)):
        name, pos = read_string(buf, pos)
        nparts, pos = read_array_len(buf, pos)
        parts: list[ProducePartition] = []
        for _p in range(max(nparts, 0)):
            index, pos = read_i32(buf, pos)
            records, pos = read_bytes(buf, pos)
            parts.append(ProducePartition(index, records))
        topics.append(ProduceTopic(name or "", tuple(parts)))
    return ProduceRequest(txn, acks, timeout, tuple(topics))


def _name(buf: bytes | memoryview, pos: int, field: str) -> tuple[str | None, int]:
    """A string as Kafka's generated readers take it: UTF-8 or the request is refused."""
    size, pos = read_i16(buf, pos)
    if size < 0:
        return None, pos
    end = pos + size
    if end > len(buf):
        raise MalformedRequestError(f"request truncated: needs {end} bytes, has {len(buf)}")
    try:
        return str(buf[pos:end], "utf-8"), end
    except UnicodeDecodeError as exc:
        raise MalformedRequestError(f"field {field} is not valid UTF-8") from exc


def _non_null(field: str) -> MalformedRequestError:
    return MalformedRequestError(f"non-nullable field {field} was serialized as null")


def read_produce_request(
    buf: bytes | memoryview, pos: int, request: Callable[..., Any], topic: Callable[..., Any],
    partition: Callable[..., Any],
) -> Any:
    """The request body after its header, built with ``request(transactional_id=, acks=, timeout=,
    topic_data=)``, ``topic(name=, partition_data=)`` and ``partition(index=, records=)`` (kio's field
    names; ``timeout`` a ``timedelta``). Records are ``buf[a:b]``: no copy when ``buf`` is a view.
    Raises ``MalformedRequestError`` for a truncated request, a null where Kafka allows none, or a
    name that is not UTF-8 (what Kafka's readers refuse, with their wording)."""
    txn, pos = _name(buf, pos, "transactional_id")
    acks, pos = read_i16(buf, pos)
    timeout_ms, pos = read_i32(buf, pos)
    ntopics, pos = read_array_len(buf, pos)
    if ntopics < 0:
        raise _non_null("topic_data")
    topics = []
    for _ in range(ntopics):
        name, pos = _name(buf, pos, "topic_data.name")
        if name is None:
            raise _non_null("topic_data.name")
        nparts, pos = read_array_len(buf, pos)
        if nparts < 0:
            raise _non_null("topic_data.partition_data")
        parts = []
        for _p in range(nparts):
            index, pos = read_i32(buf, pos)
            size, pos = read_i32(buf, pos)
            records = None
            if size >= 0:
                if pos + size > len(buf):
                    raise MalformedRequestError(f"request truncated: needs {pos + size} bytes, has {len(buf)}")
                records = buf[pos : pos + size]
                pos += size
            parts.append(partition(index=index, records=records))
        topics.append(topic(name=name, partition_data=tuple(parts)))
    return request(transactional_id=txn, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
                   topic_data=tuple(topics))


def encode_produce_request(req: ProduceRequest, version: int) -> bytes:
    out = bytearray()
    write_string(out, req.transactional_id)
    out += I16.pack(req.acks)
    out += I32.pack(req.timeout_ms)
    out += I32.pack(len(req.topics))
    for topic in req.topics:
        write_string(out, topic.name)
        out += I32.pack(len(topic.partitions))
        for part in topic.partitions:
            out += I32.pack(part.index)
            write_bytes(out, part.records)
    return bytes(out)


def encode_produce_response(resp: ProduceResponse, version: int) -> bytes:
    out = bytearray()
    out += I32.pack(len(resp.topics))
    for topic in resp.topics:
        write_string(out, topic.name)
        out += I32.pack(len(topic.partitions))
        for p in topic.partitions:
            out += I32.pack(p.index)
            out += I16.pack(p.error_code)
            out += I64.pack(p.base_offset)
            out += I64.pack(p.log_append_time_ms)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            if version >= 8:
                out += I32.pack(len(p.record_errors))
                for batch_index, message in p.record_errors:
                    out += I32.pack(batch_index)
                    write_string(out, message)
                write_string(out, p.error_message)
    out += I32.pack(resp.throttle_time_ms)
    return bytes(out)


def decode_produce_response(buf: bytes | memoryview, pos: int, version: int) -> ProduceResponse:
    ntopics, pos = read_array_len(buf, pos)
    topics: list[ProduceTopicResponse] = []
    for _ in range(ntopics):
        name, pos = read_string(buf, pos)
        nparts, pos = read_array_len(buf, pos)
        parts: list[ProducePartitionResponse] = []
        for _p in range(nparts):
            index, pos = read_i32(buf, pos)
            error, pos = read_i16(buf, pos)
            base, pos = read_i64(buf, pos)
            append_time, pos = read_i64(buf, pos)
            start = -1
            if version >= 5:
                start, pos = read_i64(buf, pos)
            errors: list[tuple[int, str | None]] = []
            message = None
            if version >= 8:
                nerr, pos = read_array_len(buf, pos)
                for _e in range(nerr):
                    bi, pos = read_i32(buf, pos)
                    msg, pos = read_string(buf, pos)
                    errors.append((bi, msg))
                message, pos = read_string(buf, pos)
            parts.append(ProducePartitionResponse(index, error, base, append_time, start, tuple(errors), message))
        topics.append(ProduceTopicResponse(name or "", tuple(parts)))
    throttle, pos = read_i32(buf, pos)
    return ProduceResponse(tuple(topics), throttle)
