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
logged and closes that connection only. Beyond the connection caps (``ingest/admission.py``: total and
per client address, shared by the TCP listeners of one Sluice) a new connection is closed unread; in ack
mode it first gets ``FATAL too many connections (<setting> reached)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from broker.security import Principal
from broker.security.tls import peer_common_name, peer_principal
from ingest.admission import Admission
from ingest.errors import SinkError
from ingest.health import HealthRegistry
from ingest.line_writes import LineOutcome
from ingest.routing import SourceRef
from ingest.sink import IngestSink, WriteOutcome
from ingest.tcp.auth import AUTH_FAILED, DOOR, NOT_AUTHORIZED, LineAuthenticator, parse_auth_line
from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LineStream, payload_format

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


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def ack_lines(
    outcomes: Sequence[WriteOutcome], numbers: Sequence[int], last_line: int, dead_letter_topic: str
) -> bytes:
    """The ack-mode answer for one durable batch (format in the module docstring)."""
    out: list[str] = []
    last: dict[tuple[str, int], int] = {}
    for outcome, number in zip(outcomes, numbers, strict=True):
        for reason in outcome.rejected:
            out.append(f"ERR {number} {_one_line(reason)}\n")
        for placement in outcome.placements:
            key = (placement.topic, placement.partition)
            if placement.offset > last.get(key, -1):
                last[key] = placement.offset
    for (topic, partition), offset in last.items():
        if topic != dead_letter_topic:
            out.append(f"OK {topic} {partition} {offset}\n")
    out.append(f"ACK {last_line}\n")
    return "".join(out).encode()


