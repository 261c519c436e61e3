"""The asyncio MQTT server: accepts sockets, one ``MqttConnection`` each, and a once-a-second sweep.

The listener knows nothing of the assembly: it gets a ``Hub`` (which holds the ingest port and the
authentication hook) and an ``announce`` callable at construction. ``SinkPort`` adapts the shared
``IngestSink`` (durable append, dead letters, backpressure) to the hub's ``IngestPort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from ingest.mqtt.from_log import LogToMqtt
from ingest.mqtt.hub import Accepted, Hub
from ingest.mqtt.packets import Reason
from ingest.mqtt.properties import to_headers
from ingest.mqtt.session import MqttConnection
from ingest.routing import RawMessage, SourceRef
from ingest.sink import IngestSink

__all__ = ["MqttListener", "SinkPort"]

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
        await self.sink.ingest(
            self.source, [RawMessage(m.payload, m.topic, client_id, at, None, to_headers(m.properties))
                          for m, _, at in messages]
        )

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


class MqttListener:
    """A Component: ``start()`` binds (port 0 = ephemeral) and announces; ``stop()`` drains and closes."""

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
    ) -> None:
        self.hub = hub
        self.host = host
        self.port = port
        self._announce = announce
        self._sweep_interval = sweep_interval_s
        self._backlog = backlog
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.follower = follower  # delivers records others write to the log to MQTT subscribers

    @property
    def bound_port(self) -> int:
        return self.port

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        hub = self.hub
        self._server = await loop.create_server(
            lambda: MqttConnection(hub), self.host, self.port, backlog=self._backlog, reuse_address=True
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self._sweeper = asyncio.create_task(self._sweep())
        if self.follower is not None:
            await self.follower.start()
        if self._announce is not None:
            self._announce(self.name, self.host, self.port)
        log.info("mqtt listener started", extra={"host": self.host, "port": self.port})
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
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for connection in list(self.hub.connections):
            connection.shutdown(Reason.SERVER_SHUTTING_DOWN)
        await self.hub.drain(timeout=10.0)  # appends already accepted finish (and are acked if possible)
        log.info("mqtt listener stopped", extra={"port": self.port})
