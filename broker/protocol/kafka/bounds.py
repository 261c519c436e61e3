"""Length checks that run before kio's native reader on flexible (compact-encoded) requests.

kio's reader reserves room for a compact array from the length on the wire before it checks that the
bytes are there: a DescribeConfigs v4 frame whose array length is the varint ``fe ff ff ff 0f`` makes it
ask for 34 GB, the allocation fails and Rust aborts the whole broker (found by ``python -m bench.fuzz
kafka``). ``check_compact_lengths`` walks the request as the schema lays it out and refuses any compact
array, string, bytes or tagged field whose declared length cannot fit in the bytes that are left. Each
array element takes at least one byte, so the bound is exact enough to stop the allocation and never
refuses a well-formed request. Non-flexible (int32-counted) arrays are bounded by kio itself.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from functools import cache

from broker.protocol.kafka.errors import MalformedRequestError

__all__ = ["check_compact_lengths"]

_FIXED_WIDTH = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
    "error_code": 2,
}
_VARIABLE = frozenset({"string", "bytes", "records"})

# (field name, kafka_type or None for a nested entity, nested entity class or None, is an array)
_Field = tuple[str, str | None, type | None, bool]


@cache
def _layout(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out: list[_Field] = []
    for f in fields(cls):
        if f.metadata.get("tag") is not None:
            continue  # tagged fields travel in the tagged-field section, checked generically
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        is_array = typing.get_origin(hint) is tuple
        inner = typing.get_args(hint)[0] if is_array else hint
        nested = inner if isinstance(inner, type) and is_dataclass(inner) else None
        kafka_type = None if nested is not None else f.metadata.get("kafka_type")
        if nested is None and kafka_type not in _FIXED_WIDTH and kafka_type not in _VARIABLE:
            raise TypeError(f"{cls.__name__}.{f.name}: unknown kafka_type {kafka_type!r}")
        out.append((f.name, kafka_type, nested, is_array))
    return tuple(out)


class _Cursor:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

    def uvarint(self, what: str) -> int:
        value = shift = 0
        for _ in range(5):
            if self.pos >= self.end:
                raise MalformedRequestError(f"{what}: the request ends inside a varint")
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise MalformedRequestError(f"{what}: varint longer than 5 bytes")

    def skip(self, size: int, what: str) -> None:
        if size > self.end - self.pos:
            raise MalformedRequestError(
                f"{what}: declares {size} bytes but only {self.end - self.pos} remain in the request"
            )
        self.pos += size

    def count(self, what: str, compact: bool = True) -> int:
        """An element count (compact: length + 1, 0 = null), refused when the elements, a byte each at
        least, cannot fit in what is left."""
        n = self.uvarint(what) - (1 if compact else 0)
        if n > self.end - self.pos:
            raise MalformedRequestError(
                f"{what}: declares {n} elements but only {self.end - self.pos} bytes remain in the request"
            )
        return max(n, 0)


def _value(cur: _Cursor, kafka_type: str, what: str) -> None:
    width = _FIXED_WIDTH.get(kafka_type)
    if width is not None:
        cur.skip(width, what)
    else:  # compact string / bytes / records: length + 1, 0 = null
        cur.skip(max(cur.uvarint(what) - 1, 0), what)


def _entity(cur: _Cursor, cls: type, path: str) -> None:
    for name, kafka_type, nested, is_array in _layout(cls):
        what = f"{path}.{name}"
        if is_array:
            n = cur.count(what)
            if nested is not None:
                for _ in range(n):
                    _entity(cur, nested, what)
            elif kafka_type in _FIXED_WIDTH:
                cur.skip(n * _FIXED_WIDTH[kafka_type], what)
            else:
                assert kafka_type is not None
                for _ in range(n):
                    _value(cur, kafka_type, what)
        elif nested is not None:
            _entity(cur, nested, what)
        else:
            assert kafka_type is not None
            _value(cur, kafka_type, what)
    for _ in range(cur.count(f"{path} tagged fields", compact=False)):
        cur.uvarint(f"{path} tag")
        cur.skip(cur.uvarint(f"{path} tagged field size"), f"{path} tagged field")


def check_compact_lengths(cls: type, buf: bytes | memoryview, pos: int) -> None:
    """Raise MalformedRequestError when a length in the flexible request body at ``buf[pos:]`` lies."""
    _entity(_Cursor(buf, pos), cls, cls.__name__)
