"""Device helpers: buffering while disconnected, reconnect with backoff, ack mode, overflow policies."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiomqtt
import pytest

from clients.devices import MqttDevice, TcpDevice, parse_answer
from clients.errors import BufferFullError
from tests.clients.mosquitto import Mosquitto, free_port


class LineServer:
    """A TCP peer that can be cut at will; in ack mode it answers as Sluice's listener does (``ACK <line>``)."""

    def __init__(self, port: int, ack: bool) -> None:
        self.port, self.ack = port, ack
        self.lines: list[bytes] = []
        self.got = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.drop_after: int | None = None  # close the connection after this many lines (without acking)
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):
                writer.close()
            await self.server.wait_closed()
            self.server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        line_no = 0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                while not data.endswith(b"\n"):
                    data += await reader.readuntil(b"\n")
                lines = data.splitlines()
                if self.drop_after is not None and len(self.lines) + len(lines) > self.drop_after:
                    self.drop_after = None
                    return  # lost before the durable append: no ack
                self.lines.extend(lines)
                self.got.set()
                line_no += len(lines)
                if self.ack:
                    writer.write(b"OK tcp 0 %d\nACK %d\n" % (len(self.lines) - 1, line_no))
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.writers.discard(writer)
            writer.close()


@pytest.fixture
async def ack_server() -> AsyncIterator[LineServer]:
    server = LineServer(free_port(), ack=True)
    await server.start()
    yield server
    await server.stop()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition the device's own task makes true (its state, not a fixed delay)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_parse_answer() -> None:
    assert parse_answer(b"ACK 12\n") == ("ACK", "12")
    assert parse_answer(b"ERR 3 json: bad\n") == ("ERR", "3 json: bad")
    with pytest.raises(ConnectionError):
        parse_answer(b"what?\n")


async def test_tcp_device_sends_ndjson_lines_with_acks(ack_server: LineServer) -> None:
    async with TcpDevice("127.0.0.1", ack_server.port, ack=True) as dev:
        for i in range(50):
            await dev.send({"sensor": f"sensor_{i % 10}", "temp": 65.0 + i})
        await dev.flush(timeout=5)
        assert dev.stats.sent == 50 and dev.stats.queued == 0
    readings = [json.loads(line) for line in ack_server.lines]
    assert [r["temp"] for r in readings] == [65.0 + i for i in range(50)]


async def test_tcp_device_buffers_while_down_then_delivers(tmp_path: Path) -> None:
    port = free_port()
    dev = TcpDevice("127.0.0.1", port, ack=True, backoff_initial=0.02, backoff_max=0.1)
    await dev.start()
    for i in range(20):
        await dev.send(f"line {i}")
    await until(lambda: dev.stats.last_error is not None)  # its connect attempt has failed
    assert dev.stats.queued == 20 and dev.stats.sent == 0 and not dev.stats.connected
    server = LineServer(port, ack=True)
    await server.start()
    try:
        await dev.flush(timeout=5)
        assert server.lines == [f"line {i}".encode() for i in range(20)]
    finally:
        await dev.close()
        await server.stop()


async def test_tcp_ack_mode_resends_a_batch_cut_by_a_disconnect(ack_server: LineServer) -> None:
    ack_server.drop_after = 5
    dev = TcpDevice("127.0.0.1", ack_server.port, ack=True, backoff_initial=0.01)
    await dev.start()
    await dev.wait_connected(5)
    for i in range(10):
        await dev.send({"n": i})
    await dev.flush(timeout=5)
    await dev.close()
    got = [json.loads(line)["n"] for line in ack_server.lines]
    assert sorted(set(got)) == list(range(10))  # at-least-once: nothing lost
    assert dev.stats.disconnects >= 1


