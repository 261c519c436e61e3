"""Fetch (long-poll) and ListOffsets.

Fetch reads stored batches untouched. It answers at once when at least ``min_bytes`` are ready,
any partition has an error, or ``max_wait_ms`` is 0; otherwise it waits for an append to any
requested partition (``PartitionLog.wait_for_data``) until ``max_wait_ms`` has passed. Sizes follow
KIP-74 (see ``_read_all``): the response stays within ``max_bytes`` and each partition within its
``partition_max_bytes``, except that the first partition with data gets at least one whole batch.
The last stable offset comes from the transaction coordinator (the high watermark when no
transaction is open); ``read_committed`` (isolation level 1) reads stop there and carry the aborted
transactions overlapping what they return. Preferred read replica = -1.

ListOffsets by timestamp answers, as Kafka does, the offset and timestamp of the first record (by
offset) whose timestamp is ≥ the one asked for: the store finds the first batch whose max timestamp
qualifies, and that batch is decoded to pick the record.
"""

from __future__ import annotations

import time
from typing import Any

from broker.errors import BrokerError
from broker.log.partition_log import PartitionLog, wait_for_any
from broker.protocol.compression import DEFAULT_DECOMPRESS_LIMIT
from broker.protocol.kafka.fetch import FetchPartitionResponse, FetchResponse, FetchTopicResponse
from broker.protocol.kafka_codes import ErrorCode
from broker.protocol.records import decode_records, split_complete_batches
from broker.server.handlers_common import BrokerContext, ConnectionInfo, error_code_for, millis
from broker.txn.committed import stable_part

__all__ = ["handle_fetch", "handle_list_offsets"]

LATEST = -1
EARLIEST = -2
READ_COMMITTED = 1


def _read_within(plog: PartitionLog, offset: int, budget: int, at_least_one: bool) -> bytes:
    """Whole stored batches from ``offset`` totalling at most ``budget`` bytes; with ``at_least_one``,
    the first batch even when it alone is larger (Kafka's minOneMessage)."""
    data = plog.read(offset, max(budget, 1))  # the store gives at least one whole batch
    if len(data) <= budget or at_least_one:
        return data
    return b""  # its first batch alone is over budget: Kafka would send a partial batch, which clients drop


def _read_all(ctx: BrokerContext, body: Any) -> tuple[FetchResponse, int, bool, list[tuple[PartitionLog, int]]]:
    # KIP-74, as Kafka's ReplicaManager.readFromLog: partitions are read in request order, each up to
    # min(partition_max_bytes, what is left of max_bytes); only until the first partition that returns
    # data may that partition exceed its budget, by one whole batch, so that a batch larger than the
    # limits still gets through. Every later partition stays within budget, so a response is never
    # larger than max_bytes plus that one batch.
    remaining = max(int(body.max_bytes), 0)
    at_least_one = True
    read_committed = int(body.isolation_level) == READ_COMMITTED
    total = 0
    errors = False
    waitable: list[tuple[PartitionLog, int]] = []
    topics: list[FetchTopicResponse] = []
    for topic in body.topics:
        name = str(topic.topic)
        parts: list[FetchPartitionResponse] = []
        for p in topic.partitions:
            index = int(p.partition)
            offset = int(p.fetch_offset)
            try:
                plog = ctx.store.partition(name, index)
            except BrokerError as exc:
                errors = True
                parts.append(FetchPartitionResponse(index, error_code_for(exc), -1, -1, -1, b""))
                continue
            hw = plog.high_watermark
            start = plog.log_start_offset
            budget = min(max(int(p.partition_max_bytes), 0), remaining)
            data = b""
            try:
                if budget > 0 or at_least_one:
                    data = _read_within(plog, offset, budget, at_least_one)
                elif not start <= offset <= hw:
                    plog.read(offset, 1)  # raises OffsetOutOfRangeError
            except BrokerError as exc:
                errors = True
                parts.append(FetchPartitionResponse(index, error_code_for(exc), hw, hw, start, b""))
                continue
            lso = ctx.transactions.last_stable_offset(plog)
            aborted: tuple[tuple[int, int], ...] | None = None
            if read_committed:
                data, aborted = stable_part(ctx.transactions, plog, offset, data, lso)
            if data:
                at_least_one = False
            total += len(data)
            remaining = max(remaining - len(data), 0)
            if not data and offset >= hw:  # only an append can add data here (an over-budget one has it)
                waitable.append((plog, offset))
            elif not data and read_committed and offset >= lso:
                waitable.append((plog, hw))  # held back by an open transaction: its marker is an append
            parts.append(FetchPartitionResponse(index, ErrorCode.NONE, hw, lso, start, data,
                                                aborted_transactions=aborted))
        topics.append(FetchTopicResponse(name, tuple(parts)))
    return FetchResponse(tuple(topics)), total, errors, waitable


async def handle_fetch(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> FetchResponse:
    deadline = time.monotonic() + millis(body.max_wait) / 1000
    min_bytes = int(body.min_bytes)
    while True:
        response, total, errors, waitable = _read_all(ctx, body)
        left = deadline - time.monotonic()
        if total >= min_bytes or errors or left <= 0 or not waitable:
            return response
        await wait_for_any(waitable, left)


def _first_record_at_or_after(plog: PartitionLog, start: int, when: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after offset ``start`` with timestamp ≥ ``when``."""
    offset = start
    # what Produce let in decompresses within max.message.bytes; batches stored before that rule, within
    # the readers' default bound
    limit = max(plog.config.max_message_bytes, DEFAULT_DECOMPRESS_LIMIT)
    while offset < plog.high_watermark:
        data = plog.read(offset, 1)  # at least one whole batch
        headers, _ = split_complete_batches(data)
        if not headers:
            return None
        pos = 0
        view = memoryview(data)
        for header in headers:
            for record in decode_records(view[pos : pos + header.size], header, limit=limit):
                if record.offset >= start and record.timestamp >= when:
                    return record.offset, record.timestamp
            pos += header.size
            offset = header.last_offset + 1
    return None


async def handle_list_offsets(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    topics: list[dict[str, Any]] = []
    for topic in body.topics:
        name = str(topic.name)
        parts: list[dict[str, Any]] = []
        for p in topic.partitions:
            index = int(p.partition_index)
            when = int(p.timestamp)
            entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.NONE, "timestamp": -1,
                                     "offset": -1, "leader_epoch": 0}
            try:
                plog = ctx.store.partition(name, index)
                if when == LATEST:
                    committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED
                    entry["offset"] = ctx.transactions.last_stable_offset(plog) if committed else plog.high_watermark
                elif when == EARLIEST:
                    entry["offset"] = plog.log_start_offset
                else:
                    found = plog.offset_for_timestamp(when)
                    record = None if found is None else _first_record_at_or_after(plog, found, when)
                    if record is not None:
                        entry["offset"], entry["timestamp"] = record
            except BrokerError as exc:
                entry["error_code"] = error_code_for(exc)
            parts.append(entry)
        topics.append({"name": name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
