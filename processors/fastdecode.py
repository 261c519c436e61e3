"""Record decoding for the attached processor's hot path.

Stored RecordBatch v2 bytes are decoded with aiokafka's C record parser (``MemoryRecords``), about
ten times faster than a pure-Python varint loop; its record objects already have the attributes a
processor reads (offset, timestamp, key, value, headers), so no per-record copy is made.
Compressed batches go to the broker's decoder instead, whose decompression is bounded (aiokafka's
is not: a small batch could expand to gigabytes); control batches are skipped. Parse failures surface
as the broker's ``CorruptRecordError``.

``stored_from`` goes one step further for the runner's queue: stored uncompressed batches stay bytes
(``StoredRecords``; a standalone processor's fetched batches too, ``processors.kafka_source``) until the
executor walks them (``record_kernels.decode_stored_json``), so no record object is made at all, and
none waits in the runner's queue for the garbage collector to rescan (a fifth of the attached
runner's CPU went to those collections, bench/RESULTS.md). Anything else (a compressed batch) is
decoded into record objects as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

from aiokafka.errors import KafkaError
from aiokafka.record.memory_records import MemoryRecords

from broker.errors import CorruptRecordError, InvalidRecordError
from broker.native import select
from broker.protocol.records import decode_records
from processors import record_kernels
from processors.executor import RecordLike
from processors.source_record import SourceRecord

__all__ = ["Fetched", "SegmentSpan", "SourceRecord", "StoredRecords", "StoredSpan", "as_records", "decode_from",
           "first_offset", "next_offset", "stored_from"]


def decode_from(data: bytes, min_offset: int, max_records: int = 1 << 62) -> list[RecordLike]:
    """Records with offset ≥ ``min_offset`` from whole stored batches, stopping after the batch
    that reaches ``max_records``."""
    out: list[Any] = []
    end = 0
    try:
        records = MemoryRecords(data)
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            start, end = end, end + 12 + int.from_bytes(data[end + 8 : end + 12], "big")
            if batch.is_control_batch or batch.base_offset + batch.last_offset_delta < min_offset:
                continue
            decoded: Any = batch
            if batch.compression_type:
                decoded = decode_records(memoryview(data)[start:end])
            if batch.base_offset >= min_offset:
                out.extend(decoded)
            else:
                out.extend(r for r in decoded if r.offset >= min_offset)
            if len(out) >= max_records:
                break
    except (KafkaError, ValueError, IndexError, InvalidRecordError) as exc:
        raise CorruptRecordError(f"cannot decode stored records: {exc!r}") from exc
    return out


_KERNELS = select(record_kernels)
_HEADER_BYTES = 61  # a v2 batch header; records follow it


class StoredSpan:
    """Whole uncompressed stored batches, ``data[start:end]``: their records at or after ``min_offset``."""

    __slots__ = ("data", "end", "min_offset", "start")

    def __init__(self, data: bytes, start: int, end: int, min_offset: int) -> None:
        self.data = data
        self.start = start
        self.end = end
        self.min_offset = min_offset

    def cursor(self) -> Any:  # the selected build's StoredCursor
        return _KERNELS.StoredCursor(self.data, self.start, self.end, self.min_offset)

    def records(self) -> list[RecordLike]:
        return decode_from(self.data[self.start : self.end], self.min_offset)


class SegmentSpan:
    """Records of one fetched CreateTime v2 batch (``processors.kafka_records.RawSegment``: ``data``,
    ``pos``, ``count``, ``offset``, ``base_ts`` and ``records()``), read where they lie."""

    __slots__ = ("segment",)

    def __init__(self, segment: Any) -> None:
        self.segment = segment

    def cursor(self) -> Any:
        s = self.segment
        return _KERNELS.segment_cursor(s.data, s.pos, s.count, s.offset, s.base_ts)

    def records(self) -> list[RecordLike]:
        return list(self.segment.records())


class StoredRecords:
    """Records not decoded into objects: ``parts`` are ``StoredSpan``s and ``SegmentSpan``s, whose
    ``cursor()`` is where ``record_kernels.decode_stored_json`` walks them, and lists of record objects
    (batches only a decoder reads: compressed, with offset gaps). ``records()`` decodes them all."""

    __slots__ = ("count", "first_offset", "next_offset", "parts")

    def __init__(self, parts: list[StoredSpan | SegmentSpan | list[RecordLike]], first: int, after: int,
                 count: int) -> None:
        self.parts = parts
        self.first_offset = first  # where the first record is (at or after): a seek back reads them again
        self.next_offset = after  # after the last batch: where reading goes on
        self.count = count  # how many records (from batch headers: at most that many)

    def __len__(self) -> int:
        return self.count

    def records(self) -> list[RecordLike]:
        out: list[RecordLike] = []
        for part in self.parts:
            out += part if isinstance(part, list) else part.records()
        return out


Fetched: TypeAlias = "Sequence[RecordLike] | StoredRecords"  # what a Source hands the runner per partition


def stored_from(data: bytes, min_offset: int, max_records: int = 1 << 62) -> StoredRecords | list[RecordLike]:
    """``decode_from``'s records as ``StoredRecords`` when every batch is uncompressed v2 (the batch
    that reaches ``max_records`` is the last, as there); otherwise (or when nothing at or after
    ``min_offset`` is there) what ``decode_from`` returns."""
    pos = 0
    size = len(data)
    count = 0
    first = -1
    after = min_offset
    start = end = 0
    while size - pos >= _HEADER_BYTES and count < max_records:
        length = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        if length < _HEADER_BYTES or pos + length > size:
            break  # a batch cut short by the read's byte limit (or corrupt: decode_from says which)
        attributes = int.from_bytes(data[pos + 21 : pos + 23], "big")
        if data[pos + 16] != 2 or attributes & 0x07:
            return decode_from(data, min_offset, max_records)  # compressed (bounded decompression) or not v2
        base = int.from_bytes(data[pos : pos + 8], "big", signed=True)
        last = base + int.from_bytes(data[pos + 23 : pos + 27], "big", signed=True)
        pos += length
        if last < min_offset:
            start = pos  # wholly before: not walked
            continue
        end, after = pos, last + 1
        if attributes & 0x20:
            continue  # a control batch: no record, stepped over
        if first < 0:
            first = max(base, min_offset)
        records = int.from_bytes(data[pos - length + 57 : pos - length + 61], "big", signed=True)
        count += min(records, last - max(base, min_offset) + 1)
    if count <= 0:
        return decode_from(data, min_offset, max_records)
    return StoredRecords([StoredSpan(data, start, end, min_offset)], first, after, count)


def as_records(records: Fetched) -> Sequence[RecordLike]:
    """``records`` as record objects (``StoredRecords`` decoded)."""
    return records.records() if isinstance(records, StoredRecords) else records


def first_offset(records: Fetched) -> int:
    """The offset of the first of ``records`` (of ``StoredRecords``: at most that)."""
    return records.first_offset if isinstance(records, StoredRecords) else records[0].offset


def next_offset(records: Fetched) -> int:
    """Where reading goes on after ``records`` (of ``StoredRecords``: after their last batch)."""
    return records.next_offset if isinstance(records, StoredRecords) else records[-1].offset + 1
