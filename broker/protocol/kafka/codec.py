"""Requests in, responses out: the API table, request decoding and response encoding.

Chosen by measurement (``python -m bench.bench_kafka_codec``; figures in bench/RESULTS.md):
requests of every API are decoded by kio (dataclasses generated from Kafka's own message schemas,
``clients/src/main/resources/common/message/*.json``, with a native reader that measured 3-9x
faster than hand-written ``struct`` decoding), except Produce, read into kio's classes by
``produce.read_produce_request`` so that its records stay views of the request buffer; Produce
and Fetch responses are encoded by the hand-written ``struct`` codecs in ``produce.py``/``fetch.py``
(1.3x and 16x faster than kio's writer), every other response by kio's writer.

Handlers build cold-path responses as plain mappings (field names as kio spells them, durations
in milliseconds as ints); ``build_entity`` turns a mapping into the kio class of the negotiated
version, dropping fields that version does not have.
"""

from __future__ import annotations

import datetime
import enum
import io
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema as _load_request_schema
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_reader, entity_writer

from broker.protocol.kafka import fetch, produce
from broker.protocol.kafka.bounds import check_compact_lengths
from broker.protocol.kafka.errors import MalformedRequestError, UnsupportedRequestError
from broker.protocol.kafka.header import (
    RequestHeader,
    decode_request_header,
    encode_request_header,
    encode_response_header,
    peek_api,
)

__all__ = [
    "API_VERSIONS_KEY",
    "SUPPORTED_APIS",
    "api_versions_body",
    "ApiKey",
    "ApiSpec",
    "Request",
    "build_entity",
    "decode_request",
    "decode_response_body",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "encode_unsupported_version",
    "is_flexible",
]


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


API_VERSIONS_KEY = int(ApiKey.API_VERSIONS)


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: ApiKey
    min_version: int
    max_version: int


SUPPORTED_APIS: dict[int, ApiSpec] = {
    spec.key: spec
    for spec in (
        ApiSpec(ApiKey.PRODUCE, 3, 8),
        ApiSpec(ApiKey.FETCH, 4, 11),
        ApiSpec(ApiKey.LIST_OFFSETS, 1, 5),
        ApiSpec(ApiKey.METADATA, 0, 8),
        ApiSpec(ApiKey.OFFSET_COMMIT, 2, 7),
        ApiSpec(ApiKey.OFFSET_FETCH, 1, 7),  # v6: flexible; v7: require_stable (v8+ ask for several groups)
        ApiSpec(ApiKey.FIND_COORDINATOR, 0, 2),
        ApiSpec(ApiKey.JOIN_GROUP, 0, 5),
        ApiSpec(ApiKey.HEARTBEAT, 0, 3),
        ApiSpec(ApiKey.LEAVE_GROUP, 0, 3),
        ApiSpec(ApiKey.SYNC_GROUP, 0, 3),
        ApiSpec(ApiKey.DESCRIBE_GROUPS, 0, 4),
        ApiSpec(ApiKey.LIST_GROUPS, 0, 5),  # v4: states filter and each group's state; v5: types (KIP-848)
        ApiSpec(ApiKey.SASL_HANDSHAKE, 0, 1),  # v0: raw SASL tokens follow; librdkafka's feature check needs it
        ApiSpec(ApiKey.SASL_AUTHENTICATE, 0, 2),
        ApiSpec(ApiKey.API_VERSIONS, 0, 4),  # v4: v3's schema (what kafka-python asks first)
        ApiSpec(ApiKey.CREATE_TOPICS, 2, 5),
        ApiSpec(ApiKey.DELETE_TOPICS, 1, 3),
        ApiSpec(ApiKey.DELETE_RECORDS, 0, 2),
        ApiSpec(ApiKey.INIT_PRODUCER_ID, 0, 4),
        ApiSpec(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3),
        ApiSpec(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3),
        ApiSpec(ApiKey.END_TXN, 0, 3),
        ApiSpec(ApiKey.TXN_OFFSET_COMMIT, 0, 3),
        ApiSpec(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0),
        ApiSpec(ApiKey.DESCRIBE_PRODUCERS, 0, 0),
        ApiSpec(ApiKey.LIST_TRANSACTIONS, 0, 1),
        ApiSpec(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4),  # v0-1 are gone from Kafka 4 (and from kio)
        ApiSpec(ApiKey.DESCRIBE_CONFIGS, 1, 4),
        ApiSpec(ApiKey.ALTER_CONFIGS, 0, 2),
        ApiSpec(ApiKey.CREATE_PARTITIONS, 0, 3),
        ApiSpec(ApiKey.DESCRIBE_LOG_DIRS, 1, 4),  # v0 is gone from Kafka 4 (and from kio)
        ApiSpec(ApiKey.DELETE_GROUPS, 0, 2),
        ApiSpec(ApiKey.ELECT_LEADERS, 0, 2),
        ApiSpec(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0),
        ApiSpec(ApiKey.OFFSET_DELETE, 0, 0),
        ApiSpec(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1),
        ApiSpec(ApiKey.DESCRIBE_ACLS, 1, 3),  # v0 (no pattern types) is gone from Kafka 4 and from kio
        ApiSpec(ApiKey.CREATE_ACLS, 1, 3),
        ApiSpec(ApiKey.DELETE_ACLS, 1, 3),
        ApiSpec(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0),
        ApiSpec(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0),
    )
}


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any  # the kio request dataclass of the negotiated version


