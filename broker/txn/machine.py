"""The transaction coordinator's rules, as pure functions: current metadata and a request in, an
error code or the next metadata (or an ``EndPlan``) out. No I/O; ``coordinator.py`` writes each
result to the transaction log before it takes effect, and writes the markers an ``EndPlan`` needs.

Rules (Kafka's TransactionCoordinator, one node, so no coordinator epochs or migrations):

1. InitProducerId with a transactional id: an unknown id gets a new producer id at epoch 0 (Empty).
   A known one in Empty/CompleteCommit/CompleteAbort gets its epoch bumped, which fences every
   older instance; an exhausted epoch (≥ 32766) rotates to a new producer id at epoch 0.
   In Ongoing, the open transaction is aborted first with the epoch bumped (the old producer is
   fenced) and the caller is answered CONCURRENT_TRANSACTIONS; its retry bumps once more.
   In PrepareCommit/PrepareAbort: CONCURRENT_TRANSACTIONS. A timeout above the maximum (or ≤ 0):
   INVALID_TRANSACTION_TIMEOUT. An expected (producer id, epoch) (KIP-360) that names neither the
   current id (nor the previous one after a rotation) nor the current epoch: PRODUCER_FENCED.
2. Every other request names (transactional id, producer id, epoch): an unknown id or another
   producer id → INVALID_PRODUCER_ID_MAPPING; another epoch → PRODUCER_FENCED (handlers turn it
   into INVALID_PRODUCER_EPOCH for request versions that predate it).
3. AddPartitionsToTxn / AddOffsetsToTxn: in PrepareCommit/PrepareAbort → CONCURRENT_TRANSACTIONS;
   otherwise the partitions (or the group) join the transaction, which becomes Ongoing (its start
   time set when it was not Ongoing before). Adding what is already there changes nothing.
4. TxnOffsetCommit: the group must have been added (AddOffsetsToTxn) to the Ongoing transaction,
   else INVALID_TXN_STATE; the offsets are kept pending and applied only when the transaction
   commits.
5. EndTxn: Ongoing → PrepareCommit/PrepareAbort, then markers to every partition, then
   CompleteCommit/CompleteAbort (the partitions, groups and pending offsets cleared). Repeating the
   request that completed the last transaction answers NONE; the other outcome, or EndTxn in Empty,
   is INVALID_TXN_STATE; while prepared: CONCURRENT_TRANSACTIONS.
6. A transaction Ongoing for longer than its timeout is aborted by the coordinator with the epoch
   bumped, so the producer that let it expire is fenced.
7. An id in Empty/Complete* not used for ``transactional.id.expiration.ms`` is forgotten.
8. On restart, a transaction found prepared is completed (its markers written again: a marker a
   consumer has already seen is harmless); an Ongoing one stays open until it ends or times out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.protocol.kafka_codes import ErrorCode
from broker.txn.metadata import NO_EPOCH, PendingOffset, TopicPartition, TxnMetadata, TxnState

__all__ = [
    "MAX_EPOCH",
    "EndPlan",
    "add_group",
    "add_partitions",
    "end_txn",
    "expired_ids",
    "init_producer_id",
    "plan_timeout_abort",
    "timed_out",
    "txn_offset_commit",
]

MAX_EPOCH = 32767  # Short.MaxValue; an epoch at MAX_EPOCH - 1 is exhausted (Kafka keeps one for fencing)


@dataclass(frozen=True, slots=True)
class EndPlan:
    """Finish a transaction: write ``prepare``, the markers (commit or abort), then ``complete``."""

    prepare: TxnMetadata
    complete: TxnMetadata
    commit: bool
    fenced: bool = False  # an abort the coordinator started (timeout, InitProducerId while Ongoing)


def _exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


def init_producer_id(
    current: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    expected: tuple[int, int] | None,
    now_ms: int,
    new_producer_id: Callable[[], int],
    max_timeout_ms: int,
) -> ErrorCode | TxnMetadata | EndPlan:
    """Rule 1."""
    if not transactional_id:
        return ErrorCode.INVALID_REQUEST
    if not 0 < timeout_ms <= max_timeout_ms:
        return ErrorCode.INVALID_TRANSACTION_TIMEOUT
    if current is None or current.state == TxnState.DEAD:
        return TxnMetadata(transactional_id, new_producer_id(), 0, timeout_ms, TxnState.EMPTY,
                           update_ms=now_ms)
    if expected is not None:
        pid, epoch = expected
        known = (current.producer_epoch == NO_EPOCH or pid == current.producer_id
                 or (pid == current.last_producer_id and _exhausted(epoch)))
        if not known or (pid == current.producer_id and epoch != current.producer_epoch):
            return ErrorCode.PRODUCER_FENCED
    if current.state.is_prepare:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if current.state == TxnState.ONGOING:
        return plan_timeout_abort(current, now_ms)
    if _exhausted(current.producer_epoch):
        return current.evolve(producer_id=new_producer_id(), producer_epoch=0, timeout_ms=timeout_ms,
                              last_producer_id=current.producer_id, state=TxnState.EMPTY, update_ms=now_ms)
    return current.evolve(producer_epoch=current.producer_epoch + 1, timeout_ms=timeout_ms,
                          state=TxnState.EMPTY, update_ms=now_ms)


def _of_producer(current: TxnMetadata | None, producer_id: int, epoch: int) -> ErrorCode | TxnMetadata:
    """Rule 2: the metadata, if the request's producer id and epoch are its own; else the refusal."""
    if current is None or current.state == TxnState.DEAD or current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if current.producer_epoch != epoch:
        return ErrorCode.PRODUCER_FENCED
    return current


