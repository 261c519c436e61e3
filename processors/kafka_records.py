"""Fetched records for standalone processors without aiokafka's per-record ``ConsumerRecord``.

aiokafka's consumer decodes each fetched RecordBatch with its C parser and then wraps every record
in a ``ConsumerRecord`` dataclass in Python (eleven fields, a tuple of headers, two size counts):
in a profile of the standalone processor that wrapping was the largest single cost of the consumer.
The parser's own record objects already have what a processor reads (offset, timestamp, key, value,
headers: ``processors.executor.RecordLike``), so ``KafkaSource`` hands those on instead.

How: ``use_parser_records(consumer)`` changes, for that one consumer, the class of each
``PartitionRecords`` its fetcher stores to ``ParserRecords``, whose batch handling is aiokafka's
``_unpack_records`` (CRC check, read_committed filtering of aborted transactions, control batches
skipped, offsets below the fetch position skipped, the position advanced as each record is handed
out) with the wrapping left out, each batch's records decoded in one C loop, and handed out a slice
at a time (``take``) rather than one generator step per record; its ``FetchResult`` gets a ``getall``
that takes its slice in one call. Nothing else about the consumer
changes (groups, positions, pauses, commits). It relies on aiokafka's fetcher internals (``_fetcher._records``,
``PartitionRecords``): the version is pinned in pyproject.toml, and when they are not as expected the
consumer is left as it is (``ConsumerRecord`` has the same attributes) and a warning says so;
``tests/processors/test_kafka_records.py`` fails then.

Raw batches (``use_raw_batches``, a repartition topic's downstream stage): no record object at all.
Each fetched batch goes through the same rules (``ParserRecords._usable``: the CRC checked as aiokafka
checks it for every topic, ``check_crcs`` on; read_committed skips aborted transactions' batches; control
batches skipped), then a plain batch (v2, uncompressed, CreateTime, its records walked as Kafka's
``DefaultRecord.readFrom`` reads them: ``broker.protocol.record_walk``, offset deltas 0, 1, 2, ...) is
handed out as ``RawSegment``s, byte ranges of the fetched bytes that the executor reads in a compiled
loop (``processors.shuffle_kernels.read_raw``); any other batch is decoded by aiokafka's parser as above
(and fails as it does). ``getmany`` returns one ``RawRecords`` per partition, a sequence whose length is
its record count (aiokafka's ``max_records`` accounting and the runner's offsets work on it unchanged).
aiokafka's C ``MemoryRecords`` does not show the bytes it parses, so ``use_raw_batches`` replaces the
fetcher module's ``MemoryRecords`` with a subclass that keeps them (``_KeptMemoryRecords``: every
consumer in the process gets it from then on, reading as before); a fetch parsed without it (none
should be) is handed out as parser records.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from types import MethodType
from typing import Any, cast, overload

from aiokafka.consumer import fetcher as fetcher_module
from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException

from broker.errors import InvalidRecordError
from broker.native import select
from broker.protocol import record_walk
from processors import shuffle_kernels
from processors.fastdecode import SourceRecord

__all__ = ["ParserRecords", "RawBatches", "RawRecords", "RawSegment", "use_parser_records", "use_raw_batches"]

log = logging.getLogger("processors.kafka_records")


class ParserRecords(PartitionRecords):
    """A fetched partition's records as the C parser's record objects (see the module docstring),
    handed out a batch slice at a time (``take``), not one generator step per record."""

    _pending: list[Any]  # the current batch's records at or after the fetch position
    _at: int  # how many of them were taken
    _batch_end: int | None  # the current batch's next offset (where the position goes once it is used up)

    def take(self, max_records: int | None) -> list[Any]:
        """Up to ``max_records`` next records (None: all), the position (``next_fetch_offset``) moved as
        aiokafka's record generator moves it: past each record handed out, and to the batch's next
        offset when the records after a batch's last one are asked for."""
        out: list[Any] = []
        limit = (1 << 62) if max_records is None else max_records
        while len(out) < limit:
            pending, at = self._pending, self._at
            if at < len(pending):
                chunk = pending[at : at + limit - len(out)]
                out += chunk
                self._at = at + len(chunk)
                self.next_fetch_offset = chunk[-1].offset + 1
                continue
            if self._batch_end is not None:
                # v2 batches keep their last offset even when compaction removed the last record
                self.next_fetch_offset, self._batch_end = self._batch_end, None
            if not self._next_batch():
                break
        return out

    def _next_batch(self) -> bool:
        records = self._records
        while records.has_next():
            batch = records.next_batch()
            if self._usable(batch):
                self._decode(batch)
                return True
        return False

    def _usable(self, batch: Any) -> bool:
        """Whether ``batch`` holds records to hand out: False for a control batch and, read_committed,
        for a batch of an aborted transaction (the position then moves past it). A CRC that does not
        match raises ``CorruptRecordException``."""
        # aiokafka 0.14 PartitionRecords._unpack_records (Apache-2.0), less the ConsumerRecord wrapping
        if self._check_crcs and not batch.validate_crc():
            raise CorruptRecordException(f"Invalid CRC - {self._tp}")
        if self._isolation_level == READ_COMMITTED and batch.producer_id is not None:
            self._consume_aborted_up_to(batch.base_offset)
            if batch.is_control_batch and self._contains_abort_marker(batch):
                self._aborted_producers.discard(batch.producer_id)
            if batch.is_transactional and batch.producer_id in self._aborted_producers:
                self.next_fetch_offset = batch.next_offset
                return False
        if batch.is_control_batch:
            self.next_fetch_offset = batch.next_offset
            return False
        return True

    def _decode(self, batch: Any) -> None:
        decoded = list(batch)  # one C loop per batch
        first = self.next_fetch_offset
        if decoded and decoded[0].offset < first:  # a compressed batch read from its start
            decoded = [record for record in decoded if record.offset >= first]
        self._pending, self._at, self._batch_end = decoded, 0, batch.next_offset

    def __iter__(self) -> ParserRecords:
        return self

    def __next__(self) -> Any:
        taken = self.take(1)
        if not taken:
            raise StopIteration
        return taken[0]


