"""The coordinator over a real (in-memory) log store: markers, the last stable offset, aborted
entries, and a restart that finds a transaction prepared (rule 8)."""

from __future__ import annotations

import itertools

import crc32c

from broker.log.memory import MemoryLogStore
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import RecordSpec, decode_header, encode_batch, split_complete_batches
from broker.txn.coordinator import TransactionCoordinator
from broker.txn.metadata import PendingOffset, TopicPartition, TxnState
from broker.txn.txn_log import TxnLog


class Offsets:
    def __init__(self) -> None:
        self.committed: dict[str, dict[TopicPartition, PendingOffset]] = {}

    async def commit(self, group: str, offsets: dict[TopicPartition, PendingOffset]) -> None:
        self.committed.setdefault(group, {}).update(offsets)


def _coordinator(store: MemoryLogStore, offsets: Offsets) -> TransactionCoordinator:
    ids = itertools.count(500)
    return TransactionCoordinator(store, lambda: next(ids), offsets.commit)


def _state(coord: TransactionCoordinator, txn_id: str) -> TxnState | None:
    md = coord.describe(txn_id)
    return None if md is None else md.state


def _transactional_batch(pid: int, epoch: int, seq: int) -> bytes:
    batch = bytearray(encode_batch([RecordSpec(b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=seq))
    batch[21:23] = (0x10).to_bytes(2, "big")  # attributes: transactional
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


async def _append_txn(store: MemoryLogStore, coord: TransactionCoordinator, pid: int, epoch: int, seq: int) -> int:
    batch = _transactional_batch(pid, epoch, seq)
    assert coord.check_produce("t", 0, decode_header(batch)) == ErrorCode.NONE
    result = store.partition("t", 0).append_nowait(batch)
    coord.appended("t", 0, pid, result.base_offset)
    return result.base_offset


async def test_abort_keeps_the_lso_until_the_marker_and_lists_the_aborted_range() -> None:
    store = MemoryLogStore()
    store.create_topic("t", 1)
    offsets = Offsets()
    coord = _coordinator(store, offsets)
    await coord.start()
    init = await coord.init_producer_id("x", 60_000, None)
    pid, epoch = init.producer_id, init.producer_epoch
    await store.append_records("t", [RecordSpec(b"before")], partition=0)
    assert await coord.add_partitions("x", pid, epoch, [("t", 0)]) == {("t", 0): ErrorCode.NONE}
    first = await _append_txn(store, coord, pid, epoch, 0)
    plog = store.partition("t", 0)
    await store.append_records("t", [RecordSpec(b"plain")], partition=0)
    assert coord.last_stable_offset(plog) == first == 1
    assert await coord.end_txn("x", pid, epoch, False) == ErrorCode.NONE
    headers, _ = split_complete_batches(plog.read(0, 1 << 20))
    marker = headers[-1]
    assert marker.is_control and marker.producer_id == pid
    assert coord.last_stable_offset(plog) == plog.high_watermark
    assert coord.aborted_between(plog, 0, plog.high_watermark) == [(pid, first)]
    assert coord.aborted_between(plog, marker.base_offset + 1, plog.high_watermark) == []
    # A restart rebuilds the aborted entry from the transaction log.
    await coord.stop()
    again = _coordinator(store, offsets)
    await again.start()
    assert again.aborted_between(plog, 0, plog.high_watermark) == [(pid, first)]
    assert _state(again, "x") == TxnState.COMPLETE_ABORT
    await again.stop()


async def test_a_transaction_left_prepared_is_completed_on_start() -> None:
    store = MemoryLogStore()
    store.create_topic("t", 1)
    offsets = Offsets()
    coord = _coordinator(store, offsets)
    await coord.start()
    init = await coord.init_producer_id("x", 60_000, None)
    pid, epoch = init.producer_id, init.producer_epoch
    await coord.add_partitions("x", pid, epoch, [("t", 0)])
    await coord.add_offsets("x", pid, epoch, "g")
    assert await coord.txn_offset_commit("x", pid, epoch, "g", {("in", 0): (42, None)}) == ErrorCode.NONE
    await _append_txn(store, coord, pid, epoch, 0)
    md = coord.describe("x")
    assert md is not None
    # As if the broker died right after writing PrepareCommit: no marker, offsets not applied.
    await TxnLog(store).write([md.evolve(state=TxnState.PREPARE_COMMIT)])
    await coord.stop()
    assert offsets.committed == {}

    again = _coordinator(store, offsets)
    await again.start()
    plog = store.partition("t", 0)
    headers, _ = split_complete_batches(plog.read(0, 1 << 20))
    assert headers[-1].is_control
    assert again.last_stable_offset(plog) == plog.high_watermark
    assert offsets.committed == {"g": {("in", 0): (42, None)}}
    assert _state(again, "x") == TxnState.COMPLETE_COMMIT
    assert again.aborted_between(plog, 0, plog.high_watermark) == []
    await again.stop()


async def test_zombie_batches_are_fenced_after_a_timeout_abort() -> None:
    store = MemoryLogStore()
    store.create_topic("t", 1)
    clock = [1_000]
    ids = itertools.count(7)
    coord = TransactionCoordinator(store, lambda: next(ids), Offsets().commit, clock=lambda: clock[0])
    await coord.start()
    init = await coord.init_producer_id("x", 1_000, None)
    await coord.add_partitions("x", init.producer_id, init.producer_epoch, [("t", 0)])
    clock[0] += 1_001
    assert await coord.abort_timed_out() == 1
    zombie = decode_header(_transactional_batch(init.producer_id, init.producer_epoch, 1))
    assert coord.check_produce("t", 0, zombie) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert await coord.end_txn("x", init.producer_id, init.producer_epoch, True) == ErrorCode.PRODUCER_FENCED
    await coord.stop()


async def test_an_open_transactions_first_offset_is_found_in_the_log_after_a_restart() -> None:
    """The producer writes before and after the restart, then aborts: the LSO and the aborted range
    start at its first batch before the restart, not at its first append after it."""
    store = MemoryLogStore()
    store.create_topic("t", 1)
    offsets = Offsets()
    coord = _coordinator(store, offsets)
    await coord.start()
    init = await coord.init_producer_id("x", 60_000, None)
    pid, epoch = init.producer_id, init.producer_epoch
    assert await coord.add_partitions("x", pid, epoch, [("t", 0)]) == {("t", 0): ErrorCode.NONE}
    await store.append_records("t", [RecordSpec(b"plain, after the partition joined")], partition=0)
    first = await _append_txn(store, coord, pid, epoch, 0)
    await coord.stop()
    again = _coordinator(store, offsets)
    await again.start()
    plog = store.partition("t", 0)
    assert again.last_stable_offset(plog) == first == 1
    await store.append_records("t", [RecordSpec(b"plain, after the restart")], partition=0)
    await _append_txn(store, again, pid, epoch, 1)
    assert again.last_stable_offset(plog) == first
    assert await again.end_txn("x", pid, epoch, False) == ErrorCode.NONE
    assert again.aborted_between(plog, 0, plog.high_watermark) == [(pid, first)]
    await again.stop()
