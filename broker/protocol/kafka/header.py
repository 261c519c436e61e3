"""Request and response headers.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id nullable string.
Request header v2 (flexible request versions): v1 followed by tagged fields (the client_id stays a
classic int16-length string). Response header v0: correlation_id int32; v1 (flexible responses) adds
an empty tagged-field section. ApiVersions responses always use header v0 so that a client which
does not yet know our versions can read the error code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.protocol.kafka.errors import MalformedRequestError

__all__ = [
    "RequestHeader",
    "decode_request_header",
    "encode_request_header",
    "encode_response_header",
    "peek_api",
    "skip_tagged_fields",
]

_PREFIX = struct.Struct(">hhi")
_CORR = struct.Struct(">i")
_STRLEN = struct.Struct(">h")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    flexible: bool = False


def peek_api(frame: bytes | memoryview) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a frame, or MalformedRequestError."""
    if len(frame) < 8:
        raise MalformedRequestError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, corr = _PREFIX.unpack_from(frame, 0)
    return key, version, corr


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(buf):
            raise MalformedRequestError("truncated unsigned varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedRequestError("unsigned varint longer than 5 bytes")


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise MalformedRequestError("tagged field runs past the end of the request")
    return pos


def decode_request_header(frame: bytes | memoryview, flexible: bool) -> tuple[RequestHeader, int]:
    """Parse the header; returns it and the position where the request body starts."""
    key, version, corr = peek_api(frame)
    pos = 8
    if len(frame) < pos + 2:
        raise MalformedRequestError("request header ends before its client id")
    (size,) = _STRLEN.unpack_from(frame, pos)
    pos += 2
    client_id: str | None = None
    if size >= 0:
        if pos + size > len(frame):
            raise MalformedRequestError("client id runs past the end of the request")
        client_id = bytes(frame[pos : pos + size]).decode("utf-8", "replace")
        pos += size
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(key, version, corr, client_id, flexible), pos


def encode_request_header(header: RequestHeader) -> bytes:
    """Client side of the header (tests and benchmarks build requests with it)."""
    out = bytearray(_PREFIX.pack(header.api_key, header.api_version, header.correlation_id))
    if header.client_id is None:
        out += _STRLEN.pack(-1)
    else:
        raw = header.client_id.encode()
        out += _STRLEN.pack(len(raw)) + raw
    if header.flexible:
        out.append(0)
    return bytes(out)


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    return _CORR.pack(correlation_id) + (b"\x00" if flexible else b"")