def line_acks(outcome: LineOutcome, numbers: Sequence[int] | None, first: int, last_line: int,
              dead_letter_topic: str) -> bytes:
    """``ack_lines`` for a read written by ``IngestSink.write_lines``: line ``i`` of the read is line number
    ``numbers[i]`` (None: ``first + i``, no line of the read was skipped)."""
    out = [f"ERR {numbers[i] if numbers is not None else first + i} {_one_line(reason)}\n"
           for i, reason in outcome.rejected]
    out += [f"OK {topic} {partition} {offset}\n" for (topic, partition), offset in outcome.last_offsets.items()
            if topic != dead_letter_topic]
    out.append(f"ACK {last_line}\n")
    return "".join(out).encode()


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
        self.health = health
        self.admission = admission if admission is not None else Admission("TCP", log=log)  # may be shared
        self.source = SourceRef("tcp", config.name, payload_format(config.format))
        self._clock = clock
        self._tls_options: dict[str, Any] = (
            {"ssl": tls, "ssl_handshake_timeout": tls_handshake_timeout_s} if tls is not None else {})
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: dict[asyncio.StreamWriter, asyncio.StreamReader] = {}
        self.host = config.host
        self.port = config.port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self.health.register(self.source)
        self._server = await asyncio.start_server(
            self._handle,
            self.config.host,
            self.config.port,
            backlog=self.config.backlog,
            limit=max(self.config.read_bytes, 64 * 1024),
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
        """Stop accepting; close connections; wait for in-flight writes to become durable."""
        if self._server is not None:
            self._server.close()
        for writer, reader in list(self._writers.items()):
            # End the read side: a handler mid-write finishes its durable append, then sees EOF.
            sock = writer.get_extra_info("socket")
            if writer.get_extra_info("sslcontext") is None and sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RD)
                    continue
                except OSError:
                    continue
                except TypeError:  # uvloop's transport sockets have no shutdown(): end reading as under TLS
                    pass
            cast(asyncio.Transport, writer.transport).pause_reading()  # no half-shut under the TLS layer
            reader.feed_eof()
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        reason = self.admission.admit(address)
        if reason is not None:  # over a connection cap: closed unread (ack mode is told why first)
            if self.config.ack:
                writer.write(f"FATAL too many connections ({reason} reached)\n".encode())
            writer.close()
            return
        self._connections.add(task)
        self._writers[writer] = reader
        self.health.connection_opened(self.source)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the peer went away; everything acked so far is stored
        except ssl.SSLError as exc:  # a TLS alert or a broken record after the handshake: the peer's doing
            log.info("tls error; closing tcp connection",
                     extra={"listener": self.config.name, "peer": str(peer), "error": str(exc)})
        except SinkError as exc:
            log.error("tcp batch not stored; closing connection",
                      extra={"listener": self.config.name, "peer": str(peer), "error": str(exc)})
            if self.config.ack:
                with contextlib.suppress(ConnectionError, OSError):
                    writer.write(f"FATAL {_one_line(str(exc))}\n".encode())
                    await asyncio.wait_for(writer.drain(), 1.0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tcp connection failed", extra={"listener": self.config.name, "peer": str(peer)})
        finally:
            self.admission.release(address)
            self.health.connection_closed(self.source)
            self._writers.pop(writer, None)
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = self.config
        sink = self.sink
        framer = LineFramer(config.max_line_bytes)
        stream = LineStream(config.format)
        idle = config.idle_timeout_s if config.idle_timeout_s > 0 else None
        early: list[bytes | LineTooLong] = []
        ssl_object = writer.get_extra_info("ssl_object")
        if self.authenticator is not None and peer_principal(ssl_object) is not None:
            self.authenticator.succeeded(DOOR)  # a verified TLS client certificate is the login: no AUTH line
            if not await self._may_write(Principal(peer_common_name(ssl_object) or ""), writer):
                return
        elif self.authenticator is not None:
            login = await self._login(self.authenticator, reader, writer, framer)
            if login is None:
                return
            early, principal = login
            stream.line_no = 1  # the AUTH line
            if not await self._may_write(principal, writer):
                return
            if config.ack:
                writer.write(b"ACK 1\n")
                await writer.drain()
        if early:
            await self._ingest(early, stream, writer)
        while True:
            if sink.saturated:
                # Backpressure from other writers: stop reading until the log catches up.
                with self.health.paused(self.source):
                    await sink.wait_writable()
            try:
                async with asyncio.timeout(idle):  # no task per read, as wait_for makes: ~2 µs less per read
                    data = await reader.read(config.read_bytes)
            except TimeoutError:
                log.info("closing idle tcp connection",
                         extra={"listener": config.name, "peer": str(writer.get_extra_info("peername"))})
                return
            items = framer.feed(data) if data else framer.end()
            if items:
                await self._ingest(items, stream, writer)
            if not data:
                return

    async def _ingest(self, items: list[bytes | LineTooLong], stream: LineStream,
                      writer: asyncio.StreamWriter) -> None:
        sink = self.sink
        ack = self.config.ack
        first = stream.line_no + 1  # the number of items[0]
        lines = stream.lines(items)
        if lines is not None:  # the usual read: written with the other reads of this loop turn
            if not ack:
                await sink.ingest_lines(self.source, lines, int(self._clock() * 1000), stream.columns)
                return
            outcome = await sink.write_lines(self.source, lines, int(self._clock() * 1000), stream.columns)
            numbers = None if len(lines) == len(items) else stream.numbers(items, first)
            writer.write(line_acks(outcome, numbers, first, stream.line_no, sink.dead_letter_topic))
            await writer.drain()
            return
        messages, numbers = stream.messages(items, int(self._clock() * 1000))
        if ack:
            outcomes = await sink.write(self.source, messages)
            writer.write(ack_lines(outcomes, numbers, stream.line_no, sink.dead_letter_topic))
            await writer.drain()
        else:
            await sink.ingest(self.source, messages)  # no per-line outcomes needed

    async def _may_write(self, principal: Principal, writer: asyncio.StreamWriter) -> bool:
        """The ACLs' word on this login (checked once, at login): refused, ``FATAL not authorized`` and the
        connection closed before any line is stored (the refusal is audited by the authorizer)."""
        if self.may_write is None:
            return True
        peer = writer.get_extra_info("peername")
        if self.may_write(principal, str(peer[0]) if isinstance(peer, tuple) and peer else "?"):
            return True
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            writer.write(NOT_AUTHORIZED)
            await asyncio.wait_for(writer.drain(), 1.0)
        return False

    async def _login(self, auth: LineAuthenticator, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     framer: LineFramer) -> tuple[list[bytes | LineTooLong], Principal] | None:
        """Read and check the AUTH line; the lines that came behind it and the principal, or None when refused
        (then closed)."""
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.auth_timeout_s
        items: list[bytes | LineTooLong] = []
        while not items:
            try:
                data = await asyncio.wait_for(reader.read(self.config.read_bytes), max(0.0, deadline - loop.time()))
            except TimeoutError:
                data = None
            if data is None:
                auth.failed(DOOR, host, None, f"no AUTH line within {self.config.auth_timeout_s:g} s")
                await self._refuse_login(writer)
                return None
            if not data:
                auth.failed(DOOR, host, None, "closed before AUTH")
                return None
            items = framer.feed(data)
        first, rest = items[0], items[1:]
        user: str | None = None
        try:
            if isinstance(first, LineTooLong):
                raise ValueError("the first line is longer than the line limit")
            credentials = parse_auth_line(first)
            user = credentials.user
            principal = auth.check_password(credentials.user, credentials.password)
            if principal is None:
                raise ValueError("invalid user name or password")
        except ValueError as exc:
            auth.failed(DOOR, host, user, str(exc))
            await self._refuse_login(writer)
            return None
        auth.succeeded(DOOR)
        return rest, principal  # ACK 1 follows once the ACLs agreed (_serve)

    @staticmethod
    async def _refuse_login(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            writer.write(AUTH_FAILED)
            await asyncio.wait_for(writer.drain(), 1.0)
