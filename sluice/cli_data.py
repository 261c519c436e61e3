"""``sluice produce`` and ``sluice consume`` — data over the Kafka protocol (clients/), like any application."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from datetime import datetime
from typing import Annotated, Any, Literal

import typer

from clients import AsyncAdmin, AsyncConsumer, AsyncProducer, ConsumerRecord, TopicPartition
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    EXIT_USAGE,
    Bootstrap,
    JsonFlag,
    err_console,
    fail,
    name_value_pairs,
    plural,
    print_json,
    run,
)
from sluice.cli_progress import Activity

__all__ = ["parse_start", "register"]


def produce(
    topic: str,
    input_format: Annotated[
        str, typer.Option("--format", "-f", help="lines (each line is a text value) or json (each line a JSON value).")
    ] = "lines",
    key: Annotated[str | None, typer.Option("--key", "-k", help="Key for every record.")] = None,
    key_field: Annotated[
        str | None, typer.Option(help="With --format json: take each record's key from this field.")
    ] = None,
    allow_null_key: Annotated[
        bool, typer.Option(help="With --key-field: a record without the field gets no key (else: an error).")
    ] = False,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header name=value (repeatable).")] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Write to this partition.")] = None,
    rate: Annotated[float | None, typer.Option(help="At most this many records per second.")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Produce records read from stdin, one per line. A bad line stops it; the lines before it are written
    and the error says how many."""
    if input_format not in ("lines", "json"):
        fail(f"--format must be lines or json, got {input_format!r}", EXIT_USAGE)
    if key_field and input_format != "json":
        fail("--key-field needs --format json", EXIT_USAGE)
    headers = name_value_pairs(header, "--header takes name=value")

    async def go() -> dict[str, Any]:
        sent = 0
        last: dict[int, int] = {}
        interval = 1.0 / rate if rate else 0.0
        started = time.monotonic()
        serializer = "json" if input_format == "json" else "string"
        error: str | None = None
        async with AsyncProducer(bootstrap, value_serializer=serializer) as producer:
            pending = []
            with Activity("producing", "record", detail=f"to {topic}") as progress:
                for lineno, raw in enumerate(sys.stdin, 1):
                    line = raw.rstrip("\n")
                    if not line:
                        continue
                    value: Any = line
                    record_key = key
                    if input_format == "json":
                        try:
                            value = json.loads(line)
                        except ValueError as exc:
                            error = f"line {lineno} is not JSON ({exc}); use --format lines for text"
                            break
                        if key_field:
                            found = value.get(key_field) if isinstance(value, dict) else None
                            if found is None and not allow_null_key:
                                error = (f"line {lineno} has no {key_field!r} field for its key "
                                         "(--allow-null-key writes such records without a key)")
                                break
                            record_key = None if found is None else str(found)
                    if interval:
                        due = started + sent * interval
                        delay = due - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    pending.append(
                        await producer.send_nowait(topic, value, key=record_key, headers=headers, partition=partition)
                    )
                    sent += 1
                    progress.set(sent)
                    if len(pending) >= 1000:
                        for md in await asyncio.gather(*pending):
                            last[md.partition] = max(last.get(md.partition, -1), md.offset)
                        pending.clear()
                for md in await asyncio.gather(*pending):
                    last[md.partition] = max(last.get(md.partition, -1), md.offset)
        return {
            "topic": topic,
            "error": error,
            "records": sent,
            "last_offsets": {str(p): o for p, o in sorted(last.items())},
            "seconds": round(time.monotonic() - started, 3),
        }

    result = run(go(), topic=topic)
    if result["error"] is not None:
        written = (f"the {plural(result['records'], 'record')} before it were written to {topic}"
                   if result["records"] else "nothing was written")
        if result["records"] == 1:
            written = f"the record before it was written to {topic}"
        fail(f"{result['error']}; {written}", EXIT_USAGE)
    if json_out:
        print_json(result)
    else:
        err_console.print(f"produced {plural(result['records'], 'record')} to {topic} in {result['seconds']} s")


