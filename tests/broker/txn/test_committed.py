"""``broker.txn.committed``: what a read_committed reader keeps of stored batches (Kafka's consumer
rules over the broker's aborted-transaction list), and the in-process read over a partition."""

from __future__ import annotations

import crc32c

from broker.log.memory import MemoryLogStore
from broker.log.partition_log import PartitionLog
from broker.protocol.records import ATTR_TRANSACTIONAL, RecordSpec, decode_records, encode_batch, split_complete_batches
from broker.txn.committed import drop_aborted, read_committed
from broker.txn.markers import encode_marker
from broker.txn.partitions import PartitionTxnIndex


def _values(data: bytes) -> list[bytes | None]:
    headers, _ = split_complete_batches(data)
    out: list[bytes | None] = []
    pos = 0
    for header in headers:
        out += [r.value for r in decode_records(memoryview(data)[pos : pos + header.size], header)]
        pos += header.size
    return out


def _txn(values: list[bytes], pid: int, base_offset: int = 0) -> bytes:
    batch = bytearray(encode_batch([RecordSpec(v) for v in values], producer_id=pid, producer_epoch=0,
                                   base_offset=base_offset))
    batch[22] |= ATTR_TRANSACTIONAL  # the low byte of the attributes (offset 21, two bytes)
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


class _Index:
    """The coordinator's view of one partition (``StableOffsets``), from a ``PartitionTxnIndex``."""

    def __init__(self) -> None:
        self.index = PartitionTxnIndex()

    def last_stable_offset(self, plog: PartitionLog) -> int:
        return self.index.last_stable_offset(plog.high_watermark)

    def aborted_between(self, plog: PartitionLog, start: int, end: int) -> list[tuple[int, int]]:
        return self.index.aborted_between(start, end)


async def _log() -> tuple[PartitionLog, _Index]:
    """Offsets: 0-1 pid 1 (aborted, marker 5), 2-3 pid 2 (committed, marker 4), 6 plain,
    7-8 pid 1 again (committed, marker 9), 10-11 pid 3 (open)."""
    store = MemoryLogStore()
    store.create_topic("t", 1)
    plog = store.partition("t", 0)
    idx = _Index()
    for pid, values in ((1, [b"a1", b"a2"]), (2, [b"c1", b"c2"])):
        idx.index.begin(pid, plog.high_watermark)
        idx.index.appended(pid, (await plog.append(_txn(values, pid))).base_offset)
    idx.index.end(2, (await plog.append(encode_marker(2, 0, True, timestamp_ms=0))).base_offset, True)
    idx.index.end(1, (await plog.append(encode_marker(1, 0, False, timestamp_ms=0))).base_offset, False)
    await plog.append(encode_batch([RecordSpec(b"plain")]))
    idx.index.begin(1, plog.high_watermark)
    idx.index.appended(1, (await plog.append(_txn([b"c3", b"c4"], 1))).base_offset)
    idx.index.end(1, (await plog.append(encode_marker(1, 0, True, timestamp_ms=0))).base_offset, True)
    idx.index.begin(3, plog.high_watermark)
    idx.index.appended(3, (await plog.append(_txn([b"o1", b"o2"], 3))).base_offset)
    return plog, idx


async def test_read_committed_keeps_committed_and_plain_records_up_to_the_last_stable_offset() -> None:
    plog, idx = await _log()
    read = read_committed(idx, plog, 0, 1 << 20)
    assert _values(read.data) == [b"c1", b"c2", b"plain", b"c3", b"c4"]
    assert read.last_stable_offset == read.next_offset == 10 < plog.high_watermark
    assert read_committed(idx, plog, 10, 1 << 20).data == b""  # held at the open transaction
    tail = read_committed(idx, plog, 4, 1 << 20)  # from a marker: the aborted entry still applies past it
    assert _values(tail.data) == [b"plain", b"c3", b"c4"] and tail.next_offset == 10


async def test_a_read_of_only_dropped_batches_moves_on() -> None:
    plog, idx = await _log()
    read = read_committed(idx, plog, 0, 1)  # one batch: pid 1's aborted one
    assert read.data == b"" and read.next_offset == 2


async def test_drop_aborted_returns_the_bytes_untouched_when_nothing_is_dropped() -> None:
    data = encode_batch([RecordSpec(b"x")]) + _txn([b"y"], 4, base_offset=1)
    assert drop_aborted(data, []) is data
    assert _values(drop_aborted(data, [(4, 1)])) == [b"x"]
