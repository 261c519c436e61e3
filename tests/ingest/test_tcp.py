"""The TCP line listener over real sockets: nc and Python senders, every format, dead letters, acks,
idle timeout, 2,000 concurrent connections."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Protocol, TypedDict, Unpack

import pytest

from broker.log.api import LogStore
from broker.log.memory import MemoryLogStore
from broker.protocol.records import Record
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults
from ingest.sink import DEFAULT_MAX_PENDING_BYTES, IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import records


class ListenerOptions(TypedDict, total=False):
    """The fields of ``TcpListenerConfig`` a test may set (the port is always 0: a free one)."""

    name: str
    host: str
    format: str
    ack: bool
    max_line_bytes: int
    idle_timeout_s: float
    read_bytes: int
    backlog: int


class Start(Protocol):
    def __call__(
        self, store: LogStore | None = None, *, max_pending_bytes: int = ..., **config: Unpack[ListenerOptions]
    ) -> Awaitable[tuple[TcpLineListener, LogStore]]: ...


@pytest.fixture
async def start_listener() -> AsyncIterator[Start]:
    started: list[TcpLineListener] = []

    async def start(
        store: LogStore | None = None,
        *,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        **config: Unpack[ListenerOptions],
    ) -> tuple[TcpLineListener, LogStore]:
        store = store or MemoryLogStore(default_partitions=4)
        sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), max_pending_bytes=max_pending_bytes)
        listener = TcpLineListener(TcpListenerConfig(port=0, **config), sink, sink.health)
        await listener.start()
        started.append(listener)
        return listener, store

    yield start
    for listener in started:
        await listener.stop()


async def wait_for_records(store: LogStore, topic: str, count: int, timeout: float = 20.0) -> list[Record]:
    deadline = time.monotonic() + timeout
    while True:
        found = records(store, topic)
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"only {len(found)} of {count} records in {topic!r}"
        await asyncio.sleep(0.02)


async def send(port: int, data: bytes) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def test_nc_sends_ndjson_lines_into_keyed_partitions(start_listener: Start, tmp_path: Path) -> None:
    assert shutil.which("nc"), "needs netcat-openbsd: run scripts/install-system-deps.sh"
    listener, store = await start_listener()
    lines = [json.dumps({"device_id": f"sensor-{i % 7}", "seq": i, "temp": 20 + i / 10}) for i in range(300)]
    data = tmp_path / "lines.ndjson"
    data.write_text("\n".join(lines) + "\n")
    with data.open("rb") as stdin:
        proc = await asyncio.create_subprocess_exec(
            "nc", "-N", "127.0.0.1", str(listener.port), stdin=stdin, stderr=subprocess.PIPE
        )
        _, err = await proc.communicate()
    assert proc.returncode == 0, err
    found = await wait_for_records(store, "tcp", 300)
    assert len(found) == 300
    for p in range(store.topic("tcp").partitions):
        for rec in records_of(store, "tcp", p):
            assert rec.key is not None and store.partition_for("tcp", rec.key) == p
    seqs = {json.loads(r.value or b"")["seq"] for r in found}
    assert seqs == set(range(300))
    assert all(r.header("source") == b"tcp:default" for r in found)


def records_of(store: LogStore, topic: str, partition: int) -> list[Record]:
    from broker.protocol.records import decode_all

    log = store.partition(topic, partition)
    return decode_all(log.read(log.log_start_offset, 1 << 40))


async def test_influx_lines_keyed_by_series_with_line_time(start_listener: Start) -> None:
    listener, store = await start_listener(format="influx")
    body = (
        b"# a comment line\n"
        b"weather,station=s1,region=eu temp=21.5,humidity=40i 1700000000000000000\r\n"
        b"weather,region=eu,station=s1 temp=22.0 1700000001000000000\n"
        b"weather,station=s2 temp=19.25,ok=true,note=\"a \\\"quoted\\\" note\"\n"
    )
    await send(listener.port, body)
    found = await wait_for_records(store, "tcp", 3)
    by_key: dict[bytes, list[Record]] = {}
    for rec in found:
        assert rec.key is not None
        by_key.setdefault(rec.key, []).append(rec)
    assert sorted(by_key) == [b"weather,region=eu,station=s1", b"weather,station=s2"]
    s1 = sorted(by_key[b"weather,region=eu,station=s1"], key=lambda r: r.offset)
    assert [r.timestamp for r in s1] == [1_700_000_000_000, 1_700_000_001_000]
    for key, recs in by_key.items():
        assert {records_partition(store, r) for r in recs} == {store.partition_for("tcp", key)}


def records_partition(store: LogStore, record: Record) -> int:
    for p in range(store.topic("tcp").partitions):
        if record in records_of(store, "tcp", p):
            return p
    raise AssertionError("record not found")


async def test_csv_with_header_per_connection(start_listener: Start) -> None:
    listener, store = await start_listener(format="csv")
    await send(listener.port, b"device_id,temp,unit\nd1,21.5,C\nd2,70,F\n")
    await send(listener.port, b"unit,device_id\nK,d3\n")  # another connection, another header
    found = await wait_for_records(store, "tcp", 3)
    assert sorted((r.key, r.value) for r in found) == [(b"d1", b"d1,21.5,C"), (b"d2", b"d2,70,F"), (b"d3", b"K,d3")]
    assert not store.has_topic("_dead_letters")


async def test_csv_bad_rows_are_dead_letters_with_their_reasons(start_listener: Start) -> None:
    """Rows go a read at a time (ingest/csv_lines.py); the ones it does not take get the per-row reasons."""
    listener, store = await start_listener(format="csv")
    body = (b"\n device_id , temp\n" + b"d1,21.5\n" * 50 + b"d1\nd2,\"unterminated\n\xff,1\nd2,1,2\n"
            + b'"d3",7\n' + b"d2,22\n" * 50)
    await send(listener.port, body)
    good = await wait_for_records(store, "tcp", 101)
    letters = await wait_for_records(store, "_dead_letters", 4)
    assert sorted({(r.key, r.value) for r in good}) == [(b"d1", b"d1,21.5"), (b"d2", b"d2,22"), (b"d3", b'"d3",7')]
    assert sorted(((r.header("reason") or b"").decode(), r.value) for r in letters) == [
        ("csv: CSV row has 1 columns, the header has 2", b"d1"),
        ("csv: CSV row has 3 columns, the header has 2", b"d2,1,2"),
        ("csv: invalid CSV row: unexpected end of data", b'd2,"unterminated'),
        ("csv: not UTF-8 (byte 0)", b"\xff,1"),
    ]


async def test_bad_lines_land_in_dead_letters_with_reason(start_listener: Start) -> None:
    listener, store = await start_listener(max_line_bytes=100)
    body = (
        b'{"device_id": "ok-1"}\n{"device_id": \n'
        + b'{"pad": "' + b"p" * 300 + b'"}\n\xff\xfe\n{"device_id": "ok-2"}\n'
    )
    await send(listener.port, body)
    good = await wait_for_records(store, "tcp", 2)
    letters = await wait_for_records(store, "_dead_letters", 3)
    assert sorted(r.key or b"" for r in good) == [b"ok-1", b"ok-2"]  # a missing key (None) fails as b""
    reasons = sorted((r.header("reason") or b"").decode() for r in letters)
    assert any("invalid JSON" in r for r in reasons)
    assert any("line of 311 bytes is longer than the limit" in r for r in reasons)
    assert any("not UTF-8" in r for r in reasons)
    originals = {r.value for r in letters}
    assert b'{"device_id": ' in originals and b"\xff\xfe" in originals
    assert all(r.header("source") == b"tcp:default" for r in letters)
    health = listener.health.snapshot()[0]
    assert health["messages"] == 5 and health["errors"] == 3


async def test_ack_mode_answers_with_offsets_after_durable_append(start_listener: Start) -> None:
    listener, store = await start_listener(ack=True, format="ndjson")
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(b'{"device_id": "a", "n": 1}\n{"device_id": "a", "n": 2}\nnot json\n\n{"device_id": "b"}\n')
    await writer.drain()
    answer: list[str] = []
    while not answer or not answer[-1].startswith("ACK"):
        line = await asyncio.wait_for(reader.readline(), 10)
        assert line, f"connection closed early after {answer}"
        answer.append(line.decode().rstrip("\n"))
    assert answer[-1] == "ACK 5"
    assert answer[0].startswith("ERR 3 json: invalid JSON")
    oks = {tuple(line.split()[1:3]): int(line.split()[3]) for line in answer if line.startswith("OK")}
    pa, pb = store.partition_for("tcp", b"a"), store.partition_for("tcp", b"b")
    assert oks[("tcp", str(pa))] == store.partition("tcp", pa).high_watermark - 1
    assert oks[("tcp", str(pb))] == store.partition("tcp", pb).high_watermark - 1
    stored_a = records_of(store, "tcp", pa)
    assert [json.loads(r.value or b"")["n"] for r in stored_a if r.key == b"a"] == [1, 2]
    writer.write(b'{"device_id": "a", "n": 3}\n')
    await writer.drain()
    more = [(await asyncio.wait_for(reader.readline(), 10)).decode().strip() for _ in range(2)]
    assert more == [f"OK tcp {pa} {oks[('tcp', str(pa))] + 1}", "ACK 6"]
    writer.close()
    await writer.wait_closed()


async def test_idle_connection_is_closed(start_listener: Start) -> None:
    listener, _ = await start_listener(idle_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # server closed it
    writer.close()
    deadline = time.monotonic() + 5
    while listener.health.snapshot()[0]["connections"] != 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_two_thousand_concurrent_connections(start_listener: Start) -> None:
    listener, store = await start_listener(format="influx")
    n_conn, lines_each = 2000, 3
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", listener.port) for _ in range(n_conn)))
    deadline = time.monotonic() + 20
    while listener.connection_count < n_conn:  # all 2,000 are open at the same time
        assert time.monotonic() < deadline, listener.connection_count
        await asyncio.sleep(0.02)

    async def talk(i: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(f"m,dev=d{i} seq={j}i\n".encode() for j in range(lines_each)))
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(talk(i, w) for i, (_, w) in enumerate(conns)))
    found = await wait_for_records(store, "tcp", n_conn * lines_each, timeout=60)
    assert len(found) == n_conn * lines_each
    assert len({(r.key, r.value) for r in found}) == n_conn * lines_each
    row = listener.health.snapshot(devices=False)[0]
    assert row["connections_total"] == n_conn


async def test_stop_finishes_in_flight_writes(start_listener: Start) -> None:
    listener, store = await start_listener()
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(b'{"device_id": "x"}\n' * 100)
    await writer.drain()
    await wait_for_records(store, "tcp", 100)
    await listener.stop()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


def test_stop_with_open_connections_under_uvloop() -> None:
    """uvloop (what ``sluice serve`` runs on) hands out transport sockets without ``shutdown()``:
    stop() raised TypeError there with a connection still open, and its in-flight writes were not
    waited for."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        store = MemoryLogStore(default_partitions=4)
        sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
        listener = TcpLineListener(TcpListenerConfig(port=0), sink, sink.health)
        await listener.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b'{"device_id": "x"}\n' * 100)
        await writer.drain()
        await wait_for_records(store, "tcp", 100)
        await listener.stop()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    uvloop.run(scenario())


