"""Per-partition transaction bookkeeping: the last stable offset and the aborted transactions.

For each partition the index knows the open transactions (producer id → the first offset its
data may start at) and the aborted ones (producer id, first offset, offset of the abort marker).

- Last stable offset (LSO) = the smallest first offset of an open transaction, or the high
  watermark when none is open: ``read_committed`` readers stop there.
- A ``read_committed`` Fetch is told the aborted transactions that overlap the offsets it returns
  (Kafka's ``aborted_transactions``): the consumer skips that producer's batches from the first
  offset until it meets the producer's abort marker.

A first offset is known exactly when the transaction's first batch is appended here; before that
it is the partition's end when the partition joined the transaction, which is never later than the
real one, so the LSO is never too high. After a restart the coordinator looks for the first batch in
the log from that bound (``appended`` with what it finds): an append after the restart must not be
taken as the first, since batches written before the restart would then pass the LSO and, if the
transaction aborts, stay visible to ``read_committed`` readers.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["AbortedTxn", "PartitionTxnIndex", "TxnIndex"]


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    last_offset: int  # the abort marker's offset (first field: entries sort by it)
    first_offset: int
    producer_id: int


@dataclass(slots=True)
class PartitionTxnIndex:
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset (lower bound)
    exact: set[int] = field(default_factory=set)  # producer ids whose first offset was seen in an append
    aborted: list[AbortedTxn] = field(default_factory=list)  # sorted by marker offset

    def begin(self, producer_id: int, lower_bound: int) -> None:
        """The partition joined ``producer_id``'s transaction when its end was ``lower_bound``."""
        if producer_id not in self.open:
            self.open[producer_id] = lower_bound

    def appended(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch of ``producer_id`` was appended at ``base_offset``."""
        if producer_id in self.exact:
            return
        self.exact.add(producer_id)
        self.open[producer_id] = base_offset

    def end(self, producer_id: int, marker_offset: int, commit: bool) -> AbortedTxn | None:
        """The transaction's marker was appended at ``marker_offset``; returns the aborted entry to keep."""
        first = self.open.pop(producer_id, None)
        self.exact.discard(producer_id)
        if commit or first is None:
            return None
        entry = AbortedTxn(marker_offset, first, producer_id)
        self.add_aborted(entry)
        return entry

    def add_aborted(self, entry: AbortedTxn) -> None:
        if entry not in self.aborted:
            bisect.insort(self.aborted, entry)

    def last_stable_offset(self, high_watermark: int) -> int:
        if not self.open:
            return high_watermark
        return min(high_watermark, min(self.open.values()))

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping offsets [start, end)."""
        lo = bisect.bisect_left(self.aborted, AbortedTxn(start, -1, -1))
        return [(a.producer_id, a.first_offset) for a in self.aborted[lo:] if a.first_offset < end]

    def trim(self, log_start_offset: int) -> list[AbortedTxn]:
        """Forget aborted transactions wholly below the log start; returns those dropped."""
        cut = bisect.bisect_left(self.aborted, AbortedTxn(log_start_offset, -1, -1))
        dropped, self.aborted = self.aborted[:cut], self.aborted[cut:]
        return dropped


class TxnIndex:
    """``PartitionTxnIndex`` for every partition that has seen a transaction."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], PartitionTxnIndex] = {}

    def get(self, topic: str, partition: int) -> PartitionTxnIndex | None:
        return self._partitions.get((topic, partition))

    def of(self, topic: str, partition: int) -> PartitionTxnIndex:
        index = self._partitions.get((topic, partition))
        if index is None:
            index = self._partitions[(topic, partition)] = PartitionTxnIndex()
        return index

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> int:
        index = self._partitions.get((topic, partition))
        return high_watermark if index is None else index.last_stable_offset(high_watermark)

    def aborted_between(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        index = self._partitions.get((topic, partition))
        return [] if index is None else index.aborted_between(start, end)

    def forget_topic(self, topic: str) -> list[tuple[str, int, AbortedTxn]]:
        """Drop a deleted topic's state; returns its aborted entries (to delete from the log)."""
        dropped: list[tuple[str, int, AbortedTxn]] = []
        for key in [k for k in self._partitions if k[0] == topic]:
            dropped += [(key[0], key[1], entry) for entry in self._partitions.pop(key).aborted]
        return dropped

    def items(self) -> list[tuple[tuple[str, int], PartitionTxnIndex]]:
        return list(self._partitions.items())
