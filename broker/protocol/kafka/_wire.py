"""Primitive readers and writers for the hand-written (hot path) codecs: big-endian ints and
classic (non-flexible) strings, bytes and arrays. Readers take ``(buf, pos)`` and return
``(value, new_pos)``; running off the end raises MalformedRequestError."""

from __future__ import annotations

import struct

from broker.protocol.kafka.errors import MalformedRequestError

__all__ = [
    "I8",
    "I16",
    "I32",
    "I64",
    "read_array_len",
    "read_bytes",
    "read_i8",
    "read_i16",
    "read_i32",
    "read_i64",
    "read_string",
    "write_bytes",
    "write_string",
]

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


def _check(buf: bytes | memoryview, end: int) -> None:
    if end > len(buf):
        raise MalformedRequestError(f"request truncated: needs {end} bytes, has {len(buf)}")


def read_i8(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    _check(buf, pos + 1)
    return I8.unpack_from(buf, pos)[0], pos + 1


def read_i16(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    _check(buf, pos + 2)
    return I16.unpack_from(buf, pos)[0], pos + 2


def read_i32(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    _check(buf, pos + 4)
    return I32.unpack_from(buf, pos)[0], pos + 4


def read_i64(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    _check(buf, pos + 8)
    return I64.unpack_from(buf, pos)[0], pos + 8


def read_string(buf: bytes | memoryview, pos: int) -> tuple[str | None, int]:
    size, pos = read_i16(buf, pos)
    if size < 0:
        return None, pos
    _check(buf, pos + size)
    return bytes(buf[pos : pos + size]).decode("utf-8", "replace"), pos + size


def read_bytes(buf: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    size, pos = read_i32(buf, pos)
    if size < 0:
        return None, pos
    _check(buf, pos + size)
    return bytes(buf[pos : pos + size]), pos + size


def read_array_len(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Element count of a classic array (-1 = null, returned as -1); sanity-checked against the buffer."""
    count, pos = read_i32(buf, pos)
    if count > len(buf) - pos:
        raise MalformedRequestError(f"array of {count} elements cannot fit in the {len(buf) - pos} bytes left")
    return count, pos


def write_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += I16.pack(-1)
        return
    raw = value.encode()
    out += I16.pack(len(raw))
    out += raw


def write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += I32.pack(-1)
        return
    out += I32.pack(len(value))
    out += value