async def test_acked_lines_survive_a_restart_of_the_segment_store(tmp_path: Path) -> None:
    """Ack mode on the file store with flush=always: what was ACKed is there after reopening."""
    from broker.log.config import FlushPolicy, TopicConfig
    from broker.log.segment import SegmentLogStore

    store = SegmentLogStore(tmp_path / "logs", default_config=TopicConfig(flush=FlushPolicy.ALWAYS),
                            default_partitions=2)
    await store.start()
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    listener = TcpLineListener(TcpListenerConfig(port=0, ack=True, format="influx"), sink, sink.health)
    await listener.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(b"".join(f"m,dev=d{i % 5} v={i}i {1_700_000_000 + i}000000000\n".encode() for i in range(500)))
    writer.write(b"m,dev=x v=oops\n")
    await writer.drain()
    acked = 0
    while acked < 501:
        line = (await asyncio.wait_for(reader.readline(), 20)).decode()
        assert line, "connection closed before the ACK"
        if line.startswith("ACK"):
            acked = int(line.split()[1])
    writer.close()
    await listener.stop()
    await store.close()

    reopened = SegmentLogStore(tmp_path / "logs")
    await reopened.start()
    try:
        stored = records(reopened, "tcp")
        assert sorted(int((r.value or b"").split(b" v=")[1].split(b"i")[0]) for r in stored) == list(range(500))
        assert {r.timestamp for r in stored if r.key == b"m,dev=d0"} == {
            (1_700_000_000 + i) * 1000 for i in range(0, 500, 5)
        }
        (letter,) = records(reopened, "_dead_letters")
        assert b"invalid field value" in (letter.header("reason") or b"")
    finally:
        await reopened.close()


@pytest.mark.parametrize("ack", [True, False])
async def test_tcp_device_asks_whether_the_listener_acks_and_stores_each_line_once(
    start_listener: Start, ack: bool
) -> None:
    """``TcpDevice(ack="auto")``: its probe line is stored nowhere, it uses acks only where the listener
    gives them, and each reading is stored exactly once either way."""
    from clients.devices import TcpDevice

    listener, store = await start_listener(ack=ack)
    # the probe waits out its timeout only where no answer comes (plain); an ack-mode answer may take more
    # than 0.5 s on a loaded machine, and the device would then fall back to plain mode
    device = TcpDevice("127.0.0.1", listener.port, ack="auto", probe_timeout=10 if ack else 0.5, ack_timeout=10)
    async with device:
        for i in range(20):
            await device.send({"device_id": "d1", "i": i})
        await device.flush(20)
    assert device.acking is ack and device.unconfirmed == 0
    found = await wait_for_records(store, "tcp", 20)
    assert sorted(json.loads(r.value or b"")["i"] for r in found) == list(range(20))
    assert records(store, "_dead_letters") == []
