"""``GET /topics/{topic}/stream``: records as Server-Sent Events, for dashboards and ``curl -N``.

One ``record`` event per record (``id: <partition>:<offset>``, ``data:`` the record as JSON); a comment
line every heartbeat interval keeps proxies from closing an idle stream. The stream ends when the client
goes away, after ``limit`` records, or when the server stops.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from broker.log.partition_log import PartitionLog, wait_for_any
from broker.protocol.records import Record
from broker.security import Operation, ResourceType
from broker.txn.committed import StableOffsets
from sluice.http.auth import allow
from sluice.http.context import ApiContext, Ctx
from sluice.http.limits import INT32_MAX, INT64_MAX
from sluice.http.models import OutFormat, record_out
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError
from sluice.http.records import ISOLATION_DOC, Isolation, check_offset, read_from, stable_offsets

__all__ = ["RecordRenderer", "record_events", "router", "sse_event", "start_cursors"]

router = APIRouter(prefix="/topics", tags=["records"], responses={500: PROBLEM_RESPONSES[500]})

BATCH = 500

# (partition, record) -> the ``data:`` of its ``record`` event; the API sends JSON, the console HTML
RecordRenderer = Callable[[int, Record], str]


def sse_event(event: str, data: str, event_id: str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def _render(partition: int, record: Record, fmt: OutFormat) -> str:
    try:
        return record_out(partition, record, fmt).model_dump_json()
    except ValueError:  # not in the asked-for format: show it as it is rather than end the stream
        return record_out(partition, record, "auto").model_dump_json()


async def record_events(
    ctx: ApiContext,
    topic: str,
    logs: list[PartitionLog],
    cursors: dict[int, int],
    limit: int | None,
    render: RecordRenderer,
    committed: StableOffsets | None = None,
) -> AsyncIterator[bytes]:
    """``subscribed``, then one ``record`` event per record from ``cursors`` on, until the client leaves,
    ``limit`` records were sent, or the server stops; keepalive comments while nothing arrives."""
    sent = 0
    ctx.counters.sse_clients.inc()
    try:
        yield b"retry: 1000\n" + sse_event(
            "subscribed", json.dumps({"topic": topic, "offsets": {str(p): o for p, o in cursors.items()}})
        )
        while not ctx.stopping.is_set():
            progressed = False
            for log in logs:
                want = BATCH if limit is None else min(BATCH, limit - sent)
                records, cursors[log.partition] = read_from(log, cursors[log.partition], want, committed)
                if not records:
                    continue
                progressed = True
                chunk = b"".join(
                    sse_event("record", render(log.partition, r), f"{log.partition}:{r.offset}") for r in records
                )
                sent += len(records)
                ctx.counters.fetched_records.labels(topic, "sse").inc(len(records))
                yield chunk
                if limit is not None and sent >= limit:
                    return
            if not progressed:
                before = dict(cursors)
                # read_committed held at an open transaction: wait for the next append (its marker is one)
                waits = [(log, max(cursors[log.partition], log.high_watermark) if committed else cursors[log.partition])
                         for log in logs]
                await wait_for_any(waits, ctx.sse_heartbeat_s, ctx.stopping)
                if all(log.high_watermark <= before[log.partition] for log in logs):
                    yield b": keepalive\n\n"
    finally:
        ctx.counters.sse_clients.dec()


def start_cursors(
    logs: list[PartitionLog], offset: int | None, start: Literal["latest", "earliest"]
) -> dict[int, int]:
    """Where a stream starts in each partition (an ``offset`` outside what is kept: a 416 problem)."""
    cursors: dict[int, int] = {}
    for log in logs:
        if offset is not None:
            check_offset(log, offset)
            cursors[log.partition] = offset
        else:
            cursors[log.partition] = log.high_watermark if start == "latest" else log.log_start_offset
    return cursors


@router.get(
    "/{topic}/stream",
    summary="Follow a topic as Server-Sent Events",
    description="Streams `record` events (data: the record as JSON, id: `partition:offset`) from every partition, "
    "or one with `partition`. Starts at the end (`start=latest`, default), at the earliest kept record, "
    "or at `offset` (with `partition`). Try `curl -N http://127.0.0.1:8080/topics/<topic>/stream`.",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": "An event stream"},
        **{k: PROBLEM_RESPONSES[k] for k in (404, 416, 422)},
    },
    dependencies=[Depends(allow(Operation.READ, ResourceType.TOPIC, "topic"))],
)
async def stream(
    topic: str,
    ctx: Ctx,
    partition: int | None = Query(None, ge=0, le=INT32_MAX, description="Only this partition (default: all)."),
    offset: int | None = Query(None, ge=0, le=INT64_MAX, description="Start offset (needs `partition`)."),
    start: Literal["latest", "earliest"] = Query("latest", description="Where to start without an offset."),
    limit: int | None = Query(None, ge=1, description="End the stream after this many records."),
    format: Annotated[OutFormat, Query(description="How values are shown: auto, json, text or base64.")] = "auto",
    isolation: Annotated[Isolation, Query(description=ISOLATION_DOC)] = "read_uncommitted",
) -> StreamingResponse:
    store = ctx.store
    store.topic(topic)
    committed = stable_offsets(ctx, isolation)
    if offset is not None and partition is None:
        raise ProblemError(
            400,
            "offset-needs-partition",
            "Offset needs a partition",
            "an offset only means something within one partition; pass partition= as well",
        )
    logs = [store.partition(topic, partition)] if partition is not None else store.partitions(topic)
    cursors = start_cursors(logs, offset, start)
    return StreamingResponse(
        record_events(ctx, topic, logs, cursors, limit, lambda p, r: _render(p, r, format), committed),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
