"""MQTT wire primitives shared by the codec: variable byte integers, strings, binary data, MQTT 5 properties.

Decoders take ``(buf, pos, end)`` and return ``(value, next_pos)``; they raise ``MalformedPacket`` (0x81)
for bytes that cannot be decoded and ``ProtocolError`` (0x82) for a property that is not allowed where it
appears or is repeated when it may not be (MQTT 5.0 §2.2.2.2).
"""

from __future__ import annotations

import struct
from typing import Any

from ingest.mqtt.errors import EncodeError, MalformedPacket, ProtocolError
from ingest.mqtt.packets import (
    ALLOWED_PROPERTIES,
    NO_PROPERTIES,
    PROPERTY_SPECS,
    REPEATABLE,
    PacketType,
    Properties,
    PropType,
)

__all__ = [
    "MAX_REMAINING_LENGTH",
    "U16",
    "U32",
    "binary",
    "decode_properties",
    "decode_varint",
    "enc_bin",
    "enc_str",
    "encode_properties",
    "encode_varint",
    "u16",
    "utf8",
]

MAX_REMAINING_LENGTH = 268_435_455  # four varint bytes (§1.5.5)
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
_FIELDS_IN_ORDER = [(name, pid, kind) for pid, (name, kind) in sorted(PROPERTY_SPECS.items())]


# ---------------------------------------------------------------------------------------------- primitives
def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise EncodeError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a variable byte integer at ``pos``; returns (value, next position). Raises when malformed."""
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= end:
            raise MalformedPacket("truncated variable byte integer")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def utf8(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise MalformedPacket("truncated string length")
    (n,) = U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > end:
        raise MalformedPacket("string runs past the packet")
    try:
        text = buf[pos : pos + n].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket("string is not well-formed UTF-8") from exc
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text, pos + n


def binary(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("truncated binary length")
    (n,) = U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > end:
        raise MalformedPacket("binary data runs past the packet")
    return bytes(buf[pos : pos + n]), pos + n


def u16(buf: bytes, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise MalformedPacket("truncated two-byte integer")
    return int(U16.unpack_from(buf, pos)[0])


def enc_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise EncodeError("string longer than 65535 bytes")
    return U16.pack(len(raw)) + raw


def enc_bin(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise EncodeError("binary data longer than 65535 bytes")
    return U16.pack(len(data)) + data


# ---------------------------------------------------------------------------------------------- properties
def decode_properties(buf: bytes, pos: int, end: int, where: PacketType | str) -> tuple[Properties, int]:
    length, pos = decode_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise MalformedPacket("properties run past the packet")
    if length == 0:
        return NO_PROPERTIES, pos
    allowed = ALLOWED_PROPERTIES[where]
    values: dict[str, Any] = {}
    while pos < stop:
        pid, pos = decode_varint(buf, pos, stop)
        spec = PROPERTY_SPECS.get(pid)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02x}")
        if pid not in allowed:
            raise ProtocolError(f"property 0x{pid:02x} not allowed in {where}", 0x82)
        name, kind = spec
        value: Any
        if kind is PropType.BYTE:
            if pos >= stop:
                raise MalformedPacket("truncated byte property")
            value = buf[pos]
            pos += 1
        elif kind is PropType.TWO:
            value = u16(buf, pos, stop)
            pos += 2
        elif kind is PropType.FOUR:
            if pos + 4 > stop:
                raise MalformedPacket("truncated four-byte property")
            value = U32.unpack_from(buf, pos)[0]
            pos += 4
        elif kind is PropType.VARINT:
            value, pos = decode_varint(buf, pos, stop)
        elif kind is PropType.UTF8:
            value, pos = utf8(buf, pos, stop)
        elif kind is PropType.BINARY:
            value, pos = binary(buf, pos, stop)
        else:
            key, pos = utf8(buf, pos, stop)
            val, pos = utf8(buf, pos, stop)
            value = (key, val)
        if pid in REPEATABLE:
            values[name] = (*values.get(name, ()), value)
        elif name in values:
            raise ProtocolError(f"property 0x{pid:02x} appears twice", 0x82)
        else:
            values[name] = value
    return Properties(**values), pos


def encode_properties(props: Properties, where: PacketType | str) -> bytes:
    if props is NO_PROPERTIES:
        return b"\x00"
    allowed = ALLOWED_PROPERTIES[where]
    out = bytearray()
    for name, pid, kind in _FIELDS_IN_ORDER:
        value = getattr(props, name)
        if value is None or value == ():
            continue
        if pid not in allowed:
            raise EncodeError(f"property {name} not allowed in {where}")
        items = value if pid in REPEATABLE else (value,)
        for item in items:
            out += encode_varint(pid)
            if kind is PropType.BYTE:
                out.append(item)
            elif kind is PropType.TWO:
                out += U16.pack(item)
            elif kind is PropType.FOUR:
                out += U32.pack(item)
            elif kind is PropType.VARINT:
                out += encode_varint(item)
            elif kind is PropType.UTF8:
                out += enc_str(item)
            elif kind is PropType.BINARY:
                out += enc_bin(item)
            else:
                out += enc_str(item[0]) + enc_str(item[1])
    return encode_varint(len(out)) + bytes(out)
