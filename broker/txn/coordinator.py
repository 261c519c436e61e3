"""The transaction coordinator: ``machine``'s rules with the I/O they need.

Each request on a transactional id runs under that id's lock: the rule decides, the result is
written to the transaction log (durably), and only then does it replace the in-memory state and
is the client answered. Ending a transaction writes PrepareCommit/PrepareAbort, then a marker to
each partition (all appended before any is waited on, so they share fsyncs), applies the pending
offsets on commit, then writes CompleteCommit/CompleteAbort together with the aborted entries the
partitions' ``read_committed`` readers need. EndTxn is answered after all of it, so a producer's
next transaction never starts while the last one's markers are missing.

The Produce path asks ``check_produce`` before appending a transactional batch (the producer's
epoch and the partition's membership in its open transaction) and reports ``appended`` after, so
the partition's last stable offset starts at the transaction's first batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.errors import BrokerError, UnknownTopicError
from broker.log.api import LogStore
from broker.log.partition_log import PartitionLog
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import BatchHeader, split_complete_batches
from broker.txn import machine
from broker.txn.markers import encode_marker
from broker.txn.metadata import PendingOffset, TopicPartition, TxnMetadata, TxnState
from broker.txn.partitions import AbortedTxn, TxnIndex
from broker.txn.txn_log import TxnLog

__all__ = ["CommitOffsets", "TransactionCoordinator", "TxnSettings"]

log = logging.getLogger("broker.txn")

# Applies a committed transaction's offsets to a consumer group: (group id, {tp: (offset, metadata)}).
CommitOffsets = Callable[[str, dict[TopicPartition, PendingOffset]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TxnSettings:
    max_timeout_ms: int = 900_000  # Kafka's transaction.max.timeout.ms
    abort_check_interval_ms: int = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    def __init__(self, store: LogStore, new_producer_id: Callable[[], int], commit_offsets: CommitOffsets,
                 settings: TxnSettings | None = None, clock: Callable[[], int] = _now_ms) -> None:
        self._store = store
        self._new_producer_id = new_producer_id
        self._commit_offsets = commit_offsets
        self.settings = settings or TxnSettings()
        self._clock = clock
        self._log = TxnLog(store)
        self._txns: dict[str, TxnMetadata] = {}
        self._by_producer: dict[int, str] = {}  # producer id -> transactional id
        self._locks: dict[str, asyncio.Lock] = {}
        self.index = TxnIndex()
        self._task: asyncio.Task[None] | None = None
        self.aborted_by_timeout = 0  # counted for /metrics

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Rule 8: load the log, rebuild the partition index, finish prepared transactions."""
        loaded = self._log.load()
        for md in loaded.transactions.values():
            self._remember(md)
            if md.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                for (topic, partition), lower_bound in md.partitions.items():
                    index = self.index.of(topic, partition)
                    index.begin(md.producer_id, lower_bound)
                    first = self._first_batch_since(topic, partition, md.producer_id, lower_bound)
                    if first is not None:
                        index.appended(md.producer_id, first)
        stale: list[tuple[str, int, AbortedTxn]] = []
        for topic, partition, entry in loaded.aborted:
            if self._store.has_topic(topic):
                self.index.of(topic, partition).add_aborted(entry)
            else:
                stale.append((topic, partition, entry))
        stale += self._trim()
        if stale:
            await self._log.write(forget_aborted=stale)
        prepared = [md for md in self._txns.values() if md.state.is_prepare]
        for md in prepared:
            commit = md.state == TxnState.PREPARE_COMMIT
            complete = md.evolve(state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                                 partitions={}, groups=frozenset(), pending_offsets={})
            log.info("completing a transaction left prepared by the last run",
                     extra={"transactional_id": md.transactional_id, "commit": commit})
            await self._finish(machine.EndPlan(md, complete, commit), prepared=True)
        log.info("transaction coordinator loaded", extra={
            "transactions": len(self._txns), "aborted_entries": len(loaded.aborted) - len(stale),
            "completed_on_start": len(prepared)})
        self._task = asyncio.create_task(self._housekeeping())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ requests

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: tuple[int, int] | None) -> InitResult:
        async with self._lock(transactional_id):
            result = machine.init_producer_id(self._txns.get(transactional_id), transactional_id, timeout_ms,
                                              expected, self._clock(), self._new_producer_id,
                                              self.settings.max_timeout_ms)
            if isinstance(result, ErrorCode):
                return InitResult(result)
            if isinstance(result, machine.EndPlan):
                log.info("InitProducerId fences the producer of an open transaction and aborts it",
                         extra={"transactional_id": transactional_id})
                await self._finish(result)
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            await self._store_state(result)
            return InitResult(ErrorCode.NONE, result.producer_id, result.producer_epoch)

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        known = [tp for tp in partitions if self._partition_exists(tp)]
        if len(known) < len(partitions):  # Kafka refuses the whole request: unknown ones and the rest
            return {tp: ErrorCode.OPERATION_NOT_ATTEMPTED if tp in known else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    for tp in partitions}
        async with self._lock(transactional_id):
            current = self._txns.get(transactional_id)
            bounds = {tp: self._store.partition(*tp).high_watermark for tp in partitions}
            result = machine.add_partitions(current, producer_id, epoch, bounds, self._clock())
            if isinstance(result, ErrorCode):
                return dict.fromkeys(partitions, result)
            if result is not None:
                await self._store_state(result)
                for tp in partitions:
                    self.index.of(*tp).begin(producer_id, result.partitions[tp])
            return dict.fromkeys(partitions, ErrorCode.NONE)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int, group_id: str) -> ErrorCode:
        async with self._lock(transactional_id):
            result = machine.add_group(self._txns.get(transactional_id), producer_id, epoch, group_id, self._clock())
            if isinstance(result, ErrorCode):
                return result
            if result is not None:
                await self._store_state(result)
            return ErrorCode.NONE

    async def txn_offset_commit(self, transactional_id: str, producer_id: int, epoch: int, group_id: str,
                                offsets: dict[TopicPartition, PendingOffset]) -> ErrorCode:
        async with self._lock(transactional_id):
            result = machine.txn_offset_commit(self._txns.get(transactional_id), producer_id, epoch, group_id,
                                               offsets, self._clock())
            if isinstance(result, ErrorCode):
                return result
            await self._store_state(result)
            return ErrorCode.NONE

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> ErrorCode:
        async with self._lock(transactional_id):
            result = machine.end_txn(self._txns.get(transactional_id), producer_id, epoch, commit, self._clock())
            if isinstance(result, ErrorCode):
                return result
            await self._finish(result)
            return ErrorCode.NONE

    def now_ms(self) -> int:
        return self._clock()

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        md = self._txns.get(transactional_id)
        return None if md is None or md.state == TxnState.DEAD else md

    def transactions(self) -> list[TxnMetadata]:
        return [md for md in self._txns.values() if md.state != TxnState.DEAD]

    def pending_offsets(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with an offset committed in a transaction not yet completed (what an
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for)."""
        return {tp for md in self._txns.values() for tp in md.pending_offsets.get(group_id, ())}

    # ------------------------------------------------------------------ the Produce path

    def check_produce(self, topic: str, partition: int, header: BatchHeader) -> ErrorCode:
        """May this transactional batch be appended? (epoch fencing, partition in the open transaction)"""
        txn_id = self._by_producer.get(header.producer_id)
        md = None if txn_id is None else self._txns.get(txn_id)
        if md is None or md.producer_id != header.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if header.producer_epoch != md.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if md.state != TxnState.ONGOING or (topic, partition) not in md.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    def appended(self, topic: str, partition: int, producer_id: int, base_offset: int) -> None:
        self.index.of(topic, partition).appended(producer_id, base_offset)

    def last_stable_offset(self, plog: PartitionLog) -> int:
        return self.index.last_stable_offset(plog.topic, plog.partition, plog.high_watermark)

    def aborted_between(self, plog: PartitionLog, start: int, end: int) -> list[tuple[int, int]]:
        return self.index.aborted_between(plog.topic, plog.partition, start, end)

    # ------------------------------------------------------------------ internals

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def _partition_exists(self, tp: TopicPartition) -> bool:
        try:
            self._store.partition(*tp)
        except UnknownTopicError:
            return False
        return True

    def _first_batch_since(self, topic: str, partition: int, producer_id: int, lower_bound: int) -> int | None:
        """Where the open transaction's data starts in the log (its first batch at or after the
        partition's end when it joined), as Kafka's producer state knows it after a restart. Without
        it, the producer's first append after the restart would be taken as the first, and the
        batches it wrote before the restart would pass the last stable offset and, aborted, stay
        visible to read_committed readers."""
        try:
            plog = self._store.partition(topic, partition)
        except UnknownTopicError:
            return None
        offset = max(lower_bound, plog.log_start_offset)
        while offset < plog.high_watermark:
            data = plog.read(offset, 1 << 20)
            headers, _ = split_complete_batches(data)
            if not headers:
                return None
            for header in headers:
                if header.producer_id == producer_id and header.is_transactional and not header.is_control:
                    return header.base_offset
            offset = headers[-1].last_offset + 1
        return None

    def _remember(self, md: TxnMetadata) -> None:
        old = self._txns.get(md.transactional_id)
        if old is not None and old.producer_id != md.producer_id:
            self._by_producer.pop(old.producer_id, None)
        self._txns[md.transactional_id] = md
        self._by_producer[md.producer_id] = md.transactional_id

    async def _store_state(self, md: TxnMetadata) -> None:
        await self._log.write([md])
        self._remember(md)

    async def _finish(self, plan: machine.EndPlan, *, prepared: bool = False) -> None:
        """Prepare (unless already), markers, offsets, complete."""
        if not prepared:
            await self._store_state(plan.prepare)
        md = plan.prepare
        now = self._clock()
        written: list[PartitionLog] = []
        aborted: list[tuple[str, int, AbortedTxn]] = []
        for topic, partition in md.partitions:
            try:
                plog = self._store.partition(topic, partition)
            except UnknownTopicError:
                continue  # deleted since it joined: nothing left to mark
            marker = encode_marker(md.producer_id, md.producer_epoch, plan.commit, timestamp_ms=now)
            result = plog.append_nowait(marker)
            entry = self.index.of(topic, partition).end(md.producer_id, result.base_offset, plan.commit)
            if entry is not None:
                aborted.append((topic, partition, entry))
            written.append(plog)
        marks = [(plog, plog.write_mark()) for plog in written]
        for plog, mark in marks:
            await plog.wait_durable(mark)
        if plan.commit:
            for group_id, offsets in md.pending_offsets.items():
                await self._commit_offsets(group_id, offsets)
        await self._log.write([plan.complete], aborted=aborted)
        self._remember(plan.complete)
        if plan.fenced:
            self.aborted_by_timeout += 1

    def _trim(self) -> list[tuple[str, int, AbortedTxn]]:
        dropped: list[tuple[str, int, AbortedTxn]] = []
        for (topic, partition), index in self.index.items():
            try:
                start = self._store.partition(topic, partition).log_start_offset
            except UnknownTopicError:
                dropped += self.index.forget_topic(topic)
                continue
            dropped += [(topic, partition, entry) for entry in index.trim(start)]
        return dropped

    async def _housekeeping(self) -> None:
        """Rules 6 and 7, and aborted entries below the log start, every ``abort_check_interval_ms``."""
        while True:
            await asyncio.sleep(self.settings.abort_check_interval_ms / 1000)
            try:
                await self.abort_timed_out()
                now = self._clock()
                expired = machine.expired_ids(self._txns.values(), now, self.settings.id_expiration_ms)
                dropped = self._trim()
                if expired or dropped:
                    await self._log.write(expired=expired, forget_aborted=dropped)
                for txn_id in expired:
                    md = self._txns.pop(txn_id)
                    self._by_producer.pop(md.producer_id, None)
                    self._locks.pop(txn_id, None)
            except BrokerError as exc:
                log.error("transaction housekeeping failed; retrying next round", extra={"error": str(exc)})

    async def abort_timed_out(self) -> int:
        """Rule 6 now; returns how many transactions were aborted."""
        count = 0
        for md in machine.timed_out(list(self._txns.values()), self._clock()):
            async with self._lock(md.transactional_id):
                current = self._txns.get(md.transactional_id)
                if current is None or current.state != TxnState.ONGOING or current.start_ms != md.start_ms:
                    continue  # it moved on while we waited for the lock
                log.info("aborting a transaction past its timeout; its producer is fenced",
                         extra={"transactional_id": md.transactional_id, "timeout_ms": md.timeout_ms})
                await self._finish(machine.plan_timeout_abort(current, self._clock()))
                count += 1
        return count
