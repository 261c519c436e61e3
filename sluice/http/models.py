"""Request and response bodies of the HTTP API (they make up the OpenAPI schema at /docs)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from broker.protocol.records import Record
from sluice.http.limits import INT32_MAX, INT64_MAX

__all__ = [
    "FetchResponse",
    "GroupDetail",
    "GroupPartitionLag",
    "GroupSummary",
    "PartitionInfo",
    "ProduceRecord",
    "ProduceRequest",
    "ProduceResponse",
    "ProducedOffset",
    "RecordOut",
    "TopicConfigUpdate",
    "TopicCreate",
    "TopicDetail",
    "TopicSummary",
    "ValueFormat",
    "decode_value",
    "encode_value",
    "record_out",
]

ValueFormat = Literal["json", "text", "base64"]
OutFormat = Literal["auto", "json", "text", "base64"]


# ---------------------------------------------------------------- topics


class TopicCreate(BaseModel):
    name: str = Field(description="1–249 characters of ASCII letters, digits, '.', '_' and '-'.")
    partitions: int | None = Field(
        None, strict=True, description="Partition count (default: storage.default_partitions)."
    )
    config: dict[str, str] = Field(
        default_factory=dict, description="Kafka-named topic configs, e.g. {'retention.ms': '3600000'}."
    )


class TopicConfigUpdate(BaseModel):
    config: dict[str, str] = Field(description="Kafka-named topic configs to set.")


class TopicSummary(BaseModel):
    name: str
    partitions: int
    internal: bool = False


class PartitionInfo(BaseModel):
    partition: int
    log_start_offset: int
    high_watermark: int
    size_bytes: int


class TopicDetail(BaseModel):
    name: str
    internal: bool
    created_ms: int
    partitions: list[PartitionInfo]
    config: dict[str, str]


# ---------------------------------------------------------------- records


def _utf8(text: str) -> str:
    """JSON text may spell a lone surrogate ("\\ud800"); the UTF-8 stored in a record cannot hold one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid UTF-8 text ({exc.reason} at position {exc.start})") from None
    return text


Utf8Str = Annotated[str, AfterValidator(_utf8)]


class ProduceRecord(BaseModel):
    key: Utf8Str | None = Field(None, description="UTF-8 key; records with the same key go to the same partition.")
    value: Any = Field(None, description="With value_format=json any JSON value; text/base64 take a string.")
    headers: dict[Utf8Str, Utf8Str] = Field(default_factory=dict)
    partition: int | None = Field(
        None, ge=0, le=INT32_MAX, strict=True, description="Explicit partition (else by key, else sticky)."
    )
    timestamp: int | None = Field(
        None, ge=-1, le=INT64_MAX, strict=True, description="Event time in ms since the epoch (null or -1: now)."
    )


class ProduceRequest(BaseModel):
    records: list[ProduceRecord] = Field(min_length=1, max_length=10_000)
    value_format: ValueFormat = Field(
        "json", description="How `value` becomes bytes: json (serialised compactly), text (UTF-8), base64."
    )


class ProducedOffset(BaseModel):
    partition: int
    offset: int


class ProduceResponse(BaseModel):
    topic: str
    offsets: list[ProducedOffset] = Field(description="One entry per record, in request order.")


class RecordOut(BaseModel):
    partition: int
    offset: int
    timestamp: int
    key: str | None
    value: Any
    value_format: ValueFormat
    headers: dict[str, str | None]


class FetchResponse(BaseModel):
    topic: str
    partition: int
    records: list[RecordOut]
    next_offset: int = Field(description="Pass this as `offset` to read on.")
    high_watermark: int
    last_stable_offset: int = Field(
        description="Where read_committed reads stop: the first offset of the oldest open transaction "
        "(the high watermark when none is open)")
    log_start_offset: int


# ---------------------------------------------------------------- groups


class GroupSummary(BaseModel):
    group_id: str
    state: str | None = None
    protocol_type: str | None = None
    members: int | None = None


class GroupPartitionLag(BaseModel):
    topic: str
    partition: int
    committed_offset: int | None
    high_watermark: int
    lag: int | None = Field(description="Records between the committed offset and the end of the partition.")
    event_time_lag_ms: int | None = Field(
        description="Event time of the newest record minus that of the last committed one (None if unknown)."
    )
    member_id: str | None = None


class GroupDetail(BaseModel):
    group_id: str
    state: str | None = None
    protocol_type: str | None = None
    protocol: str | None = None
    members: list[dict[str, Any]] = Field(default_factory=list)
    partitions: list[GroupPartitionLag] = Field(default_factory=list)
    total_lag: int = 0


# ---------------------------------------------------------------- value codecs


def encode_value(value: Any, fmt: ValueFormat) -> bytes | None:
    """The bytes stored for a produced ``value``; raises ValueError with a reason."""
    if fmt == "json":
        if value is None:
            return None
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"value_format={fmt} needs string values, got {type(value).__name__}")
    if fmt == "text":
        return value.encode()
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"value is not valid base64: {exc}") from None


def decode_value(data: bytes | None, fmt: OutFormat) -> tuple[Any, ValueFormat]:
    """A JSON-friendly view of stored bytes and the format it is in (``auto`` picks the best)."""
    if data is None:
        return None, "json" if fmt in ("auto", "json") else fmt  # type: ignore[return-value]
    if fmt in ("auto", "json"):
        try:
            return json.loads(data), "json"
        except (ValueError, UnicodeDecodeError):
            if fmt == "json":
                raise ValueError("record value is not JSON; ask for format=auto, text or base64") from None
    if fmt in ("auto", "text"):
        try:
            return data.decode(), "text"
        except UnicodeDecodeError:
            if fmt == "text":
                raise ValueError("record value is not UTF-8 text; ask for format=auto or base64") from None
    return base64.b64encode(data).decode(), "base64"


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")


def record_out(partition: int, record: Record, fmt: OutFormat) -> RecordOut:
    value, used = decode_value(record.value, fmt)
    return RecordOut(
        partition=partition,
        offset=record.offset,
        timestamp=record.timestamp,
        key=_text(record.key),
        value=value,
        value_format=used,
        headers={k: _text(v) for k, v in record.headers},
    )
