"""Idempotent producers: producer ids, and per-partition sequence state that drops retried batches.

Rules (Kafka's, for idempotent and transactional producers; one state per (topic, partition, producer id)):

1. A batch with ``producer_id < 0`` or ``base_sequence < 0`` is not idempotent: always appended.
2. First batch of a producer id on a partition: any sequence is accepted (the producer may have
   written elsewhere first, or its last batches there are older than the restart scan, rule 8).
3. ``epoch < current epoch``: the producer was fenced → INVALID_PRODUCER_EPOCH.
4. ``epoch > current epoch``: a bumped producer; its sequence must restart at 0
   (else OUT_OF_ORDER_SEQUENCE_NUMBER); the old epoch's state is dropped.
5. Same epoch: a batch whose (first sequence, last sequence) equals one of the last five appended is a
   retry → not appended again; the producer is answered with the original base offset.
6. Same epoch, not a retry: the first sequence must be the last appended sequence + 1 (wrapping at
   2**31 - 1 → 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.
7. State is recorded in the same event-loop step as the append that assigns offsets, so two
   requests cannot interleave between check and append.
8. On start the state is rebuilt as Kafka does, from the stored batches (they carry producer id,
   epoch, base sequence and their offsets): ``rebuild`` replays the headers of the tail of every
   partition (``PartitionLog.tail_headers``, bounded: the last ``scan_bytes`` per partition) through
   ``record`` (transactional batches included: their retry would otherwise be appended, and committed,
   twice), so a producer retrying right after a restart gets its original offset back instead of
   a duplicate append. A producer whose last batch on a partition lies before the scanned tail is
   treated as new there (rule 2).
9. Expiry (Kafka's ``producer.id.expiration.ms``, default 1 day, swept every
   ``producer.id.expiration.check.interval.ms``, default 10 min): a producer id's state on a partition
   is dropped once it has appended nothing there for the expiration time; it is then new again
   (rule 2). Kafka measures idleness from the batch's max timestamp; we measure it from the broker's
   clock at append, because device data often carries event times far in the past (the same reason
   segment retention goes by append time), which would expire a live producer at once. State rebuilt
   on start counts as seen at the start. The sweep runs when a check or record finds it due, so an
   idle broker holds the state until its next produce, which then sees exactly what Kafka's would.
10. A deleted topic takes its producer state with it: ``forget_topic`` is subscribed to the store's
    topic deletions, so every path that deletes a topic (Kafka DeleteTopics, the HTTP API, the CLI)
    clears it, and a topic created again under the same name starts clean.

Producer ids come from ``ProducerIdAllocator``: never handed out twice, across restarts too. The
counter starts after the largest of: the start time in ms, every producer id the restart scan saw,
and (with a file under the data dir) the end of the last reserved block — ids are reserved in blocks,
the block's end written durably before any id of it is handed out.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.errors import StorageError
from broker.log.api import LogStore
from broker.log.files import atomic_write, read_json
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import BatchHeader

__all__ = [
    "APPEND",
    "DEFAULT_EXPIRATION_CHECK_INTERVAL_MS",
    "DEFAULT_EXPIRATION_MS",
    "DEFAULT_SCAN_BYTES",
    "Decision",
    "ProducerIdAllocator",
    "ProducerStateTable",
    "rebuild",
]

log = logging.getLogger("broker.server.producer_state")

DEFAULT_SCAN_BYTES = 8 * 1024 * 1024  # per partition, read on start to rebuild sequence state
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms
DEFAULT_EXPIRATION_CHECK_INTERVAL_MS = 10 * 60 * 1000  # Kafka's producer.id.expiration.check.interval.ms

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
    last_seen_ms: float  # broker clock at the last append (rule 9)
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=_CACHED_BATCHES))
    # (first sequence, last sequence, base offset) of the last batches appended
    last_timestamp: int = -1  # the last batch's max timestamp (Kafka's lastTimestamp, DescribeProducers)


def _next_seq(seq: int) -> int:
    return 0 if seq == _MAX_SEQ else seq + 1


class ProducerStateTable:
    """Sequence state per partition and producer id."""

    def __init__(
        self,
        *,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state: dict[tuple[str, int], dict[int, _ProducerEntry]] = {}
        self.expiration_ms = expiration_ms
        self.check_interval_ms = check_interval_ms
        self._clock = clock
        self._next_sweep_ms = self._now_ms() + check_interval_ms

    def _now_ms(self) -> float:
        return self._clock() * 1000

    def check(self, topic: str, partition: int, header: BatchHeader) -> Decision:
        if header.producer_id < 0 or header.base_sequence < 0:
            return APPEND
        self._sweep_if_due()
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
        now = self._now_ms()
        producers = self._state.setdefault((topic, partition), {})
        entry = producers.get(header.producer_id)
        if entry is None or entry.epoch != header.producer_epoch:
            entry = producers[header.producer_id] = _ProducerEntry(header.producer_epoch, now)
        last = (header.base_sequence + header.last_offset_delta) % (_MAX_SEQ + 1)
        entry.batches.append((header.base_sequence, last, base_offset))
        entry.last_seen_ms = now
        entry.last_timestamp = header.max_timestamp

    def forget_topic(self, topic: str) -> None:
        """Rule 10: the topic was deleted."""
        for key in [k for k in self._state if k[0] == topic]:
            del self._state[key]

    def expire(self, now_ms: float | None = None) -> int:
        """Rule 9: drop every producer id idle for ``expiration_ms``; returns how many went."""
        now = self._now_ms() if now_ms is None else now_ms
        expired = 0
        for key, producers in list(self._state.items()):
            for pid in [pid for pid, e in producers.items() if now - e.last_seen_ms >= self.expiration_ms]:
                del producers[pid]
                expired += 1
            if not producers:
                del self._state[key]
        if expired:
            log.info("idle producer ids expired", extra={"expired": expired, "expiration_ms": self.expiration_ms})
        return expired

    def _sweep_if_due(self) -> None:
        now = self._now_ms()
        if now >= self._next_sweep_ms:
            self._next_sweep_ms = now + self.check_interval_ms
            self.expire(now)

    def producers(self, topic: str, partition: int) -> dict[int, tuple[int, list[tuple[int, int, int]]]]:
        """Producer id -> (epoch, cached (first seq, last seq, base offset) batches), for tests and tools."""
        return {pid: (entry.epoch, list(entry.batches))
                for pid, entry in self._state.get((topic, partition), {}).items()}


    def active(self, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, last timestamp) of each producer the partition tracks
        (Kafka's ``UnifiedLog.activeProducers``, answered by DescribeProducers)."""
        return [(pid, e.epoch, e.batches[-1][1] if e.batches else -1, e.last_timestamp)
                for pid, e in self._state.get((topic, partition), {}).items()]


