"""``read_committed`` reads: the broker's half (what a Fetch returns) and the consumer's half (what a
read_committed consumer keeps of it), for readers in the broker's own process.

Rules (Kafka's, as in ``Log.read`` / ``collectAbortedTxns`` on the broker and the Java consumer's
``Fetcher`` / librdkafka's msgset reader on the client):

1. The broker returns only whole batches whose base offset is below the last stable offset (LSO), with
   the aborted transactions (producer id, first offset) whose range overlaps the offsets returned.
2. The consumer walks the batches in offset order. Before each batch of a producer, the aborted
   transactions whose first offset is at or below the batch's last offset become *active* for their
   producer. A transactional data batch of an active producer is dropped; that producer's control
   batch (its abort marker) ends the activity. Control batches are never handed to the application.

``stable_part`` is rule 1 over bytes already read (the Fetch handler's part), ``drop_aborted`` is rule 2
(sans-IO: bytes and lists in, bytes out), and ``read_committed`` puts both together over a partition for
in-process readers (attached processors, the HTTP API). The LSO and the aborted ranges come from the
transaction coordinator's index (``broker.txn.partitions``): nothing here keeps state of its own.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

from broker.log.partition_log import PartitionLog
from broker.protocol.records import ATTR_CONTROL, BatchHeader, decode_records, split_complete_batches
from broker.txn.markers import ABORT, marker_type

__all__ = ["CommittedRead", "StableOffsets", "drop_aborted", "read_committed", "stable_part"]


class StableOffsets(Protocol):
    """What the transaction coordinator knows of a partition (``TransactionCoordinator`` is one)."""

    def last_stable_offset(self, plog: PartitionLog) -> int: ...
    def aborted_between(self, plog: PartitionLog, start: int, end: int) -> list[tuple[int, int]]: ...


def stable_part(txns: StableOffsets, plog: PartitionLog, offset: int, data: bytes,
                lso: int) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """Rule 1: the batches of ``data`` (read from ``offset``) below ``lso``, and the aborted
    transactions that overlap them (the consumer drops those producers' batches up to their markers)."""
    if not data:
        return data, ()
    headers, _ = split_complete_batches(data)
    end = 0
    last = offset
    for header in headers:
        if header.base_offset >= lso:
            break
        end += header.size
        last = header.last_offset + 1
    kept = data[:end] if end < len(data) else data
    return kept, tuple(txns.aborted_between(plog, offset, last)) if kept else ()


def _is_abort_marker(batch: memoryview, header: BatchHeader) -> bool:
    # decode_records skips control records: read the marker as an ordinary batch
    plain = decode_records(batch, header._replace(attributes=header.attributes & ~ATTR_CONTROL))
    return bool(plain) and marker_type(plain[0].key) == ABORT


def drop_aborted(data: bytes, aborted: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> bytes:
    """Rule 2: ``data`` without control batches and without the batches of aborted transactions.
    Returns ``data`` itself when there is nothing to drop."""
    headers, covered = split_complete_batches(data)
    if not aborted and not any(h.is_control for h in headers):
        return data
    pending = [(first, pid) for pid, first in aborted]
    heapq.heapify(pending)
    active: set[int] = set()
    view = memoryview(data)
    parts: list[memoryview] = []
    pos = 0
    for header in headers:
        batch = view[pos : pos + header.size]
        pos += header.size
        while pending and pending[0][0] <= header.last_offset:
            active.add(heapq.heappop(pending)[1])
        if header.is_control:
            if header.producer_id in active and _is_abort_marker(batch, header):
                active.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in active:
            continue
        parts.append(batch)
    return b"".join(parts) + bytes(view[covered:]) if covered < len(data) else b"".join(parts)


@dataclass(frozen=True, slots=True)
class CommittedRead:
    data: bytes  # whole batches a read_committed consumer keeps (no control batch, nothing aborted)
    next_offset: int  # the offset after the last batch looked at, kept or not (``offset`` if none was stable)
    last_stable_offset: int


def read_committed(txns: StableOffsets, plog: PartitionLog, offset: int, max_bytes: int) -> CommittedRead:
    """About ``max_bytes`` of committed batches of ``plog`` from ``offset`` (rules 1 and 2).

    Raises ``OffsetOutOfRangeError`` as ``PartitionLog.read`` does. An empty ``data`` with
    ``next_offset > offset`` means everything read was dropped: read on from ``next_offset``; with
    ``next_offset == offset`` the reader is at the LSO and waits for an append (the marker that moves
    it is one)."""
    lso = txns.last_stable_offset(plog)
    data = plog.read(offset, max_bytes) if offset < lso else b""
    stable, aborted = stable_part(txns, plog, offset, data, lso)
    if not stable:
        return CommittedRead(b"", offset, lso)
    headers, _ = split_complete_batches(stable)
    return CommittedRead(drop_aborted(stable, aborted), max(offset, headers[-1].last_offset + 1), lso)
