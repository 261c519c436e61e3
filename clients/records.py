"""Typed records the client hands to applications."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

__all__ = ["ConsumerRecord", "PartitionLag", "RecordMetadata", "TopicPartition"]

V = TypeVar("V")


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was stored."""

    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ConsumerRecord(Generic[V]):
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch (event time as the producer set it)
    key: object
    value: V
    headers: tuple[tuple[str, bytes], ...] = field(default=())

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    end_offset: int
    lag: int
