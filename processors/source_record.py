"""The plain record a processor's own decoders make (fetched or stored batches read in place, the
shuffle's raw batches): slotted and cheap, with the attributes a processor reads (``RecordLike``).

A leaf module, so the compiled kernels (``record_kernels``, ``shuffle_kernels``) and the pure decoders
(``fastdecode``, ``kafka_records``) build the same class."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SourceRecord"]


class SourceRecord:
    """A record built by a source or a kernel rather than by aiokafka or the broker's decoder."""

    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes | None]]) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return f"SourceRecord(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, value={self.value!r})"
