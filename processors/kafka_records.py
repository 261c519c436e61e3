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
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from types import MethodType
from typing import Any

from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException

__all__ = ["ParserRecords", "use_parser_records"]

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
        # aiokafka 0.14 PartitionRecords._unpack_records (Apache-2.0), less the ConsumerRecord wrapping
        tp = self._tp
        records = self._records
        while records.has_next():
            batch = records.next_batch()
            if self._check_crcs and not batch.validate_crc():
                raise CorruptRecordException(f"Invalid CRC - {tp}")
            if self._isolation_level == READ_COMMITTED and batch.producer_id is not None:
                self._consume_aborted_up_to(batch.base_offset)
                if batch.is_control_batch and self._contains_abort_marker(batch):
                    self._aborted_producers.discard(batch.producer_id)
                if batch.is_transactional and batch.producer_id in self._aborted_producers:
                    self.next_fetch_offset = batch.next_offset
                    continue
            if batch.is_control_batch:
                self.next_fetch_offset = batch.next_offset
                continue
            decoded = list(batch)  # one C loop per batch
            first = self.next_fetch_offset
            if decoded and decoded[0].offset < first:  # a compressed batch read from its start
                decoded = [record for record in decoded if record.offset >= first]
            self._pending, self._at, self._batch_end = decoded, 0, batch.next_offset
            return True
        return False

    def __iter__(self) -> ParserRecords:
        return self

    def __next__(self) -> Any:
        taken = self.take(1)
        if not taken:
            raise StopIteration
        return taken[0]


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
    """The fetcher's buffered results; fetched partitions become ``ParserRecords`` as they are stored."""

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult and type(result._partition_records) is PartitionRecords:
            _adopt(result._partition_records)
            # on the instance: the fetcher checks type(result) is FetchResult, so no subclass
            result.getall = MethodType(_getall, result)
        super().__setitem__(tp, result)


def _adopt(records: Any) -> None:
    records.__class__ = ParserRecords
    records._records_iterator = None  # aiokafka's record generator (not started): take() replaces it
    records._pending, records._at, records._batch_end = [], 0, None


def use_parser_records(consumer: Any) -> bool:
    """Make a started ``AIOKafkaConsumer`` return parser records from ``getmany`` (True when it does)."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    buffered = getattr(fetcher, "_records", None)
    known = all(hasattr(PartitionRecords, name) for name in ("_consume_aborted_up_to", "_contains_abort_marker"))
    known = known and all(hasattr(FetchResult, name) for name in ("check_assignment", "has_more", "_update_position"))
    if type(buffered) is not OrderedDict or not known:
        log.warning("aiokafka's fetcher is not the one processors.kafka_records knows: fetched records keep "
                    "aiokafka's ConsumerRecord wrapping (slower, same results)")
        return False
    results = _Results()
    for tp, result in buffered.items():  # fetched before this call: not consumed yet
        results[tp] = result
    fetcher._records = results
    return True
