"""Fetched records for standalone processors without aiokafka's per-record ``ConsumerRecord``.

aiokafka's consumer decodes each fetched RecordBatch with its C parser and then wraps every record
in a ``ConsumerRecord`` dataclass in Python (eleven fields, a tuple of headers, two size counts):
in a profile of the standalone processor that wrapping was the largest single cost of the consumer.
The parser's own record objects already have what a processor reads (offset, timestamp, key, value,
headers: ``processors.executor.RecordLike``), so ``KafkaSource`` hands those on instead.

How: ``use_parser_records(consumer)`` changes, for that one consumer, the class of each
``PartitionRecords`` its fetcher stores to ``ParserRecords``, whose ``_unpack_records`` is aiokafka's
(CRC check, read_committed filtering of aborted transactions, control batches skipped, offsets
below the fetch position skipped, the position advanced per record) with the wrapping left out and
each batch's records decoded in one C loop. Nothing else about the consumer changes (groups,
positions, pauses, commits). It relies on aiokafka's fetcher internals (``_fetcher._records``,
``PartitionRecords``): the version is pinned in pyproject.toml, and when they are not as expected the
consumer is left as it is (``ConsumerRecord`` has the same attributes) and a warning says so;
``tests/processors/test_kafka_records.py`` fails then.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException

__all__ = ["ParserRecords", "use_parser_records"]

log = logging.getLogger("processors.kafka_records")


class ParserRecords(PartitionRecords):
    """A fetched partition's records as the C parser's record objects (see the module docstring)."""

    def _unpack_records(self) -> Iterator[Any]:
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
            for record in decoded:
                offset = record.offset
                if offset < first:  # before the fetch position (a compressed batch read from its start)
                    continue
                self.next_fetch_offset = offset + 1  # where the consumer resumes if it stops here
                yield record
            # v2 batches keep their last offset even when compaction removed the last record
            self.next_fetch_offset = batch.next_offset


class _Results(OrderedDict[Any, Any]):
    """The fetcher's buffered results; fetched partitions become ``ParserRecords`` as they are stored."""

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult:
            _adopt(result._partition_records)
        super().__setitem__(tp, result)


def _adopt(records: Any) -> None:
    if type(records) is PartitionRecords:
        records.__class__ = ParserRecords
        records._records_iterator = records._unpack_records()  # the old generator had not started


def use_parser_records(consumer: Any) -> bool:
    """Make a started ``AIOKafkaConsumer`` return parser records from ``getmany`` (True when it does)."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    buffered = getattr(fetcher, "_records", None)
    if type(buffered) is not OrderedDict or not hasattr(PartitionRecords, "_unpack_records"):
        log.warning("aiokafka's fetcher is not the one processors.kafka_records knows: fetched records keep "
                    "aiokafka's ConsumerRecord wrapping (slower, same results)")
        return False
    results = _Results()
    for tp, result in buffered.items():  # fetched before this call: not consumed yet
        results[tp] = result
    fetcher._records = results
    return True
