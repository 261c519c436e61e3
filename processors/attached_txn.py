"""Exactly-once for attached processors: each checkpoint interval is one transaction of the broker's
own transaction coordinator (``broker.txn``), written in-process the way a transactional producer
would over the Kafka protocol.

The runner's order is unchanged (``processors.runner``): outputs, then the checkpoint, then
``Source.commit``. Here the outputs and the checkpoint records are transactional batches of one
producer id (``transactional.id`` ``<pipeline>-attached``), each partition registered with the
coordinator before its first batch (so the partition's last stable offset stops there), and the
commit is ``EndTxn(commit)``: the coordinator makes it durable in ``__transaction_state`` and writes
the markers. The checkpoint holds the input positions, so outputs, state and positions commit
together. A kill -9 leaves the interval open; at the next start ``InitProducerId`` on the same id
bumps the epoch and aborts it (the coordinator's rule), and the restore reads only committed
checkpoints (``load`` reads ``read_committed``). Read with ``isolation.level=read_committed``.

The checkpoint topic keeps no history here: after each commit its log start moves to the first
offset of the checkpoint just committed (``delete_records``), since the log cleaner keeps
transactional batches as they are.

The input is read ``read_committed`` (``TxnLogSource``): a transactional producer's records reach the
pipeline once committed, never when aborted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Collection
from typing import TYPE_CHECKING

import crc32c

from broker.errors import BrokerError
from broker.log.api import LogStore
from broker.log.partition_log import PartitionLog
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import (
    ATTR_TRANSACTIONAL,
    RecordSpec,
    decode_records,
    encode_batch,
    iter_batches,
    unpack_header,
)
from broker.txn.committed import StableOffsets, read_committed
from processors.checkpoint import (
    MAX_CHECKPOINT_BYTES,
    AnchorOffsets,
    CheckpointCodec,
    CheckpointRecord,
    PartitionRestore,
    checkpoint_topic,
    load_from_tail,
)
from processors.errors import CheckpointError, SourceError
from processors.executor import OutRecord, TopicPartition
from processors.sources import AssignmentListener, LogSource

if TYPE_CHECKING:
    from broker.txn.coordinator import TransactionCoordinator

__all__ = ["AttachedTransaction", "TxnCheckpointStore", "TxnLogSink", "TxnLogSource", "attached_transactional_id"]

log = logging.getLogger("processors.attached_txn")

_ATTRIBUTES_AT = 21  # RecordBatch v2: base offset 8, length 4, leader epoch 4, magic 1, crc 4
_CRC_AT = 17
_BATCH_RECORDS = 5_000


def attached_transactional_id(pipeline: str) -> str:
    """One attached instance per pipeline per broker: the id only needs to survive restarts."""
    return f"{pipeline}-attached"


def _transactional(batch: bytes) -> bytes:
    out = bytearray(batch)
    attributes = int.from_bytes(out[_ATTRIBUTES_AT:_ATTRIBUTES_AT + 2], "big") | ATTR_TRANSACTIONAL
    out[_ATTRIBUTES_AT:_ATTRIBUTES_AT + 2] = attributes.to_bytes(2, "big")
    out[_CRC_AT:_CRC_AT + 4] = crc32c.crc32c(bytes(out[_ATTRIBUTES_AT:])).to_bytes(4, "big")
    return bytes(out)


class AttachedTransaction:
    """The in-process transactional producer: one open transaction at a time."""

    def __init__(self, store: LogStore, coordinator: TransactionCoordinator, transactional_id: str,
                 *, timeout_ms: int) -> None:
        self.store = store
        self.coordinator = coordinator
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = -1
        self.epoch = -1
        self._in_txn: set[TopicPartition] = set()
        self._sequences: dict[TopicPartition, int] = defaultdict(int)
        self._lock = asyncio.Lock()
        self.commits = 0

    async def init(self) -> None:
        """InitProducerId: fences an earlier run of this id and aborts the transaction it left open
        (answered CONCURRENT_TRANSACTIONS until that abort is complete, as Kafka does)."""
        for _ in range(100):
            result = await self.coordinator.init_producer_id(self.transactional_id, self.timeout_ms, None)
            if result.error == ErrorCode.NONE:
                self.producer_id, self.epoch = result.producer_id, result.producer_epoch
                self._sequences.clear()
                return
            if result.error != ErrorCode.CONCURRENT_TRANSACTIONS:
                raise SourceError(f"{self.transactional_id}: InitProducerId failed: {result.error.name}")
            await asyncio.sleep(0.05)
        raise SourceError(f"{self.transactional_id}: InitProducerId kept answering CONCURRENT_TRANSACTIONS")

    async def append(self, topic: str, partition: int, specs: list[RecordSpec]) -> int:
        """Append ``specs`` to the open transaction (beginning it if needed); returns the base offset."""
        tp = (topic, partition)
        if tp not in self._in_txn:
            errors = await self.coordinator.add_partitions(self.transactional_id, self.producer_id, self.epoch, [tp])
            if errors[tp] != ErrorCode.NONE:
                raise SourceError(f"{self.transactional_id}: AddPartitionsToTxn {topic}-{partition}: "
                                  f"{errors[tp].name}")
            self._in_txn.add(tp)
        batch = _transactional(encode_batch(specs, producer_id=self.producer_id, producer_epoch=self.epoch,
                                            base_sequence=self._sequences[tp]))
        code = self.coordinator.check_produce(topic, partition, unpack_header(batch))
        if code != ErrorCode.NONE:  # fenced, or aborted by the coordinator's timeout
            raise SourceError(f"{self.transactional_id}: transactional append to {topic}-{partition} "
                              f"refused: {code.name}")
        result = await self.store.append(topic, partition, batch)
        self.coordinator.appended(topic, partition, self.producer_id, result.base_offset)
        self._sequences[tp] = (self._sequences[tp] + len(specs)) & 0x7FFFFFFF
        return result.base_offset

    async def commit(self) -> None:
        if not self._in_txn:
            return
        code = await self.coordinator.end_txn(self.transactional_id, self.producer_id, self.epoch, True)
        if code != ErrorCode.NONE:
            raise SourceError(f"{self.transactional_id}: EndTxn(commit) failed: {code.name}")
        self._in_txn.clear()
        self.commits += 1

    async def abort(self) -> None:
        if self._in_txn and self.producer_id >= 0:
            await self.coordinator.end_txn(self.transactional_id, self.producer_id, self.epoch, False)
            self._in_txn.clear()


class TxnLogSink:
    """``LogSink`` whose appends belong to the open transaction."""

    def __init__(self, txn: AttachedTransaction) -> None:
        self.txn = txn

    async def write(self, records: list[OutRecord]) -> None:
        store = self.txn.store
        groups: dict[TopicPartition, list[RecordSpec]] = defaultdict(list)
        try:
            for r in records:
                store.ensure_topic(r.topic)
                p = store.partition_for(r.topic, r.key) if r.partition is None else r.partition
                groups[(r.topic, p)].append(RecordSpec(r.value, r.key, r.headers, r.timestamp))
            async with self.txn._lock:
                for (topic, p), specs in groups.items():
                    for i in range(0, len(specs), _BATCH_RECORDS):
                        await self.txn.append(topic, p, specs[i : i + _BATCH_RECORDS])
        except BrokerError as exc:
            raise SourceError(f"cannot append results: {exc}") from exc

    async def flush(self) -> None:
        return None  # appends return once durable; they become visible at the commit

    async def abort(self) -> None:
        return None  # attached processors own every partition: none is ever lost to another member


class TxnLogSource(LogSource):
    """``LogSource`` that reads ``read_committed`` (up to the last stable offset, without aborted
    transactions' records and control batches: ``broker.txn.committed``, the broker's own rules), and
    whose commit ends the interval's transaction (the positions are in the checkpoint written just
    before, inside it)."""

    def __init__(self, store: LogStore, topics: tuple[str, ...], txn: AttachedTransaction) -> None:
        super().__init__(store, topics)
        self.txn = txn

    def _stored(self, log: PartitionLog, offset: int) -> tuple[bytes, int]:
        read = read_committed(self.txn.coordinator, log, offset, self.max_bytes)
        return read.data, read.next_offset

    def _wait_at(self, tp: TopicPartition) -> int:
        position = self.positions[tp]
        log = self.store.partition(*tp)
        if position < self.txn.coordinator.last_stable_offset(log):
            return position
        return max(position, log.high_watermark)  # held at an open transaction: its marker is an append

    def end_offset(self, tp: TopicPartition) -> int | None:
        return self.txn.coordinator.last_stable_offset(self.store.partition(*tp))

    async def start(self, on_assigned: AssignmentListener, on_revoked: AssignmentListener,
                    on_lost: AssignmentListener | None = None) -> None:
        await self.txn.init()  # before the checkpoint is loaded: what a crash left open is aborted first
        await super().start(on_assigned, on_revoked, on_lost)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        async with self.txn._lock:
            await self.txn.commit()


class TxnCheckpointStore:
    """Checkpoints in ``_checkpoints.<pipeline>`` written inside the transaction; ``load`` returns only
    committed ones (read as a read_committed consumer reads: ``committed_records``)."""

    def __init__(self, txn: AttachedTransaction, pipeline: str) -> None:
        self.txn = txn
        self.store = txn.store
        self.topic = checkpoint_topic(pipeline)
        self.codec = CheckpointCodec()
        self.anchors = AnchorOffsets()
        self._first_of_interval: int | None = None

    def _log(self) -> PartitionLog:
        if not self.store.has_topic(self.topic):
            config = self.store.default_config.with_kafka_configs({
                "max.message.bytes": str(MAX_CHECKPOINT_BYTES), "cleanup.policy": "delete",
                "retention.ms": "-1", "retention.bytes": "-1"})
            self.store.create_topic(self.topic, 1, config, internal=True)
        return self.store.partition(self.topic, 0)

    async def load(self, tps: Collection[TopicPartition] | None = None) -> dict[TopicPartition, PartitionRestore]:
        try:
            plog = self._log()

            async def read(lo: int, hi: int) -> list[CheckpointRecord]:
                return committed_records(self.txn.coordinator, plog, lo, hi)

            return await load_from_tail(read, plog.log_start_offset, plog.high_watermark, None, self.codec)
        except BrokerError as exc:
            raise CheckpointError(f"cannot read {self.topic}: {exc}") from exc

    async def save(self, records: list[CheckpointRecord]) -> None:
        try:
            plog = self._log()
            async with self.txn._lock:
                first = await self.txn.append(self.topic, 0, [RecordSpec(v, k) for k, v in records])
                await self.txn.commit()  # the interval ends here (the source's commit finds nothing open)
            # what no partition's newest committed checkpoint needs (before its head or its base) is history
            before = self.anchors.saved(self.codec, first)
            if before is not None:
                await plog.delete_records(before)
        except BrokerError as exc:
            raise CheckpointError(f"cannot write {self.topic}: {exc}") from exc


def committed_records(txns: StableOffsets, plog: PartitionLog, lo: int, hi: int) -> list[CheckpointRecord]:
    """The records of ``[lo, hi)`` a read_committed consumer gets: below the last stable offset, none
    of an aborted transaction (``broker.txn.committed``, the broker's own rules)."""
    out: list[CheckpointRecord] = []
    offset = max(lo, plog.log_start_offset)
    while offset < hi:
        read = read_committed(txns, plog, offset, 4 * 1024 * 1024)
        if read.next_offset <= offset:
            break  # at the last stable offset: what follows is not committed (yet)
        view = memoryview(read.data)
        for pos, header in iter_batches(view, verify=False):
            out += [(r.key or b"", r.value) for r in decode_records(view[pos : pos + header.size], header)
                    if offset <= r.offset < hi]
        offset = read.next_offset
    return out