# -- raw batches (a repartition topic's downstream: processors.repartition.ShuffleReader) ---------------

_kernels = select(shuffle_kernels)
_walk = select(record_walk).walk_records
_RECORDS_AT = 61  # a v2 batch's header: base offset ... record count; the records follow
_COUNT_AT = 57
_LOG_APPEND_TIME = 0x08


class RawSegment:
    """``count`` records of one walked v2 batch from byte ``pos`` of ``data``, the first at ``offset``;
    ``base_ts`` is the batch's first timestamp (see ``processors.shuffle_kernels``)."""

    __slots__ = ("base_ts", "count", "data", "offset", "pos")

    def __init__(self, data: bytes, pos: int, count: int, offset: int, base_ts: int) -> None:
        self.data = data
        self.pos = pos
        self.count = count
        self.offset = offset
        self.base_ts = base_ts

    def records(self) -> list[SourceRecord]:
        return cast(list[SourceRecord], _kernels.decode_raw(self.data, self.pos, self.count, self.offset,
                                                            self.base_ts, SourceRecord))


class RawRecords(Sequence[Any]):
    """Fetched records of one partition as ``parts``: ``RawSegment``s, and lists of parser records for
    batches that are not plain (compressed, LogAppendTime, legacy or with offset gaps). A sequence of
    records like any other (indexing and iterating make ``SourceRecord``s); a reader that knows it
    reads the segments' bytes where they lie (``processors.shuffle_kernels.read_raw``)."""

    __slots__ = ("_len", "parts")

    def __init__(self, parts: list[RawSegment | list[Any]], count: int) -> None:
        self.parts = parts
        self._len = count

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("record index out of range")
        for part in self.parts:
            if not isinstance(part, RawSegment):
                if i < len(part):
                    return part[i]
                i -= len(part)
            elif i < part.count:
                pos = _kernels.skip_records(part.data, part.pos, i)
                return _kernels.decode_raw(part.data, pos, 1, part.offset + i, part.base_ts, SourceRecord)[0]
            else:
                i -= part.count
        raise IndexError("record index out of range")  # (the parts hold fewer records than counted)

    def __iter__(self) -> Iterator[Any]:
        for part in self.parts:
            yield from (part.records() if isinstance(part, RawSegment) else part)


class RawBatches(ParserRecords):
    """A fetched partition handed out as ``RawRecords``: each batch goes through ``ParserRecords``'
    rules (CRC, read_committed, control batches, the fetch position); a plain one (v2, uncompressed,
    CreateTime, records walked as Kafka reads them: ``broker.protocol.record_walk``) is handed out
    as byte ranges of the fetched bytes, any other is decoded by aiokafka's parser as before."""

    _data: bytes  # the fetched bytes (``_KeptMemoryRecords.raw``)
    _next: int  # where the next batch starts in them
    _left: int  # records of the current plain batch not handed out yet, from ...
    _rpos: int  # ... this byte, the first at ...
    _roffset: int  # ... this offset; the batch's first timestamp:
    _rts: int

    def take(self, max_records: int | None) -> RawRecords:  # type: ignore[override]
        parts: list[RawSegment | list[Any]] = []
        n = 0
        limit = (1 << 62) if max_records is None else max_records
        while n < limit:
            left = self._left
            if left:
                k = min(left, limit - n)
                parts.append(RawSegment(self._data, self._rpos, k, self._roffset, self._rts))
                n += k
                self._left = left - k
                self._roffset += k
                if self._left:
                    self._rpos = _kernels.skip_records(self._data, self._rpos, k)
                self.next_fetch_offset = self._roffset
                continue
            pending, at = self._pending, self._at
            if at < len(pending):
                chunk = pending[at : at + limit - n]
                parts.append(chunk)
                n += len(chunk)
                self._at = at + len(chunk)
                self.next_fetch_offset = chunk[-1].offset + 1
                continue
            if self._batch_end is not None:
                self.next_fetch_offset, self._batch_end = self._batch_end, None
            if not self._next_batch():
                break
        return RawRecords(parts, n)

    def _next_batch(self) -> bool:
        records, data = self._records, self._data
        while records.has_next():
            start = self._next
            batch = records.next_batch()  # the batch of 12 + its length bytes from start (MemoryRecords' rule)
            end = self._next = start + 12 + int.from_bytes(data[start + 8 : start + 12], "big", signed=True)
            if not self._usable(batch):
                continue
            if not self._plain(batch, start, end):
                self._decode(batch)
                return True
            count = batch.last_offset_delta + 1
            skip = max(self.next_fetch_offset - batch.base_offset, 0)  # a read from inside the batch
            pos = start + _RECORDS_AT
            if 0 < skip < count:
                pos = _kernels.skip_records(data, pos, skip)
            self._rpos, self._left, self._roffset = pos, max(count - skip, 0), batch.base_offset + skip
            self._rts = batch.first_timestamp
            self._pending, self._at, self._batch_end = [], 0, batch.next_offset
            return True
        return False

    def _plain(self, batch: Any, start: int, end: int) -> bool:
        if batch.magic != 2 or batch.compression_type or batch.attributes & _LOG_APPEND_TIME:
            return False
        data = self._data
        count = int.from_bytes(data[start + _COUNT_AT : start + _RECORDS_AT], "big", signed=True)
        if count != batch.last_offset_delta + 1 or count <= 0:
            return False  # offset gaps (compaction) or nothing: the parser's reading
        try:
            _walk(data, start + _RECORDS_AT, end, count, False)
        except InvalidRecordError:  # malformed records: the parser's reading (and its error), as for any topic
            return False
        return True