def parse_start(text: str) -> tuple[Literal["beginning", "end", "offset", "time"], int]:
    """``beginning``, ``end``, ``offset:N``, ``time:<ms since epoch | ISO 8601>`` or ``-<seconds>s`` (ago)."""
    if text in ("beginning", "earliest"):
        return "beginning", 0
    if text in ("end", "latest"):
        return "end", 0
    if text.startswith("offset:"):
        return "offset", int(text[7:])
    if text.startswith("time:"):
        raw = text[5:]
        if raw.isdigit():
            return "time", int(raw)
        return "time", int(datetime.fromisoformat(raw).timestamp() * 1000)
    if text.startswith("-") and text.endswith("s"):
        return "time", int((time.time() - float(text[1:-1])) * 1000)
    raise ValueError(text)


def _render(record: ConsumerRecord[Any], fmt: str) -> str:
    value: bytes | None = record.value
    if fmt == "json":
        text: Any
        try:
            text = json.loads(value) if value is not None else None
        except ValueError:
            try:
                text = value.decode() if value is not None else None
            except UnicodeDecodeError:
                text = base64.b64encode(value or b"").decode()
        return json.dumps(
            {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key": record.key,
                "value": text,
                "headers": {k: v.decode("utf-8", "replace") for k, v in record.headers},
            }
        )
    shown = value.decode("utf-8", "replace") if value is not None else "null"
    if fmt == "kv":
        return f"{record.key if record.key is not None else ''}\t{shown}"
    return shown


def consume(
    topic: str,
    group: Annotated[str | None, typer.Option("--group", "-g", help="Consume as a member of this group.")] = None,
    start: Annotated[
        str, typer.Option("--from", help="beginning, end, offset:N, time:<ms|ISO 8601>, or -<N>s (N seconds ago).")
    ] = "beginning",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new records.")] = False,
    max_records: Annotated[int | None, typer.Option("--max", "-n", help="Stop after this many records.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="value, kv or json (one object a line).")] = "value",
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Print records of a topic. Without --follow, stops once it has caught up with the end."""
    if fmt not in ("value", "kv", "json"):
        fail(f"--format must be value, kv or json, got {fmt!r}", EXIT_USAGE)
    try:
        where, arg = parse_start(start)
    except ValueError:
        fail(f"--from {start!r} is not beginning, end, offset:N, time:<ms|ISO 8601> or -<N>s", EXIT_USAGE)

    async def go() -> int:
        async with AsyncAdmin(bootstrap) as admin:
            partitions = await admin.partitions(topic)
        consumer = AsyncConsumer(
            topic,
            bootstrap=bootstrap,
            group_id=group,
            value_deserializer="raw",
            start="latest" if where == "end" else "earliest",
            commit="batch",
        )
        count = 0
        async with consumer:
            tps = await consumer.wait_for_assignment(30) if group else {TopicPartition(topic, p) for p in partitions}
            if where == "beginning" and group is None:
                await consumer.seek_to_beginning()
            elif where == "end":
                await consumer.seek_to_end(*tps)
            elif where == "offset":
                for tp in tps:
                    consumer.seek(tp, arg)
            elif where == "time":
                await consumer.seek_to_timestamp(arg, tps)
            ends = await consumer.end_offsets(tps)
            done: set[TopicPartition] = set()
            # records going to a file or a pipe: count them on the terminal (never between records on it)
            with Activity("consuming", "record", detail=f"from {topic}", enabled=not sys.stdout.isatty()) as progress:
                while True:
                    batch = await consumer.getmany(timeout_ms=500)
                    for record in batch:
                        sys.stdout.write(_render(record, fmt) + "\n")
                        count += 1
                        if record.offset + 1 >= ends.get(record.tp, 0):
                            done.add(record.tp)
                        if max_records is not None and count >= max_records:
                            sys.stdout.flush()
                            return count
                    sys.stdout.flush()
                    progress.set(count)
                    if not follow:
                        positions = {tp: await consumer.position(tp) for tp in ends if tp not in done}
                        if all(pos >= ends[tp] for tp, pos in positions.items()):
                            return count

    run(go(), topic=topic, group=group)


def register(app: typer.Typer) -> None:
    app.command("produce")(produce)
    app.command("consume")(consume)
