"""The consumer protocol's assignment bytes (sans-IO): which partitions each member owns.

With protocol type ``consumer``, SyncGroup assignments are ConsumerProtocolAssignment, a non-flexible
Kafka structure that starts with an ``int16`` version (Kafka's ``ConsumerProtocolAssignment.json``)::

    Assignment v0-v3: assigned_partitions [topic string, partitions [int32]], user_data nullable bytes

The coordinator treats member metadata and assignments as opaque bytes (as Kafka's classic
coordinator does); tooling (the HTTP API's /groups) decodes assignments to show who owns what.
Like Kafka, a version newer than we know is read as the newest we know and the rest is ignored.
Empty bytes (a member that has no assignment yet) decode to an empty v0 structure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.groups.errors import InvalidConsumerProtocolError

__all__ = ["ConsumerAssignment", "decode_assignment", "decode_subscription_topics", "encode_assignment"]

_MAX_ASSIGNMENT_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class ConsumerAssignment:
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    user_data: bytes | None = None
    version: int = 0

    def topic_partitions(self) -> list[tuple[str, int]]:
        """Flattened (topic, partition) pairs, sorted."""
        return sorted((topic, p) for topic, parts in self.partitions for p in parts)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise InvalidConsumerProtocolError(f"{self.what}: truncated at byte {self.pos}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def string(self) -> str:
        n = self.i16()
        if n < 0:
            raise InvalidConsumerProtocolError(f"{self.what}: null where a string is required")
        return self._decode(self._take(n))

    def nullable_bytes(self) -> bytes | None:
        n = self.i32()
        return None if n < 0 else self._take(n)

    def count(self) -> int:
        n = self.i32()
        if n < 0:
            return 0  # a null array
        if n > len(self.data) - self.pos:  # every element takes at least one byte
            raise InvalidConsumerProtocolError(f"{self.what}: array of {n} cannot fit")
        return n

    def topic_partitions(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            parts = tuple(self.i32() for _ in range(self.count()))
            out.append((topic, parts))
        return tuple(out)

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise InvalidConsumerProtocolError(f"{self.what}: string is not UTF-8") from exc


def decode_assignment(data: bytes) -> ConsumerAssignment:
    if not data:
        return ConsumerAssignment(partitions=())
    r = _Reader(bytes(data), "assignment")
    version = r.i16()
    if version < 0:
        raise InvalidConsumerProtocolError(f"assignment: negative version {version}")
    partitions = r.topic_partitions()
    user_data = r.nullable_bytes()
    return ConsumerAssignment(partitions, user_data, version)


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode()
    return _I16.pack(len(raw)) + raw


def _nullable_bytes(value: bytes | None) -> bytes:
    return _I32.pack(-1) if value is None else _I32.pack(len(value)) + value


def _topic_partitions(items: tuple[tuple[str, tuple[int, ...]], ...]) -> bytes:
    parts = [_I32.pack(len(items))]
    for topic, partitions in items:
        parts.append(_string(topic))
        parts.append(_I32.pack(len(partitions)))
        parts.extend(_I32.pack(p) for p in partitions)
    return b"".join(parts)


def encode_assignment(assignment: ConsumerAssignment) -> bytes:
    v = assignment.version
    if not 0 <= v <= _MAX_ASSIGNMENT_VERSION:
        raise ValueError(f"cannot encode assignment version {v}")
    return _I16.pack(v) + _topic_partitions(assignment.partitions) + _nullable_bytes(assignment.user_data)


def decode_subscription_topics(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (``i16 version, [string] topics, ...``): what
    Kafka's ``ConsumerProtocol.deserializeSubscription`` reads first; the fields after are not needed."""
    r = _Reader(bytes(data), "subscription")
    version = r.i16()
    if version < 0:
        raise InvalidConsumerProtocolError(f"subscription: negative version {version}")
    return [r.string() for _ in range(r.count())]