class ProducerIdAllocator:
    """Hands out producer ids; see the module docstring for why they never repeat."""

    def __init__(self, start: int | None = None, *, path: Path | None = None, block: int = 1000) -> None:
        self._next = int(time.time() * 1000) if start is None else start
        self._path = path
        self._block = block
        self._reserved = self._next  # ids below this were durably reserved (with a path)
        if path is not None:
            doc = read_json(path)
            if doc is not None:
                try:
                    assert isinstance(doc, dict)
                    self._next = max(self._next, int(doc["next_producer_id"]))
                except (AssertionError, KeyError, TypeError, ValueError) as exc:
                    raise StorageError(f"{path} does not hold a next_producer_id ({exc!r}); fix or remove it") from exc

    @property
    def next_id(self) -> int:
        return self._next

    def observe(self, producer_id: int) -> None:
        """A producer id seen in stored data: never hand it out again."""
        if producer_id >= self._next:
            self._next = producer_id + 1

    def allocate(self) -> int:
        pid = self._next
        if self._path is not None and pid >= self._reserved:
            reserved = pid + self._block
            atomic_write(self._path, json.dumps({"next_producer_id": reserved}).encode())  # raises: no id given
            self._reserved = reserved
        self._next += 1
        return pid


def rebuild(store: LogStore, table: ProducerStateTable, ids: ProducerIdAllocator,
            scan_bytes: int = DEFAULT_SCAN_BYTES) -> dict[str, float]:
    """Rule 8: replay the tail of every partition into ``table`` and ``ids``; returns counts for the log."""
    batches = producers = 0
    started = time.monotonic()
    for info in store.list_topics(include_internal=True):
        for plog in store.partitions(info.name):
            for header in plog.tail_headers(scan_bytes):
                if header.producer_id < 0:
                    continue
                ids.observe(header.producer_id)
                # Transactional batches too (Kafka's loadProducersFromRecords takes every batch with a
                # producer id): a transactional producer retries an unanswered batch after a restart like
                # any idempotent one. Control batches carry no sequence; a marker's epoch bump needs no
                # entry here, since the coordinator refuses an older epoch before this table is asked.
                if header.base_sequence >= 0 and not header.is_control:
                    table.record(info.name, plog.partition, header, header.base_offset)
                    batches += 1
            producers += len(table.producers(info.name, plog.partition))
    stats = {"batches": batches, "producers": producers, "next_producer_id": ids.next_id,
             "ms": round((time.monotonic() - started) * 1000, 1)}
    log.info("idempotent-producer state rebuilt from the log tails", extra=stats)
    return stats
