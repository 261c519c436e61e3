"""Idempotent producers: producer ids, and per-partition sequence state that drops retried batches.

Rules (Kafka's, for non-transactional idempotent producers; one state per (topic, partition, producer id)):

1. A batch with ``producer_id < 0`` or ``base_sequence < 0`` is not idempotent: always appended.
2. First batch of a producer id on a partition: any sequence is accepted (the producer may have
   written elsewhere first, or the broker restarted and lost its in-memory state).
3. ``epoch < current epoch``: the producer was fenced → INVALID_PRODUCER_EPOCH.
4. ``epoch > current epoch``: a bumped producer; its sequence must restart at 0
   (else OUT_OF_ORDER_SEQUENCE_NUMBER); the old epoch's state is dropped.
5. Same epoch: a batch whose (first sequence, last sequence) equals one of the last five appended is a
   retry → not appended again; the producer is answered with the original base offset.
6. Same epoch, not a retry: the first sequence must be the last appended sequence + 1 (wrapping at
   2**31 - 1 → 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.
7. State is recorded in the same event-loop step as the append that assigns offsets, so two
   requests cannot interleave between check and append.

Producer ids come from ``ProducerIdAllocator``: a counter seeded with the start time in ms, so ids do
not repeat across restarts even though sequence state is kept in memory only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import BatchHeader

__all__ = ["APPEND", "Decision", "ProducerIdAllocator", "ProducerStateTable"]

_CACHED_BATCHES = 5
_MAX_SEQ = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a batch: append (error NONE, duplicate_of None), answer a retry with
    ``duplicate_of`` (its original base offset), or reject with ``error``."""

    error: ErrorCode = ErrorCode.NONE
    duplicate_of: int | None = None


APPEND = Decision()


@dataclass(slots=True)
class _ProducerEntry:
    epoch: int
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=_CACHED_BATCHES))
    # (first sequence, last sequence, base offset) of the last batches appended


def _next_seq(seq: int) -> int:
    return 0 if seq == _MAX_SEQ else seq + 1


class ProducerStateTable:
    """Sequence state per partition and producer id."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, int], dict[int, _ProducerEntry]] = {}

    def check(self, topic: str, partition: int, header: BatchHeader) -> Decision:
        if header.producer_id < 0 or header.base_sequence < 0:
            return APPEND
        entry = self._state.get((topic, partition), {}).get(header.producer_id)
        if entry is None:
            return APPEND
        if header.producer_epoch < entry.epoch:
            return Decision(ErrorCode.INVALID_PRODUCER_EPOCH)
        if header.producer_epoch > entry.epoch:
            return APPEND if header.base_sequence == 0 else Decision(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        first = header.base_sequence
        last = (first + header.last_offset_delta) % (_MAX_SEQ + 1)
        for cached_first, cached_last, base_offset in entry.batches:
            if cached_first == first and cached_last == last:
                return Decision(duplicate_of=base_offset)
        if not entry.batches or first != _next_seq(entry.batches[-1][1]):
            return Decision(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return APPEND

    def record(self, topic: str, partition: int, header: BatchHeader, base_offset: int) -> None:
        if header.producer_id < 0 or header.base_sequence < 0:
            return
        producers = self._state.setdefault((topic, partition), {})
        entry = producers.get(header.producer_id)
        if entry is None or entry.epoch != header.producer_epoch:
            entry = producers[header.producer_id] = _ProducerEntry(header.producer_epoch)
        last = (header.base_sequence + header.last_offset_delta) % (_MAX_SEQ + 1)
        entry.batches.append((header.base_sequence, last, base_offset))

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._state if k[0] == topic]:
            del self._state[key]


class ProducerIdAllocator:
    def __init__(self, start: int | None = None) -> None:
        self._next = int(time.time() * 1000) if start is None else start

    def allocate(self) -> int:
        pid = self._next
        self._next += 1
        return pid
