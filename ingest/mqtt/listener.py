"""The asyncio MQTT server: accepts sockets, one ``MqttConnection`` each, and a once-a-second sweep.

It binds one server per ``MqttDoor``: plain MQTT, MQTT over TLS, and MQTT over WebSockets (``websocket.py``)
plain or TLS, each on its own port, as Mosquitto's listeners; every door feeds the same hub. With
``park_after_s`` set (and epoll available) the plain-MQTT doors accept their sockets through a
``ParkingLot`` (``parking.py``): idle connections hold no asyncio transport.

The listener knows nothing of the assembly: it gets a ``Hub`` (which holds the ingest port and the
authentication hook) and an ``announce`` callable at construction. ``SinkPort`` adapts the shared
``IngestSink`` (durable append, dead letters, backpressure) to the hub's ``IngestPort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.mqtt.from_log import LogToMqtt
from ingest.mqtt.hub import Accepted, Hub
from ingest.mqtt.packets import NO_PROPERTIES, Reason
from ingest.mqtt.parking import ParkingLot
from ingest.mqtt.ports import REFUSED
from ingest.mqtt.properties import to_headers
from ingest.mqtt.session import MqttConnection
from ingest.mqtt.websocket import WebSocketStats, websocket_factory
from ingest.routing import SourceRef
from ingest.sink import IngestSink

__all__ = ["MqttDoor", "MqttListener", "SinkPort"]

log = logging.getLogger("ingest.mqtt")


class SinkPort:
    """``IngestPort`` over the ingest sink: each PUBLISH becomes a RawMessage of ``source``."""

    __slots__ = ("sink", "source")

    def __init__(self, sink: IngestSink, source: SourceRef) -> None:
        self.sink = sink
        self.source = source

    async def ingest(self, client_id: str, messages: Sequence[Accepted]) -> None:
        # ingest(), not write(): acks need only "durable now", not per-message placements.
        # MQTT 5 properties become record headers after Sluice's own (ingest/mqtt/properties.py rule 2).
        plain = [(m.topic, m.payload, at, () if m.properties is NO_PROPERTIES else to_headers(m.properties))
                 for m, _, at in messages if at != REFUSED]  # refused by the ACLs: never stored (publish_in.py rule 13)
        if plain:
            await self.sink.ingest_from(self.source, client_id, plain)

    def connections_changed(self, delta: int) -> None:
        if delta > 0:
            self.sink.health.connection_opened(self.source)
        else:
            self.sink.health.connection_closed(self.source)

    def reads_paused(self, paused: bool) -> None:
        if paused:
            self.sink.health.pause_started(self.source)
        else:
            self.sink.health.pause_ended(self.source)

    def backlog_bytes(self) -> int:
        return self.sink.pending_bytes if not self.sink.saturated else self.sink.max_pending_bytes + 1


@dataclass(frozen=True, slots=True)
class MqttDoor:
    """One port of the MQTT front door (Mosquitto's ``listener``): plain or TLS, raw MQTT or WebSockets."""

    name: str  # announced as this endpoint: "mqtt", "mqtt-tls", "mqtt-ws", "mqtt-wss"
    port: int
    tls: ssl.SSLContext | None = None
    websocket: bool = False


class MqttListener:
    """A Component: ``start()`` binds every door (port 0 = ephemeral) and announces each; ``stop()`` drains
    and closes. All doors share the hub: sessions, subscriptions and retained messages."""

    name = "mqtt"

    def __init__(
        self,
        hub: Hub,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        announce: Callable[[str, str, int], None] | None = None,
        sweep_interval_s: float = 1.0,
        backlog: int = 4096,
        follower: LogToMqtt | None = None,
        doors: Sequence[MqttDoor] | None = None,  # default: plain MQTT on ``port``
        tls_handshake_timeout_s: float = 10.0,
        park_after_s: float | None = 10.0,  # park plain-TCP connections idle this long (None: never)
    ) -> None:
        self.hub = hub
        self.host = host
        self.port = port
        self.doors = tuple(doors) if doors is not None else (MqttDoor(self.name, port),)
        self.ports: dict[str, int] = {}  # door name -> bound port
        self.websocket_stats = WebSocketStats()
        self._announce = announce
        self._sweep_interval = sweep_interval_s
        self._backlog = backlog
        self._tls_handshake_timeout_s = tls_handshake_timeout_s
        self._servers: list[asyncio.Server] = []
        self._sweeper: asyncio.Task[None] | None = None
        self.follower = follower  # delivers records others write to the log to MQTT subscribers
        self.lot = (ParkingLot(park_after_s, hub.stats)
                    if park_after_s is not None and ParkingLot.available() else None)

    @property
    def bound_port(self) -> int:
        return self.port

    def _parks(self, door: MqttDoor) -> bool:
        return self.lot is not None and door.tls is None and not door.websocket

    def _protocol_factory(self, door: MqttDoor) -> Callable[[], asyncio.BaseProtocol]:
        hub = self.hub
        if not door.websocket:
            lot = self.lot if self._parks(door) else None
            return lambda: MqttConnection(hub, lot)
        return websocket_factory(lambda: MqttConnection(hub), self.websocket_stats,
                                 max_frame_bytes=2 * hub.config.max_packet_size,
                                 handshake_timeout_s=hub.config.connect_timeout_s)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.lot is not None:
            self.lot.start()
        try:
            for door in self.doors:
                if self._parks(door):
                    assert self.lot is not None
                    factory: Any = self._protocol_factory(door)
                    self.ports[door.name] = await self.lot.serve(self.host, door.port, self._backlog, factory)
                    continue
                tls: dict[str, Any] = (
                    {"ssl": door.tls, "ssl_handshake_timeout": self._tls_handshake_timeout_s} if door.tls else {})
                server = await loop.create_server(self._protocol_factory(door), self.host, door.port,
                                                  backlog=self._backlog, reuse_address=True, **tls)
                self._servers.append(server)
                self.ports[door.name] = server.sockets[0].getsockname()[1]
        except BaseException:
            for server in self._servers:
                server.close()
            self._servers = []
            if self.lot is not None:
                self.lot.stop_accepting()
                await self.lot.close()
            raise
        self.port = self.ports[self.doors[0].name] if self.doors else self.port
        self._sweeper = asyncio.create_task(self._sweep())
        if self.follower is not None:
            await self.follower.start()
        for door in self.doors:
            port = self.ports[door.name]
            if self._announce is not None:
                self._announce(door.name, self.host, port)
            log.info("mqtt listener started", extra={"host": self.host, "port": port, "listener": door.name,
                                                     "tls": door.tls is not None, "websocket": door.websocket})
        if self.hub.nobody_can_log_in:
            log.warning(
                "mqtt: allow_anonymous is false and no users are configured, so every client is refused "
                "(CONNACK 0x05 / 5.0: 0x86, or 0x87 without credentials); add [mqtt.users] or allow anonymous "
                "clients", extra={"port": self.port},
            )

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            try:
                self.hub.sweep(time.monotonic())
            except Exception:
                log.exception("mqtt sweep failed")

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        for server in self._servers:
            server.close()
        if self.lot is not None:
            self.lot.stop_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for connection in list(self.hub.connections):
            connection.shutdown(Reason.SERVER_SHUTTING_DOWN)
        await self.hub.drain(timeout=10.0)  # appends already accepted finish (and are acked if possible)
        if self.lot is not None:
            await self.lot.close()
        log.info("mqtt listener stopped", extra={"port": self.port})