def is_flexible(api_key: int, version: int) -> bool:
    if api_key in (ApiKey.PRODUCE, ApiKey.FETCH):
        return False  # our Produce/Fetch ranges stop below their first flexible version
    return bool(load_request_schema(api_key, version).__flexible__)


def _check_supported(api_key: int, version: int, correlation_id: int) -> ApiSpec:
    spec = SUPPORTED_APIS.get(api_key)
    if spec is None:
        raise UnsupportedRequestError(
            f"unknown API key {api_key}", api_key=api_key, api_version=version, correlation_id=correlation_id
        )
    if not spec.min_version <= version <= spec.max_version:
        raise UnsupportedRequestError(
            f"{spec.key.name} v{version} is not supported (v{spec.min_version}-v{spec.max_version} are)",
            api_key=api_key,
            api_version=version,
            correlation_id=correlation_id,
        )
    return spec


@cache
def load_request_schema(api_key: int, version: int) -> Any:
    """kio's request class, looked up once (kio resolves the module path by name on every call: about a
    twentieth of the broker's CPU at 1 MB Produce requests, py-spy, bench/RESULTS.md)."""
    return _with_plain_int64_durations(_load_request_schema(api_key, version))


_KIO_CLASS_VARS = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")


def _with_plain_int64_durations(cls: type) -> type:
    """``cls``, or a copy whose top-level int64 durations are read as plain ints.

    kio reads an int64 duration (OffsetCommit v2-v4's ``retention_time_ms``) into a timedelta, and its
    native reader fails from about 9.2e15 ms on (microseconds past int64), while Kafka takes any int64
    there; such a request must not close the connection. The handler gets the milliseconds as an int.
    """
    if not any(f.metadata.get("kafka_type") == "timedelta_i64" for f in fields(cls)):
        return cls
    hints = typing.get_type_hints(cls)
    specs: list[tuple[str, Any, Any]] = []
    for f in fields(cls):
        if f.metadata.get("kafka_type") == "timedelta_i64":
            specs.append((f.name, int, field(metadata={"kafka_type": "int64"}, default=-1)))
            continue
        default: dict[str, Any] = {}
        if f.default is not MISSING:
            default["default"] = f.default
        if f.default_factory is not MISSING:
            default["default_factory"] = f.default_factory
        specs.append((f.name, hints[f.name], field(metadata=f.metadata, **default)))
    namespace = {name: getattr(cls, name) for name in _KIO_CLASS_VARS}
    return make_dataclass(cls.__name__, specs, namespace=namespace, frozen=True, slots=True, kw_only=True)


@cache
def _reader(cls: type) -> Callable[[Any, int], tuple[Any, int]]:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Callable[[Any, Any], None]:
    return entity_writer(cls)


