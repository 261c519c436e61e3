"""What the transaction coordinator knows about one ``transactional.id``, and its stored form.

A ``TxnMetadata`` is immutable: every transition builds a new one, which is written to the
transaction log before it replaces the old one in memory (so memory never runs ahead of the log).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["NO_EPOCH", "NO_PRODUCER_ID", "PendingOffset", "TopicPartition", "TxnMetadata", "TxnState"]

NO_PRODUCER_ID = -1
NO_EPOCH = -1

TopicPartition = tuple[str, int]
PendingOffset = tuple[int, str | None]  # (offset, metadata) committed by TxnOffsetCommit, applied at commit


class TxnState(enum.Enum):
    """Kafka's transaction states, by the names DescribeTransactions/ListTransactions report."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    last_producer_id: int = NO_PRODUCER_ID  # the id before a rotation (KIP-360 retries)
    # Partitions in the current transaction, each with the offset its data can start at no earlier
    # than (the partition's end when it was added): after a restart, the last stable offset of an
    # open transaction is held back from there.
    partitions: dict[TopicPartition, int] = field(default_factory=dict)
    groups: frozenset[str] = frozenset()
    pending_offsets: dict[str, dict[TopicPartition, PendingOffset]] = field(default_factory=dict)
    start_ms: int = -1  # when the current transaction began (first AddPartitions/AddOffsets)
    update_ms: int = -1

    def evolve(self, **changes: Any) -> TxnMetadata:
        return replace(self, **changes)

    # -- stored form (JSON: small, rare, and readable with kcat on __transaction_state) ----------

    def to_bytes(self) -> bytes:
        doc = {
            "v": 1,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_id": self.last_producer_id,
            "timeout_ms": self.timeout_ms,
            "state": self.state.value,
            "partitions": [[t, p, start] for (t, p), start in sorted(self.partitions.items())],
            "groups": sorted(self.groups),
            "pending_offsets": {
                group: [[t, p, off, meta] for (t, p), (off, meta) in sorted(offsets.items())]
                for group, offsets in self.pending_offsets.items()
            },
            "start_ms": self.start_ms,
            "update_ms": self.update_ms,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, transactional_id: str, data: bytes) -> TxnMetadata:
        """Raises ValueError (with the reason) on anything that is not a stored TxnMetadata."""
        try:
            doc = json.loads(data)
            return cls(
                transactional_id=transactional_id,
                producer_id=int(doc["producer_id"]),
                producer_epoch=int(doc["producer_epoch"]),
                last_producer_id=int(doc["last_producer_id"]),
                timeout_ms=int(doc["timeout_ms"]),
                state=TxnState(doc["state"]),
                partitions={(str(t), int(p)): int(start) for t, p, start in doc["partitions"]},
                groups=frozenset(str(g) for g in doc["groups"]),
                pending_offsets={
                    str(group): {(str(t), int(p)): (int(off), None if meta is None else str(meta))
                                 for t, p, off, meta in offsets}
                    for group, offsets in doc["pending_offsets"].items()
                },
                start_ms=int(doc["start_ms"]),
                update_ms=int(doc["update_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stored transaction state for {transactional_id!r}: {exc!r}") from exc
