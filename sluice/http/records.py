"""``/topics/{topic}/records``: JSON batch produce, and fetch by partition and offset with long-poll."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from broker.log.api import LogStore
from broker.log.partition_log import PartitionLog
from broker.protocol.records import Record, RecordSpec, decode_records, encode_batch, split_complete_batches
from broker.security import Operation, ResourceType
from broker.txn.committed import StableOffsets, read_committed
from sluice.http.auth import Caller, allow, authorize, may
from sluice.http.context import ApiContext, Ctx
from sluice.http.limits import INT32_MAX, INT64_MAX
from sluice.http.models import (
    FetchResponse,
    OutFormat,
    ProducedOffset,
    ProduceRequest,
    ProduceResponse,
    RecordOut,
    encode_value,
    record_out,
)
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["ISOLATION_DOC", "Isolation", "check_offset", "read_from", "read_records", "router", "stable_offsets"]

router = APIRouter(prefix="/topics", tags=["records"], responses={500: PROBLEM_RESPONSES[500]})

READ_CHUNK_BYTES = 1024 * 1024

# Kafka consumers' isolation.level, with Kafka's default
Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATION_DOC = ("`read_uncommitted` (default, as Kafka's consumers): every record up to the high watermark; "
                 "`read_committed`: up to the last stable offset, without records of aborted transactions.")


def stable_offsets(ctx: ApiContext, isolation: Isolation) -> StableOffsets | None:
    """The transaction coordinator for ``read_committed`` reads (None for read_uncommitted). It lives in
    the Kafka component; without it no transaction can be written, and a read_committed read is refused
    rather than answered with records whose transactions nobody can vouch for."""
    if isolation == "read_uncommitted":
        return None
    coordinator: StableOffsets | None = ctx.runtime.registries.get("transactions")
    if coordinator is None:
        raise ProblemError(400, "read-committed-unavailable", "read_committed needs the Kafka listener",
                           "isolation=read_committed reads need the transaction coordinator, which runs with "
                           "the Kafka listener (kafka.enabled); read with isolation=read_uncommitted")
    return coordinator


def check_offset(log: PartitionLog, offset: int) -> None:
    start, end = log.log_start_offset, log.high_watermark
    if not start <= offset <= end:
        raise ProblemError(
            416,
            "offset-out-of-range",
            "Offset out of range",
            f"offset {offset} is out of range for {log.topic}-{log.partition}: valid offsets are {start}..{end} "
            f"({end} is where the next record will be written)",
        )


def _last_stable_offset(ctx: ApiContext, log: PartitionLog) -> int:
    coordinator: StableOffsets | None = ctx.runtime.registries.get("transactions")
    return log.high_watermark if coordinator is None else coordinator.last_stable_offset(log)


def read_records(log: PartitionLog, offset: int, max_records: int) -> list[Record]:
    """Up to ``max_records`` records from ``offset``, read uncommitted (``read_from``)."""
    return read_from(log, offset, max_records)[0]


def read_from(log: PartitionLog, offset: int, max_records: int,
              committed: StableOffsets | None = None) -> tuple[list[Record], int]:
    """Up to ``max_records`` records from ``offset`` (whole stored batches, trimmed to the range) and the
    offset to read on from.

    Uncommitted (``committed`` None): up to the high watermark. ``read_committed`` (the transaction
    coordinator given): up to the last stable offset, without aborted transactions' records
    (``broker.txn.committed``, the rules the broker's Fetch and Kafka's consumers follow). Batches without
    visible records (control batches, aborted ones) are stepped over, so a reader never stalls.
    """
    out: list[Record] = []
    cursor = offset
    while len(out) < max_records:
        if committed is None:
            if cursor >= log.high_watermark:
                break
            data, after = log.read(cursor, READ_CHUNK_BYTES), cursor
        else:
            read = read_committed(committed, log, cursor, READ_CHUNK_BYTES)
            if read.next_offset <= cursor:
                break  # at the last stable offset
            data, after = read.data, read.next_offset
        view = memoryview(data)
        headers, _ = split_complete_batches(view)
        if not headers and after <= cursor:
            break
        pos = 0
        for header in headers:
            batch = view[pos : pos + header.size]
            pos += header.size
            for record in decode_records(batch, header):
                if record.offset >= cursor and len(out) < max_records:
                    out.append(record)
            if len(out) >= max_records:
                return out, out[-1].offset + 1
            cursor = max(cursor, header.last_offset + 1)
        cursor = max(cursor, after)  # past batches dropped after the last one kept
    return out, cursor


def _partition_of(store: LogStore, topic: str, count: int, explicit: int | None, key: bytes | None, sticky: int) -> int:
    if explicit is not None:
        if explicit >= count:
            raise ProblemError(
                404,
                "unknown-partition",
                "Unknown partition",
                f"topic {topic!r} has no partition {explicit} (it has {count}: 0..{count - 1})",
            )
        return explicit
    if key is not None:
        return store.partition_for(topic, key)
    return sticky


@router.post(
    "/{topic}/records",
    response_model=ProduceResponse,
    summary="Produce a batch of JSON records",
    description="Records are grouped per partition and each group is appended as one batch; the response "
    "returns once they are as durable as the topic's flush policy promises. Unknown topics are created "
    "when storage.auto_create_topics is on.",
    responses={k: PROBLEM_RESPONSES[k] for k in (400, 404, 413, 422, 503)},
    dependencies=[Depends(allow(Operation.WRITE, ResourceType.TOPIC, "topic"))],
)
async def produce(topic: str, body: ProduceRequest, ctx: Ctx, request: Request, who: Caller) -> ProduceResponse:
    store = ctx.store
    if not store.has_topic(topic) and store.auto_create_topics and not may(
            ctx, request, who, Operation.CREATE, ResourceType.CLUSTER):
        authorize(ctx, request, who, Operation.CREATE, ResourceType.TOPIC, topic)  # auto-creation creates it
    info = store.ensure_topic(topic)
    sticky = store.partition_for(topic, None)
    now = int(time.time() * 1000)
    groups: dict[int, list[tuple[int, RecordSpec]]] = defaultdict(list)
    nbytes = 0
    for index, rec in enumerate(body.records):
        try:
            value = encode_value(rec.value, body.value_format)
        except ValueError as exc:
            raise ProblemError(400, "invalid-value", "Invalid record value", f"records[{index}]: {exc}") from None
        key = rec.key.encode() if rec.key is not None else None
        nbytes += len(value or b"") + len(key or b"")
        partition = _partition_of(store, topic, info.partitions, rec.partition, key, sticky)
        headers = tuple((k, v.encode()) for k, v in rec.headers.items())
        timestamp = None if rec.timestamp == -1 else rec.timestamp  # -1 is Kafka's "no timestamp"
        groups[partition].append((index, RecordSpec(value, key, headers, timestamp)))

    async def append(partition: int, items: list[tuple[int, RecordSpec]]) -> list[tuple[int, ProducedOffset]]:
        batch = encode_batch([spec for _, spec in items], timestamp=now)
        result = await store.append(topic, partition, batch)
        return [
            (index, ProducedOffset(partition=partition, offset=result.base_offset + i))
            for i, (index, _) in enumerate(items)
        ]

    results = await asyncio.gather(*(append(p, items) for p, items in groups.items()))
    offsets = sorted((pair for group in results for pair in group), key=lambda pair: pair[0])
    ctx.counters.produced_records.labels(topic).inc(len(body.records))
    ctx.counters.produced_bytes.labels(topic).inc(nbytes)
    return ProduceResponse(topic=topic, offsets=[o for _, o in offsets])


@router.get(
    "/{topic}/records",
    response_model=FetchResponse,
    summary="Read records from one partition (long-poll)",
    description="Returns up to `max` records from `offset` (default: the earliest kept). With `timeout_ms` > 0 "
    "and nothing to read yet, waits up to that long for new records. `timestamp` starts at the first "
    "record at or after that event time instead of an offset.",
    responses={k: PROBLEM_RESPONSES[k] for k in (400, 404, 416, 422)},
    dependencies=[Depends(allow(Operation.READ, ResourceType.TOPIC, "topic"))],
)
async def fetch(
    topic: str,
    ctx: Ctx,
    partition: int = Query(0, ge=0, le=INT32_MAX),
    offset: int | None = Query(None, ge=0, le=INT64_MAX, description="First offset to read (default: earliest)."),
    timestamp: int | None = Query(
        None, ge=0, le=INT64_MAX, description="Start at this event time (ms) instead of an offset."
    ),
    max: int = Query(100, ge=1, le=10_000, description="Most records to return."),
    timeout_ms: int = Query(
        0, ge=0, le=INT32_MAX, description="Long-poll: wait this long for data (capped at 30 s)."
    ),
    format: Annotated[OutFormat, Query(description="How values are shown: auto, json, text or base64.")] = "auto",
    isolation: Annotated[Isolation, Query(description=ISOLATION_DOC)] = "read_uncommitted",
) -> FetchResponse:
    store = ctx.store
    store.topic(topic)
    log = store.partition(topic, partition)
    committed = stable_offsets(ctx, isolation)
    if timestamp is not None:
        found = log.offset_for_timestamp(timestamp)
        start = log.high_watermark if found is None else found
    else:
        start = log.log_start_offset if offset is None else offset
    check_offset(log, start)
    deadline = time.monotonic() + min(timeout_ms, ctx.max_wait_ms) / 1000
    records, next_offset = read_from(log, start, max, committed)
    while not records and (left := deadline - time.monotonic()) > 0:
        # uncommitted: wait for an append at the cursor; read_committed held at an open transaction:
        # for the next append (its marker is one)
        wait_at = log.high_watermark if committed is not None and next_offset < log.high_watermark else next_offset
        await log.wait_for_data(wait_at, left)
        records, next_offset = read_from(log, next_offset, max, committed)
    try:
        out: list[RecordOut] = [record_out(partition, r, format) for r in records]
    except ValueError as exc:
        raise ProblemError(400, "value-format", "Value not in the requested format", str(exc)) from None
    ctx.counters.fetch_requests.labels(topic).inc()
    ctx.counters.fetched_records.labels(topic, "fetch").inc(len(out))
    return FetchResponse(
        topic=topic,
        partition=partition,
        records=out,
        next_offset=next_offset,
        high_watermark=log.high_watermark,
        last_stable_offset=_last_stable_offset(ctx, log),
        log_start_offset=log.log_start_offset,
    )
