"""The TCP line listener: newline-delimited JSON, InfluxDB line protocol or CSV, one format per listener.

Each connection is read in chunks of up to ``read_bytes``; the complete lines of a chunk are one
``IngestSink.ingest_lines`` call (``write_lines`` in ack mode; ``write`` for a chunk with a line over the
limit, and for CSV), written together with the other connections' chunks of the same loop turn, and the
connection reads nothing more until its lines are durable. So
when the log falls behind, reads stop, the kernel's receive buffer fills and the sender's TCP window
closes: its writes block (backpressure) and nothing is dropped.

Ack mode (``ack = true``): after each batch is durable the server writes, in this order::

    ERR <line> <reason>                 one per line that went to the dead-letter topic
    OK <topic> <partition> <offset>     one per log partition written: the last offset written there
    ACK <line>                          every line up to and including <line> is durable

``<line>`` counts the connection's lines from 1 (empty lines and comments included). If the log
cannot take the batch at all the server writes ``FATAL <reason>`` and closes the connection; lines
after the last ``ACK`` were not stored. Without ack mode the server never writes to the socket.

With an authenticator (``security.auth = "required"``) the first line must be ``AUTH <user> <password>``
(``ingest/tcp/auth.py``: answered ``ACK 1`` in ack mode; refused with ``FATAL authentication failed`` and
closed). With the ACLs (``may_write``), a login that may not write the log topics this listener's lines
are routed to gets ``FATAL not authorized`` (also in plain mode) and is closed, nothing stored: checked
once, at login.

With a server TLS context (``security.tls_cert``) the listener speaks TLS on its port; a failed handshake
closes the socket before any line is read (logged by asyncio at DEBUG only). A client whose certificate was
verified against ``security.tls_client_ca`` is logged in by it: it sends no AUTH line (its first line is
data, line 1).

A connection that sends nothing for ``idle_timeout_s`` is closed. Any error in one connection is
logged and closes that connection only. Each connection is a ``LineConnection`` protocol
(``ingest/tcp/connection.py``: no task, future or timer per read).

Beyond the connection caps (``ingest/admission.py``: total and
per client address, shared by the TCP listeners of one Sluice) a new connection is closed unread; in ack
mode it first gets ``FATAL too many connections (<setting> reached)``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.security import Principal
from ingest.admission import Admission
from ingest.health import HealthRegistry
from ingest.routing import SourceRef
from ingest.sink import IngestSink
from ingest.tcp.answers import ack_lines, line_acks
from ingest.tcp.auth import LineAuthenticator
from ingest.tcp.connection import LineConnection
from ingest.tcp.lines import payload_format

__all__ = ["LISTENER_FORMATS", "TcpLineListener", "TcpListenerConfig", "ack_lines", "line_acks"]

log = logging.getLogger("ingest.tcp")

LISTENER_FORMATS: tuple[str, ...] = ("ndjson", "influx", "csv")


@dataclass(frozen=True, slots=True)
class TcpListenerConfig:
    name: str = "default"
    host: str = "127.0.0.1"
    port: int = 8094
    format: str = "ndjson"
    ack: bool = False
    max_line_bytes: int = 64 * 1024
    idle_timeout_s: float = 300.0  # 0 = never
    read_bytes: int = 64 * 1024
    backlog: int = 4096
    auth_timeout_s: float = 10.0  # with an authenticator: time for the AUTH line to arrive

    def __post_init__(self) -> None:
        if self.format not in LISTENER_FORMATS:
            raise ValueError(f"unknown TCP line format {self.format!r} ({', '.join(LISTENER_FORMATS)})")


class TcpLineListener:
    def __init__(
        self,
        config: TcpListenerConfig,
        sink: IngestSink,
        health: HealthRegistry,
        *,
        clock: Callable[[], float] = time.time,
        admission: Admission | None = None,
        authenticator: LineAuthenticator | None = None,
        tls: ssl.SSLContext | None = None,
        tls_handshake_timeout_s: float = 10.0,
        may_write: Callable[[Principal, str], bool] | None = None,
    ) -> None:
        self.config = config
        self.authenticator = authenticator  # set: each connection logs in with a first AUTH line
        self.may_write = may_write  # the ACLs (with an authenticator): may this login write this source's lines?
        self.sink = sink
        self.turns = sink.line_turns  # reads of one loop turn are written together
        self.health = health
        self.admission = admission if admission is not None else Admission("TCP", log=log)  # may be shared
        self.source = SourceRef("tcp", config.name, payload_format(config.format))
        self.clock = clock
        self.read_buffer = memoryview(bytearray(config.read_bytes))  # every connection reads into it in turn
        self._tls_options: dict[str, Any] = (
            {"ssl": tls, "ssl_handshake_timeout": tls_handshake_timeout_s} if tls is not None else {})
        self._server: asyncio.Server | None = None
        self._connections: set[LineConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop_time: Callable[[], float] = time.monotonic  # the running loop's clock, from start()
        self.host = config.host
        self.port = config.port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self.health.register(self.source)
        loop = asyncio.get_running_loop()
        self.loop_time = loop.time
        self._server = await loop.create_server(
            lambda: LineConnection(self),
            self.config.host,
            self.config.port,
            backlog=self.config.backlog,
            reuse_address=True,
            **self._tls_options,
        )
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        log.info(
            "tcp line listener started",
            extra={"listener": self.config.name, "port": self.port, "format": self.config.format,
                   "ack": self.config.ack, "tls": bool(self._tls_options)},
        )

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting; stop reading; wait for in-flight writes to become durable and be answered."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.stop()
        closing = [connection.closed for connection in self._connections]
        if closing:
            _, pending = await asyncio.wait(closing, timeout=timeout)
            if pending:
                for connection in list(self._connections):
                    if connection.transport is not None:
                        connection.transport.abort()
                await asyncio.wait(pending, timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def connection_opened(self, connection: LineConnection) -> None:
        self._connections.add(connection)
        self.health.connection_opened(self.source)

    def connection_closed(self, connection: LineConnection) -> None:
        self._connections.discard(connection)
        self.admission.release(connection.address)
        self.health.connection_closed(self.source)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a connection's rare asynchronous step (a read written message by message)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