def _keeping(base: type[Any]) -> type[Any]:
    class KeptMemoryRecords(base):
        """aiokafka's ``MemoryRecords`` that keeps the fetched bytes (its C build does not show them)."""

        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.raw = data

    return KeptMemoryRecords


_MemoryRecords: type[Any] = fetcher_module.MemoryRecords
_KeptMemoryRecords = _keeping(_MemoryRecords)


def _getall(result: FetchResult, max_records: int | None = None) -> list[Any]:
    """``FetchResult.getall`` of a result holding ``ParserRecords``: its records taken in one call."""
    # aiokafka 0.14 FetchResult.getall (Apache-2.0) with the per-record loop replaced by take()
    if not result.check_assignment(result._topic_partition) or not result.has_more():
        return []
    records: ParserRecords = result._partition_records
    taken = records.take(max_records)
    result._update_position()
    if max_records is None or len(taken) < max_records:
        result._partition_records = None  # used up (aiokafka keeps it when the limit stopped the loop)
    return taken


class _Results(OrderedDict[Any, Any]):
    """The fetcher's buffered results; fetched partitions become ``ParserRecords`` (``raw``:
    ``RawBatches`` where the fetched bytes were kept) as they are stored."""

    raw = False

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult and type(result._partition_records) is PartitionRecords:
            _adopt(result._partition_records, self.raw)
            # on the instance: the fetcher checks type(result) is FetchResult, so no subclass
            result.getall = MethodType(_getall, result)
        super().__setitem__(tp, result)


def _adopt(records: Any, raw: bool) -> None:
    records.__class__ = ParserRecords
    records._records_iterator = None  # aiokafka's record generator (not started): take() replaces it
    records._pending, records._at, records._batch_end = [], 0, None
    kept = records._records
    if raw and type(kept) is _KeptMemoryRecords and type(kept.raw) is bytes:
        records.__class__ = RawBatches
        records._data, records._next, records._left = kept.raw, 0, 0
        records._rpos = records._roffset = records._rts = 0


def use_parser_records(consumer: Any) -> bool:
    """Make a started ``AIOKafkaConsumer`` return parser records from ``getmany`` (True when it does)."""
    return _hook(consumer, raw=False)


def use_raw_batches(consumer: Any) -> bool:
    """Make a started ``AIOKafkaConsumer`` return ``RawRecords`` from ``getmany`` (True when it does)."""
    if fetcher_module.MemoryRecords is _MemoryRecords:  # from now on the fetcher keeps the bytes it parses
        fetcher_module.MemoryRecords = _KeptMemoryRecords
    return fetcher_module.MemoryRecords is _KeptMemoryRecords and _hook(consumer, raw=True)


def _hook(consumer: Any, *, raw: bool) -> bool:
    fetcher: Any = getattr(consumer, "_fetcher", None)
    buffered = getattr(fetcher, "_records", None)
    known = all(hasattr(PartitionRecords, name) for name in ("_consume_aborted_up_to", "_contains_abort_marker"))
    known = known and all(hasattr(FetchResult, name) for name in ("check_assignment", "has_more", "_update_position"))
    if type(buffered) is not OrderedDict or not known:
        log.warning("aiokafka's fetcher is not the one processors.kafka_records knows: fetched records keep "
                    "aiokafka's ConsumerRecord wrapping (slower, same results)")
        return False
    results = _Results()
    results.raw = raw
    for tp, result in buffered.items():  # fetched before this call: not consumed yet
        results[tp] = result
    fetcher._records = results
    return True