@cache
def _produce_classes(cls: type) -> tuple[type, type]:
    """kio's topic and partition classes of a Produce request version."""
    topic = typing.get_args(typing.get_type_hints(cls)["topic_data"])[0]
    return topic, typing.get_args(typing.get_type_hints(topic)["partition_data"])[0]


def decode_request(frame: bytes | memoryview) -> Request:
    """Decode one frame (without its size prefix).

    Raises UnsupportedRequestError (answer UNSUPPORTED_VERSION) or MalformedRequestError (close).
    """
    api_key, version, corr = peek_api(frame)
    _check_supported(api_key, version, corr)
    header, pos = decode_request_header(frame, is_flexible(api_key, version))
    cls = load_request_schema(api_key, version)
    try:
        if api_key == ApiKey.PRODUCE:  # records as views of the frame, not kio's copies (produce.py)
            return Request(header, produce.read_produce_request(frame, pos, cls, *_produce_classes(cls)))
        if header.flexible:
            check_compact_lengths(cls, frame, pos)  # before kio reserves memory for a lying length
        body, _size = _reader(cls)(frame, pos)
    except MalformedRequestError as exc:
        raise MalformedRequestError(f"cannot decode {ApiKey(api_key).name} v{version} request: {exc}") from exc
    except Exception as exc:  # kio's reader raises its own types on short or bad input
        raise MalformedRequestError(
            f"cannot decode {ApiKey(api_key).name} v{version} request: {type(exc).__name__}: {exc}"
        ) from exc
    null_field = _first_null_field(cls, body)
    if null_field is not None:
        raise MalformedRequestError(
            f"cannot decode {ApiKey(api_key).name} v{version} request: "
            f"non-nullable field {null_field} was serialized as null"
        )
    return Request(header, body)


# kio reads a null (-1) array, string or bytes as None whether or not the schema allows null there.
# Kafka's generated readers refuse it ("non-nullable field X was serialized as null"), the broker turns
# that into InvalidRequestException and closes the connection; so do we, instead of handing None to
# a handler that iterates it. Per class: (field, nullable, nested entity class or None).
_FieldRule = tuple[str, bool, type | None]


@cache
def _field_rules(cls: type) -> tuple[_FieldRule, ...]:
    rules: list[_FieldRule] = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
        if nullable:
            hint = next(a for a in args if a is not type(None))
        inner = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint
        nested = inner if isinstance(inner, type) and is_dataclass(inner) else None
        rules.append((f.name, nullable, nested))
    return tuple(rules)


def _first_null_field(cls: type, entity: Any) -> str | None:
    """The dotted name of the first non-nullable field that holds None, if any."""
    for name, nullable, nested in _field_rules(cls):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return name
            continue
        if nested is None:
            continue
        for item in value if isinstance(value, tuple) else (value,):
            inner = _first_null_field(nested, item)
            if inner is not None:
                return f"{name}.{inner}"
    return None


# ---------------------------------------------------------------- building kio entities


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(args[0], value)
    if origin is tuple:
        inner = typing.get_args(hint)[0]
        return tuple(_convert(inner, item) for item in value)
    if isinstance(hint, type):
        if is_dataclass(hint):
            if isinstance(value, hint):
                return value
            return build_entity(hint, value)
        if hint is KioErrorCode:
            return KioErrorCode(int(value))
        if issubclass(hint, datetime.datetime) and isinstance(value, int):
            # kio's timestamp fields (TZAware | None): -1 on the wire is None
            return None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
        if hint is datetime.timedelta or issubclass(hint, datetime.timedelta):
            return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=int(value))
    return value


def build_entity(cls: type, data: Mapping[str, Any] | Any) -> Any:
    """The kio dataclass ``cls`` filled from ``data``; keys the version lacks are ignored,
    fields it has but ``data`` lacks take their schema default (lists: empty)."""
    if is_dataclass(data) and not isinstance(data, type):
        data = {f.name: getattr(data, f.name) for f in fields(data)}
    assert isinstance(data, Mapping)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
        elif f.default is MISSING and f.default_factory is MISSING:
            if typing.get_origin(hints[f.name]) is tuple:
                kwargs[f.name] = ()  # an absent list is an empty one
                continue
            raise KeyError(f"{cls.__module__}.{cls.__name__} needs field {f.name!r}")
    return cls(**kwargs)