def _ongoing(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    start = current.start_ms if current.state == TxnState.ONGOING else now_ms
    return current.evolve(state=TxnState.ONGOING, start_ms=start, update_ms=now_ms)


def add_partitions(
    stored: TxnMetadata | None, producer_id: int, epoch: int, partitions: dict[TopicPartition, int], now_ms: int
) -> ErrorCode | TxnMetadata | None:
    """Rule 3 for partitions (value: the partition's end offset now). None: nothing to change."""
    current = _of_producer(stored, producer_id, epoch)
    if isinstance(current, ErrorCode):
        return current
    if current.state.is_prepare:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if current.state == TxnState.ONGOING and partitions.keys() <= current.partitions.keys():
        return None
    merged = dict(partitions) if current.state != TxnState.ONGOING else {**partitions, **current.partitions}
    return _ongoing(current, now_ms).evolve(partitions=merged)


def add_group(stored: TxnMetadata | None, producer_id: int, epoch: int, group_id: str,
              now_ms: int) -> ErrorCode | TxnMetadata | None:
    """Rule 3 for a consumer group's offsets (AddOffsetsToTxn)."""
    current = _of_producer(stored, producer_id, epoch)
    if isinstance(current, ErrorCode):
        return current
    if current.state.is_prepare:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if current.state == TxnState.ONGOING and group_id in current.groups:
        return None
    groups = current.groups | {group_id} if current.state == TxnState.ONGOING else frozenset({group_id})
    partitions = current.partitions if current.state == TxnState.ONGOING else {}
    return _ongoing(current, now_ms).evolve(groups=groups, partitions=partitions)


def txn_offset_commit(stored: TxnMetadata | None, producer_id: int, epoch: int, group_id: str,
                      offsets: dict[TopicPartition, PendingOffset], now_ms: int) -> ErrorCode | TxnMetadata:
    """Rule 4."""
    current = _of_producer(stored, producer_id, epoch)
    if isinstance(current, ErrorCode):
        return current
    if current.state != TxnState.ONGOING or group_id not in current.groups:
        return ErrorCode.INVALID_TXN_STATE
    pending = dict(current.pending_offsets)
    pending[group_id] = {**pending.get(group_id, {}), **offsets}
    return current.evolve(pending_offsets=pending, update_ms=now_ms)


def _finish(current: TxnMetadata, commit: bool, now_ms: int, *, fenced: bool = False) -> EndPlan:
    prepare = current.evolve(state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT, update_ms=now_ms)
    complete = prepare.evolve(state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                              partitions={}, groups=frozenset(), pending_offsets={})
    return EndPlan(prepare, complete, commit, fenced)


def end_txn(stored: TxnMetadata | None, producer_id: int, epoch: int, commit: bool,
            now_ms: int) -> ErrorCode | EndPlan:
    """Rule 5: an EndPlan, or the code to answer (NONE for a repeated, already completed request)."""
    current = _of_producer(stored, producer_id, epoch)
    if isinstance(current, ErrorCode):
        return current
    state = current.state
    if state == TxnState.ONGOING:
        return _finish(current, commit, now_ms)
    if state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        return ErrorCode.NONE if (state == TxnState.COMPLETE_COMMIT) == commit else ErrorCode.INVALID_TXN_STATE
    if state.is_prepare:
        same = (state == TxnState.PREPARE_COMMIT) == commit
        return ErrorCode.CONCURRENT_TRANSACTIONS if same else ErrorCode.INVALID_TXN_STATE
    return ErrorCode.INVALID_TXN_STATE  # Empty: no transaction to end


def plan_timeout_abort(current: TxnMetadata, now_ms: int) -> EndPlan:
    """Rules 1 and 6: abort the open transaction with the epoch bumped (unless exhausted), fencing
    the producer that holds the old epoch."""
    epoch = current.producer_epoch if _exhausted(current.producer_epoch) else current.producer_epoch + 1
    return _finish(current.evolve(producer_epoch=epoch), False, now_ms, fenced=True)


def timed_out(states: Iterable[TxnMetadata], now_ms: int) -> list[TxnMetadata]:
    """Rule 6: the Ongoing transactions past their timeout."""
    return [md for md in states if md.state == TxnState.ONGOING and md.start_ms + md.timeout_ms < now_ms]


def expired_ids(states: Iterable[TxnMetadata], now_ms: int, expiration_ms: int) -> list[str]:
    """Rule 7: ids idle (Empty or Complete*) for longer than ``expiration_ms``."""
    return [md.transactional_id for md in states
            if (md.state == TxnState.EMPTY or md.state.is_complete) and md.update_ms + expiration_ms < now_ms]