async def test_overflow_policies() -> None:
    port = free_port()  # nobody listens
    err = TcpDevice("127.0.0.1", port, buffer_size=3, overflow="error", backoff_initial=1)
    await err.start()
    for i in range(3):
        await err.send(i)
    with pytest.raises(BufferFullError, match="buffer of 3 readings is full"):
        await err.send(3)
    await err.close(timeout=0.1)

    drop = TcpDevice("127.0.0.1", port, buffer_size=3, overflow="drop_oldest", backoff_initial=1)
    for i in range(5):
        await drop.send(i)
    assert drop.stats.dropped == 2 and list(drop._buffer) == [b"2", b"3", b"4"]

    block = TcpDevice("127.0.0.1", port, buffer_size=2, backoff_initial=1)
    await block.send(0)
    await block.send(1)
    pending = asyncio.create_task(block.send(2))
    await asyncio.sleep(0.05)
    assert not pending.done()  # backpressure on the caller
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path)
    broker.start()
    yield broker
    broker.cleanup()


async def collect(port: int, topic: str, n: int, ready: asyncio.Event) -> list[bytes]:
    got: list[bytes] = []
    async with aiomqtt.Client("127.0.0.1", port) as sub:
        await sub.subscribe(topic, qos=1)
        ready.set()
        async for message in sub.messages:
            got.append(bytes(message.payload))
            if len(got) == n:
                return got
    return got


async def test_mqtt_device_publishes_with_qos1(mosquitto: Mosquitto) -> None:
    ready = asyncio.Event()
    sub = asyncio.create_task(collect(mosquitto.port, "sensors/#", 10, ready))
    await ready.wait()
    async with MqttDevice("127.0.0.1", mosquitto.port, topic="sensors/sensor_1", client_id="sensor_1") as dev:
        for i in range(10):
            await dev.send_reading(sensor="sensor_1", temp=60 + i)
        await dev.flush(timeout=5)
    got = await asyncio.wait_for(sub, 5)
    assert [json.loads(p)["temp"] for p in got] == list(range(60, 70))


async def test_mqtt_device_buffers_across_a_broker_restart(mosquitto: Mosquitto) -> None:
    # A watcher with a persistent session subscribes first, so nothing the device sends after the
    # restart can slip past it, whenever it reconnects.
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="watcher", clean_session=False) as w:
        await w.subscribe("sensors/s2", qos=1)
    dev = MqttDevice(
        "127.0.0.1", mosquitto.port, topic="sensors/s2", client_id="s2", backoff_initial=0.05, backoff_max=0.2
    )
    await dev.start()
    await dev.wait_connected(5)
    mosquitto.stop()
    for i in range(5):
        await dev.send({"n": i})
    await until(lambda: dev.stats.disconnects >= 1)  # delivering failed: the device noticed the broker is gone
    assert dev.stats.queued == 5 and dev.stats.sent == 0  # kept while the broker is down
    mosquitto.start()
    await dev.flush(timeout=10)
    await dev.close()
    got: list[int] = []
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="watcher", clean_session=False) as w:
        await w.subscribe("sensors/s2", qos=1)
        async with asyncio.timeout(10):
            async for message in w.messages:
                got.append(json.loads(bytes(message.payload))["n"])
                if len(set(got)) == 5:
                    break
    assert sorted(set(got)) == list(range(5))
    assert dev.stats.connects >= 2


async def test_closing_an_mqtt_device_leaves_no_publish_waiting_for_its_ack() -> None:
    # A broker that accepts the connection and never acknowledges a QoS 1 publish: closing the device
    # must take the pending publish with it (it used to wait alone for its timeout and then end in
    # "Task exception was never retrieved").
    received = asyncio.Event()

    async def never_acks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)  # CONNECT
        writer.write(b"\x20\x02\x00\x00")  # CONNACK, accepted
        while data := await reader.read(1024):
            if data[0] >> 4 == 3:  # PUBLISH
                received.set()
        writer.close()

    server = await asyncio.start_server(never_acks, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dev = MqttDevice("127.0.0.1", port, topic="sensors/s3", client_id="s3", timeout=60)
    await dev.start()
    await dev.send({"n": 1})
    await asyncio.wait_for(received.wait(), 5)
    await dev.close(timeout=0.1)
    await asyncio.sleep(0)
    others = asyncio.all_tasks() - {asyncio.current_task()}
    publishing = [t for t in others if "publish" in repr(t.get_coro())]
    assert publishing == []
    server.close()
    await server.wait_closed()
