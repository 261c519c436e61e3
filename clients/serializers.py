"""Serializers: how keys and values become bytes and back. JSON, msgpack, UTF-8 strings, raw bytes."""

from __future__ import annotations

import json
from typing import Any, Protocol

import msgpack

from clients.errors import SerializationError

__all__ = [
    "JsonSerializer",
    "MsgpackSerializer",
    "RawSerializer",
    "Serializer",
    "SerializerSpec",
    "StringSerializer",
    "resolve_serializer",
]


class Serializer(Protocol):
    name: str

    def serialize(self, obj: Any) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> Any: ...


class JsonSerializer:
    name = "json"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        try:
            return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"cannot encode {type(obj).__name__} as JSON: {exc}") from exc

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SerializationError(f"record is not JSON ({exc}); use value_serializer='raw'") from exc


class MsgpackSerializer:
    name = "msgpack"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        try:
            return bytes(msgpack.packb(obj, use_bin_type=True))
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"cannot encode {type(obj).__name__} as msgpack: {exc}") from exc

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerializationError(f"record is not msgpack ({exc}); use value_serializer='raw'") from exc


class StringSerializer:
    name = "string"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        if isinstance(obj, bytes):
            return obj
        return str(obj).encode()

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else data.decode("utf-8", "replace")


class RawSerializer:
    name = "raw"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None or isinstance(obj, bytes):
            return obj
        if isinstance(obj, bytearray | memoryview):
            return bytes(obj)
        raise SerializationError(f"the raw serializer takes bytes, got {type(obj).__name__}")

    def deserialize(self, data: bytes | None) -> Any:
        return data


SerializerSpec = str | Serializer
_BY_NAME: dict[str, type[Serializer]] = {
    "json": JsonSerializer,
    "msgpack": MsgpackSerializer,
    "string": StringSerializer,
    "str": StringSerializer,
    "raw": RawSerializer,
    "bytes": RawSerializer,
}


def resolve_serializer(spec: SerializerSpec) -> Serializer:
    if isinstance(spec, str):
        cls = _BY_NAME.get(spec)
        if cls is None:
            raise ValueError(f"unknown serializer {spec!r}; use one of json, msgpack, string, raw")
        return cls()
    return spec
