"""Helpers for MQTT tests: an in-process Sluice MQTT front door on port 0 over a real log store,
real command-line clients run as subprocesses, and a raw socket client for the byte-level cases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.log.api import LogStore
from broker.log.memory import MemoryLogStore
from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.hub import Hub
from ingest.mqtt.listener import MqttListener
from ingest.mqtt.packets import MQTT_311, Connack, Connect, Packet
from sluice.components.mqtt import mqtt_listener
from sluice.config import load_settings
from sluice.runtime import Runtime

# Temperatures: topic sensors/<device>/temperature, JSON payload with "ts" (ms) -> log topic
# "temperatures", keyed by the device level, event time from the payload.
ROUTES = [
    {"name": "temps", "source": "mqtt", "filter": "sensors/+/temperature", "topic": "temperatures",
     "key": "level:1", "time_field": "ts", "time_format": "epoch_ms", "format": "json"},
]


@dataclass
class MqttServer:
    port: int
    store: LogStore
    hub: Hub
    listener: MqttListener
    runtime: Runtime


StartServer = Callable[..., Awaitable[MqttServer]]


@pytest.fixture
async def start_server(tmp_path: Path) -> AsyncIterator[StartServer]:
    started: list[MqttServer] = []

    async def start(store: LogStore | None = None, **mqtt: Any) -> MqttServer:
        """A listener over ``store`` (started here unless a server already uses it: a restart over it)."""
        settings = load_settings(
            data_dir=tmp_path, mqtt={"port": 0, **mqtt}, ingest={"routes": ROUTES, "max_pending_bytes": 1 << 20}
        )
        store = store or MemoryLogStore(default_config=settings.storage.topic_defaults())
        if not any(server.store is store for server in started):
            await store.start()
        runtime = Runtime(settings, store)
        listener = mqtt_listener(runtime)
        assert isinstance(listener, MqttListener)
        await listener.start()
        server = MqttServer(listener.port, store, listener.hub, listener, runtime)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.listener.stop()
    for store in {id(server.store): server.store for server in started}.values():
        await store.close()


@pytest.fixture
async def server(start_server: StartServer) -> MqttServer:
    return await start_server()


async def run(*args: str, stdin: bytes | None = None, timeout: float = 20.0) -> tuple[int, str, str]:
    """Run a command-line client to completion; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class RawClient:
    """A byte-level MQTT client for cases real clients refuse to produce (garbage, wrong sizes, retries)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.decoder = Decoder(version)
        self._ready: list[Packet] = []
        self._raw = b""  # bytes read by ``recv_bytes`` beyond the packet it returned

    @classmethod
    async def open(cls, port: int, version: int = MQTT_311) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, version)

    async def connect(self, client_id: str = "raw", **kwargs: Any) -> Connack:
        self.send(Connect(client_id, self.version, **kwargs))
        ack = await self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = 5.0) -> Packet:
        while not self._ready:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by server")
            self._ready += self.decoder.feed(data)
        return self._ready.pop(0)

    async def recv_bytes(self, timeout: float = 5.0) -> bytes:
        """The next packet exactly as the server wrote it (fixed header included); not mixed with ``recv``."""
        buf = self._raw
        while True:
            if len(buf) >= 2:
                length, shift, pos = 0, 0, 1
                while pos < len(buf) and pos <= 4:
                    length |= (buf[pos] & 0x7F) << shift
                    shift += 7
                    pos += 1
                    if not buf[pos - 1] & 0x80:
                        if len(buf) >= pos + length:
                            self._raw = buf[pos + length:]
                            return buf[:pos + length]
                        break
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by server")
            buf += data

    async def read_until_closed(self, timeout: float = 5.0) -> bytes:
        """Everything the server sends until it closes the socket."""
        out = b""
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except ConnectionResetError:
                return out
            if not data:
                return out
            out += data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
