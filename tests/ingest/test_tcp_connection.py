"""The TCP listener's connections as protocols (ingest/tcp/connection.py): no task per connection or read,
one read in flight per connection, ack answers in order even when the log makes every write wait."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from broker.log.api import LogStore
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.segment import SegmentLogStore
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import SlowLogStore, records


async def _listener(store: LogStore, **config: object) -> TcpLineListener:
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    listener = TcpLineListener(TcpListenerConfig(port=0, **config), sink, sink.health)  # type: ignore[arg-type]
    await listener.start()
    return listener


async def test_connections_and_reads_start_no_tasks(tmp_path: Path) -> None:
    store = SegmentLogStore(tmp_path, default_config=TopicConfig(flush=FlushPolicy.OS), default_partitions=4)
    await store.start()
    listener = await _listener(store)
    try:
        tasks_before = len(asyncio.all_tasks())
        conns = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(30)]
        deadline = time.monotonic() + 10
        while listener.connection_count < 30:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for n in range(5):
            for i, (_, writer) in enumerate(conns):
                writer.write(json.dumps({"device_id": f"d{i}", "n": n}).encode() + b"\n")
            await asyncio.gather(*(writer.drain() for _, writer in conns))
            assert len(asyncio.all_tasks()) == tasks_before  # flush=os: no write waits, so not even a task per turn
        while len(records(store, "tcp")) < 150:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for _, writer in conns:
            writer.close()
    finally:
        await listener.stop()
        await store.close()


async def test_ack_answers_come_in_order_when_every_write_waits() -> None:
    store = SlowLogStore(0.002, default_partitions=3)
    listener = await _listener(store, ack=True, read_bytes=64)  # many small reads, each waiting for its fsync
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        lines = [json.dumps({"device_id": f"d{n % 5}", "n": n}).encode() + b"\n" for n in range(200)]
        lines[57] = b"not json\n"
        writer.write(b"".join(lines))
        await writer.drain()
        acked: list[int] = []
        errors: list[int] = []
        while not acked or acked[-1] < 200:
            answer = (await asyncio.wait_for(reader.readline(), 20)).decode()
            assert answer, "closed early"
            if answer.startswith("ACK "):
                acked.append(int(answer.split()[1]))
                stored = {json.loads(r.value or b"")["n"] for r in records(store, "tcp")}
                assert stored >= {n for n in range(acked[-1]) if n != 57}  # acknowledged only once stored
            elif answer.startswith("ERR "):
                errors.append(int(answer.split()[1]))
        assert acked == sorted(set(acked)) and len(acked) > 1  # many reads, answered in order
        assert errors == [58]
        writer.close()
    finally:
        await listener.stop()