# ---------------------------------------------------------------- responses


def _encode_body(api_key: int, version: int, body: Any) -> bytes:
    if api_key == ApiKey.PRODUCE:
        return produce.encode_produce_response(body, version)
    if api_key == ApiKey.FETCH:
        return fetch.encode_fetch_response(body, version)
    cls = load_response_schema(api_key, version)
    entity = body if isinstance(body, cls) else build_entity(cls, body)
    buf = io.BytesIO()
    _writer(cls)(buf, entity)
    return buf.getvalue()


def encode_response_parts(header: RequestHeader, body: Any) -> list[bytes]:
    """The response frame as buffers for a vectored write; Fetch record bytes are not copied."""
    if header.api_key != ApiKey.FETCH:
        return [encode_response(header, body)]
    parts = fetch.encode_fetch_response_parts(body, header.api_version)
    head = encode_response_header(header.correlation_id, False)
    size = len(head) + sum(len(p) for p in parts)
    return [size.to_bytes(4, "big", signed=True) + head, *parts]


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """The whole response frame (size prefix, header, body) answering ``header``."""
    flexible = header.flexible and header.api_key != ApiKey.API_VERSIONS
    payload = encode_response_header(header.correlation_id, flexible) + _encode_body(
        header.api_key, header.api_version, body
    )
    return len(payload).to_bytes(4, "big", signed=True) + payload


def api_versions_body(error_code: int = 0) -> dict[str, Any]:
    return {
        "error_code": error_code,
        "api_keys": [
            {"api_key": int(s.key), "min_version": s.min_version, "max_version": s.max_version}
            for s in sorted(SUPPORTED_APIS.values(), key=lambda s: s.key)
        ],
        "throttle_time": 0,
    }


def encode_unsupported_version(api_key: int, version: int, correlation_id: int) -> bytes:
    """UNSUPPORTED_VERSION for a key/version we do not serve.

    ApiVersions gets a v0 body listing what we serve (what clients expect when they ask too high);
    any other API gets the correlation id and the error code, the only fields every version shares.
    """
    if api_key == ApiKey.API_VERSIONS:
        payload = encode_response_header(correlation_id, False) + _encode_body(
            API_VERSIONS_KEY, 0, api_versions_body(35)
        )
    else:
        payload = encode_response_header(correlation_id, False) + (35).to_bytes(2, "big")
    return len(payload).to_bytes(4, "big", signed=True) + payload


# ---------------------------------------------------------------- client side (tests, benchmarks)


def encode_request(header: RequestHeader, body: Any) -> bytes:
    """A request frame as a client sends it (size prefix included)."""
    key, version = header.api_key, header.api_version
    if isinstance(body, produce.ProduceRequest):
        raw = produce.encode_produce_request(body, version)
    elif isinstance(body, fetch.FetchRequest):
        raw = fetch.encode_fetch_request(body, version)
    else:
        cls = load_request_schema(key, version)
        entity = body if isinstance(body, cls) else build_entity(cls, body)
        buf = io.BytesIO()
        _writer(cls)(buf, entity)
        raw = buf.getvalue()
    payload = encode_request_header(header) + raw
    return len(payload).to_bytes(4, "big", signed=True) + payload


def decode_response_body(api_key: int, version: int, frame: bytes, flexible: bool) -> tuple[int, Any]:
    """``(correlation_id, body)`` of a response frame (without size prefix)."""
    corr = int.from_bytes(frame[:4], "big", signed=True)
    pos = 4
    if flexible and api_key != ApiKey.API_VERSIONS:
        pos += 1  # empty tagged fields
    if api_key == ApiKey.PRODUCE:
        return corr, produce.decode_produce_response(frame, pos, version)
    if api_key == ApiKey.FETCH:
        return corr, fetch.decode_fetch_response(frame, pos, version)
    body, _ = _reader(load_response_schema(api_key, version))(frame, pos)
    return corr, body
