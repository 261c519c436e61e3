"""Key → partition, exactly as Kafka's Java client does it (murmur2), so a key lands in the
same partition whichever front door (Kafka, MQTT, TCP, HTTP) it arrived by."""

from __future__ import annotations

import itertools

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c), returned as a signed 32-bit int like Java's."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    extra = length % 4
    if extra >= 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's DefaultPartitioner: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StickyPartitioner:
    """For keyless records: stay on one partition for a batch, then move on (round-robin)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next_partition(self, partitions: int) -> int:
        return next(self._counter) % partitions
