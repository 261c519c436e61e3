"""A QoS 1 PUBLISH whose socket dies while its append is in flight. uvloop closes a transport at once when the
peer resets it and reports connection_lost on a later turn of the loop; an append completing in between made
the adapter write the PUBACK to the closed transport, where uvloop raises RuntimeError: the append task died
and asyncio logged "Task exception was never retrieved" (the MQTT fuzz smoke run, about one run in four).
The transport below behaves as uvloop's does once its handle is closed; the adapter and hub are the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ingest.mqtt.hub import Accepted, Hub
from ingest.mqtt.session import MqttConnection

CONNECT = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04slow"  # 3.1.1, clean session, client id "slow"
PUBLISH_QOS1 = b"\x32\x08\x00\x03a/b\x00\x01x"  # topic a/b, packet id 1, payload "x"


class SlowPort:
    """An ingest port whose appends wait until the test lets them finish."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.appended: list[bytes] = []

    async def ingest(self, client_id: str, messages: Sequence[Accepted]) -> None:
        self.started.set()
        await self.release.wait()
        self.appended += [m.payload for m, _, _ in messages]

    def backlog_bytes(self) -> int:
        return 0

    def connections_changed(self, delta: int) -> None:
        pass

    def reads_paused(self, paused: bool) -> None:
        pass


class UvloopLikeTransport:
    """Writes are recorded while open; once the handle is closed, every operation raises as uvloop's."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.handle_closed = False

    def _alive(self) -> None:
        if self.handle_closed:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    def write(self, data: bytes) -> None:
        self._alive()
        self.written += data

    def close(self) -> None:
        self.handle_closed = True

    def is_closing(self) -> bool:
        return self.handle_closed

    def pause_reading(self) -> None:
        self._alive()

    def resume_reading(self) -> None:
        self._alive()

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


async def test_puback_after_the_socket_died_is_dropped_not_written() -> None:
    port = SlowPort()
    hub = Hub(port)
    spawned: list[asyncio.Task[None]] = []
    spawn = hub.spawn

    def keep(coro: Any) -> asyncio.Task[None]:  # observed only: the hub's own spawn runs the append loop
        task = spawn(coro)
        spawned.append(task)
        return task

    hub.spawn = keep  # type: ignore[method-assign]
    connection = MqttConnection(hub)
    transport = UvloopLikeTransport()
    connection.connection_made(transport)
    connection.data_received(CONNECT)
    assert bytes(transport.written) == b"\x20\x02\x00\x00"
    connection.data_received(PUBLISH_QOS1)
    await asyncio.wait_for(port.started.wait(), 10)  # the append is in flight
    transport.handle_closed = True  # the peer reset the socket; connection_lost comes on a later turn
    port.release.set()
    await hub.drain(timeout=10)
    assert spawned and all(t.done() for t in spawned)
    assert [t.exception() for t in spawned] == [None]
    assert port.appended == [b"x"]  # what was accepted is stored all the same
    connection.connection_lost(ConnectionResetError())
    assert not hub.connections
