"""Fetched batches as byte ranges (``processors.kafka_records.RawBatches``): over the same fetched
bytes, the records, positions and transaction filtering are aiokafka's own (its ``PartitionRecords``
reading them as ``ConsumerRecord``s), with the per-record kernels compiled and pure; plain batches
are handed out as ``RawSegment``s, any other batch goes to aiokafka's parser as before."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import crc32c
import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED, PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from broker import native
from broker.protocol.records import (
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    Compression,
    RecordSpec,
    encode_batch,
    with_base_offset,
)
from broker.txn.markers import encode_marker
from processors import kafka_records, shuffle_kernels
from processors.kafka_records import RawBatches, RawRecords, RawSegment

TP = TopicPartition("t.repartition.1", 0)
BUILDS = pytest.mark.parametrize("kernels", [native.select(shuffle_kernels), native.pure("processors.shuffle_kernels")],
                                 ids=["selected", "pure"])
Seen = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@pytest.fixture(autouse=True)
def _kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = request.node.callspec.params.get("kernels") if hasattr(request.node, "callspec") else None
    if kernels is not None:
        monkeypatch.setattr(kafka_records, "_kernels", kernels)


def _set_attributes(batch: bytes, bits: int) -> bytes:
    out = bytearray(batch)
    attributes = int.from_bytes(out[21:23], "big") | bits
    out[21:23] = attributes.to_bytes(2, "big")
    out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def batch(base_offset: int, tag: str, n: int, *, producer: int = -1, transactional: bool = False,
          compression: Compression = Compression.NONE, bits: int = 0) -> bytes:
    specs = [RecordSpec(f"{tag}-{i}".encode(), None if i % 4 == 0 else f"k{i}".encode(),
                        (("h", str(i).encode()),) if i % 2 else (), 1_000 + base_offset + (i * 7) % 5)
             for i in range(n)]
    data = encode_batch(specs, base_offset=base_offset, producer_id=producer, producer_epoch=0 if producer >= 0 else -1,
                        base_sequence=0 if producer >= 0 else -1, compression=compression)
    bits |= ATTR_TRANSACTIONAL if transactional else 0
    return _set_attributes(data, bits) if bits else data


def marker(offset: int, producer: int, *, commit: bool) -> bytes:
    return bytes(with_base_offset(encode_marker(producer, 0, commit, timestamp_ms=5_000), offset))


def seen(records: Sequence[Any]) -> list[Seen]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]


def theirs(buf: bytes, isolation: int, aborted: list[tuple[int, int]], start: int = 0) -> tuple[list[Seen], int]:
    records = PartitionRecords(TP, MemoryRecords(buf), list(aborted), start, None, None, True, isolation)
    return seen(list(records)), records.next_fetch_offset


def ours(buf: bytes, isolation: int, aborted: list[tuple[int, int]], start: int = 0, per_take: int = 7
         ) -> tuple[list[Seen], int, list[RawRecords]]:
    records = PartitionRecords(TP, kafka_records._KeptMemoryRecords(buf), list(aborted), start, None, None, True,
                               isolation)
    kafka_records._adopt(records, True)
    assert type(records) is RawBatches
    out: list[Seen] = []
    takes: list[RawRecords] = []
    while True:
        taken = records.take(per_take)
        if not taken:
            return out, records.next_fetch_offset, takes
        assert len(taken) <= per_take
        got = seen(taken)
        assert len(got) == len(taken)
        assert records.next_fetch_offset == got[-1][0] + 1  # as aiokafka moves it past each record handed out
        assert seen([taken[0], taken[-1]]) == [got[0], got[-1]]
        assert seen(taken[1:3]) == got[1:3]
        out += got
        takes.append(taken)


def segments(takes: list[RawRecords]) -> int:
    return sum(isinstance(part, RawSegment) for t in takes for part in t.parts)


def transactions() -> tuple[bytes, list[tuple[int, int]]]:
    """Plain records, a committed transaction (producer 7) interleaved with an aborted one (producer 8),
    their markers, and plain records again; the aborted list a broker sends with them."""
    parts = [batch(0, "plain", 10), batch(10, "committed", 5, producer=7, transactional=True),
             batch(15, "aborted", 6, producer=8, transactional=True),
             batch(21, "committed-too", 4, producer=7, transactional=True),
             marker(25, 8, commit=False), marker(26, 7, commit=True), batch(27, "after", 9)]
    return b"".join(parts), [(8, 15)]


@BUILDS
@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED], ids=["committed", "uncommitted"])
@pytest.mark.parametrize("per_take", [1, 7, 1_000])
def test_transactions_and_control_batches_as_aiokafka_reads_them(kernels: ModuleType, isolation: int,
                                                                  per_take: int) -> None:
    buf, aborted = transactions()
    want, want_position = theirs(buf, isolation, aborted)
    got, position, takes = ours(buf, isolation, aborted, per_take=per_take)
    assert got == want and position == want_position == 36
    values = [v or b"" for _, _, _, v, _ in got]
    assert sum(v.startswith(b"aborted") for v in values) == (0 if isolation == READ_COMMITTED else 6)
    assert not any(len(v) == 6 and v.startswith(b"\x00\x00") for v in values)  # no control record
    assert segments(takes) >= 4 and all(isinstance(p, RawSegment) for t in takes for p in t.parts)


@BUILDS
@pytest.mark.parametrize("start", [3, 10, 12, 26])
def test_a_read_from_inside_a_batch_skips_the_records_before_it(kernels: ModuleType, start: int) -> None:
    """A fetch returns the batches from the one holding the fetch offset: its records before it are skipped."""
    buf, aborted = transactions()
    at = 0
    while int.from_bytes(buf[at : at + 8], "big") + int.from_bytes(buf[at + 23 : at + 27], "big") < start:
        at += 12 + int.from_bytes(buf[at + 8 : at + 12], "big")  # a batch wholly before the fetch offset
    buf = buf[at:]
    want, want_position = theirs(buf, READ_COMMITTED, aborted, start)
    got, position, _ = ours(buf, READ_COMMITTED, aborted, start)
    assert got == want and got[0][0] == (27 if start == 26 else start) and position == want_position


@BUILDS
def test_a_batch_cut_at_the_end_of_the_fetch_is_left_for_the_next_fetch(kernels: ModuleType) -> None:
    whole = batch(0, "a", 10) + batch(10, "b", 10)
    last = batch(20, "c", 10)
    for cut in (1, 11, 60, len(last) - 1):
        buf = whole + last[:cut]
        want, want_position = theirs(buf, READ_COMMITTED, [])
        got, position, _ = ours(buf, READ_COMMITTED, [])
        assert got == want and len(got) == 20 and position == want_position == 20


@BUILDS
def test_batches_that_are_not_plain_go_to_the_parser_in_order(kernels: ModuleType) -> None:
    """Compressed and LogAppendTime batches (the records' time is the batch's), between plain ones."""
    first = batch(0, "a", 5)
    rest = b"".join([batch(5, "gz", 8, compression=Compression.GZIP), batch(13, "b", 5),
                     batch(18, "lat", 4, bits=ATTR_LOG_APPEND_TIME), batch(22, "c", 3)])
    for start, buf in ((0, first + rest), (7, rest)):  # 7: inside the compressed batch
        want, want_position = theirs(buf, READ_UNCOMMITTED, [], start)
        got, position, takes = ours(buf, READ_UNCOMMITTED, [], start, per_take=4)
        assert got == want and got[0][0] == start and position == want_position == 25
        assert {ts for o, ts, *_ in got if 18 <= o < 22} == {1_022}  # the batch's max timestamp
        assert any(isinstance(p, list) for t in takes for p in t.parts) and segments(takes) >= 3


@BUILDS
def test_a_corrupt_batch_fails_as_it_does_for_aiokafka(kernels: ModuleType) -> None:
    good = batch(0, "a", 5)
    bad_crc = bytearray(batch(5, "b", 5))
    bad_crc[-1] ^= 0xFF
    with pytest.raises(CorruptRecordException, match="Invalid CRC"):
        theirs(good + bytes(bad_crc), READ_COMMITTED, [])
    with pytest.raises(CorruptRecordException, match="Invalid CRC"):
        ours(good + bytes(bad_crc), READ_COMMITTED, [])
    # a valid CRC over records that break the v2 layout (one record fewer than the count says):
    # not walked as plain, so aiokafka's parser reads it and fails as it does on any topic
    broken = bytearray(batch(5, "b", 5))
    broken[57:61] = (6).to_bytes(4, "big")
    broken[23:27] = (5).to_bytes(4, "big")  # last offset delta agrees with the count
    broken[17:21] = crc32c.crc32c(bytes(broken[21:])).to_bytes(4, "big")
    with pytest.raises(CorruptRecordException) as theirs_error:
        theirs(good + bytes(broken), READ_COMMITTED, [])
    with pytest.raises(CorruptRecordException) as ours_error:
        ours(good + bytes(broken), READ_COMMITTED, [])
    assert str(ours_error.value) == str(theirs_error.value)


def test_the_fetcher_keeps_the_bytes_it_parses_only_once_asked() -> None:
    """``use_raw_batches`` swaps aiokafka's fetcher's ``MemoryRecords`` for a subclass that keeps the
    fetched bytes; it reads as the original does."""
    buf, _ = transactions()
    kept = kafka_records._KeptMemoryRecords(buf)
    assert kept.raw is buf and isinstance(kept, kafka_records._MemoryRecords)
    original = MemoryRecords(buf)
    while original.has_next():
        assert kept.has_next()
        a, b = original.next_batch(), kept.next_batch()
        assert (a.base_offset, a.next_offset, a.crc) == (b.base_offset, b.next_offset, b.crc)
    assert not kept.has_next()
