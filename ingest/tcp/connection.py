"""One TCP line connection as an asyncio protocol: the listener's per-read path without a task, a future
or a timer per read.

Rules (the listener's docstring says what a device sees):
- Reads land in the listener's shared buffer (``get_buffer``: at most ``read_bytes``), are copied out and
  framed at once; a read's lines go to the sink's write for this loop turn (``IngestSink.ingest_lines`` /
  ``write_lines`` through ``LineTurns.submit`` with a callback), so many connections' reads of one turn
  share one append per partition.
- One read in flight per connection: a read that arrives while the previous one is not yet durable (or
  while ack answers wait for the peer to read them) is held, and reading pauses until it is done, so the
  kernel's receive buffer fills and the sender's window closes (backpressure). When the write completes
  in the turn it was submitted (nothing waits: ``flush=os``), nothing is ever paused.
- Ack mode: the answer of a read (``ERR``/``OK``/``ACK``) is written when its lines are durable; reads are
  answered in order because only one is in flight. A read holding a line over the limit, or a broken CSV
  header, is written message by message (``IngestSink.write``/``ingest``) in a task.
- A storage failure (``SinkError``): ``FATAL <reason>`` in ack mode, then the connection is closed.
- End of stream (the peer's, or ``stop``): the unterminated last line is written, then the connection
  closes once everything is answered. Idle: one timer per connection, re-armed from the time of the last
  read when it fires (a read only stores the time).
- Login (an authenticator, no verified client certificate): the first line is the AUTH line
  (``ingest/tcp/auth.py``), within ``auth_timeout_s``; the lines behind it are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING, Any, cast

from broker.security import Principal
from broker.security.tls import peer_common_name, peer_principal
from ingest.errors import SinkError
from ingest.line_writes import LineOutcome
from ingest.tcp.answers import ack_lines, line_acks, one_line
from ingest.tcp.auth import AUTH_FAILED, DOOR, NOT_AUTHORIZED, parse_auth_line
from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LineStream

if TYPE_CHECKING:
    from ingest.tcp.listener import TcpLineListener

__all__ = ["LineConnection"]

log = logging.getLogger("ingest.tcp")


class LineConnection(asyncio.BufferedProtocol):
    def __init__(self, listener: TcpLineListener) -> None:
        self.listener = listener
        config = listener.config
        self.ack = config.ack
        self.framer = LineFramer(config.max_line_bytes)
        self.stream = LineStream(config.format)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"
        self.admitted = False
        self.login = False  # waiting for the AUTH line
        self.in_flight = False  # a read's lines are being written
        self.held: list[bytes] = []  # reads that came while one was in flight (reading is paused meanwhile)
        self.paused = False  # reading paused (by us)
        self.writing_paused = False  # the peer does not read our answers: read nothing more meanwhile
        self.ended = False  # end of stream seen (the peer's, or stop())
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._ack_context: tuple[list[int] | None, int, int] = (None, 0, 0)  # numbers, first line, last line
        self._tls = False
        self._on_stored = self._stored  # (bound once: the turn's callback for each read)

    # -- asyncio callbacks ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        listener = self.listener
        peer = transport.get_extra_info("peername")
        self.peer = str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        reason = listener.admission.admit(self.address)
        if reason is not None:  # over a connection cap: closed unread (ack mode is told why first)
            if self.ack:
                transport.write(f"FATAL too many connections ({reason} reached)\n".encode())
            transport.close()
            return
        self.admitted = True
        listener.connection_opened(self)
        loop = asyncio.get_running_loop()
        self.last_read = loop.time()
        ssl_object = transport.get_extra_info("ssl_object")
        self._tls = transport.get_extra_info("sslcontext") is not None
        auth = listener.authenticator
        if auth is not None and peer_principal(ssl_object) is not None:
            auth.succeeded(DOOR)  # a verified TLS client certificate is the login: no AUTH line
            if not self._may_write(Principal(peer_common_name(ssl_object) or "")):
                return
        elif auth is not None:
            self.login = True
            self._timer = loop.call_later(listener.config.auth_timeout_s, self._login_timed_out)
            return
        self._arm_idle(loop)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.listener.read_buffer  # shared: each read is copied out in buffer_updated

    def buffer_updated(self, nbytes: int) -> None:
        # The per-read path: as few Python calls as the usual read allows (each costs ~0.1 µs, and a
        # device sending a line at a time makes a read, and often a loop turn, per line).
        listener = self.listener
        data = listener.read_buffer[:nbytes].tobytes()
        self.last_read = listener.loop_time()
        if self.in_flight or self.held or self.writing_paused:
            self.held.append(data)
            self._pause()
            return
        try:
            self._data(data)
        except Exception:
            log.exception("tcp connection failed", extra={"listener": listener.config.name, "peer": self.peer})
            self.close()

    def eof_received(self) -> bool | None:
        self._guarded(self._end)
        return None if self._tls else True  # keep the write side open for the last answers (not under TLS)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._guarded(self._next)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError):  # a TLS alert or a broken record after the handshake: the peer's doing
            log.info("tls error; closing tcp connection",
                     extra={"listener": self.listener.config.name, "peer": self.peer, "error": str(exc)})
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.admitted:
            self.admitted = False
            self.listener.connection_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # -- reading ----------------------------------------------------------------------------------

    def _guarded(self, step: Any, *args: Any) -> None:
        """Run a step; any failure is logged and closes this connection only."""
        try:
            step(*args)
        except Exception:
            log.exception("tcp connection failed", extra={"listener": self.listener.config.name, "peer": self.peer})
            self.close()

    def _data(self, data: bytes) -> None:
        items = self.framer.feed(data)
        if self.login:
            if not items:
                return
            rest = self._log_in(items)
            if rest is None:
                return
            items = rest
        if not items:
            return
        # _submit inlined for the usual read (a call less per read)
        stream = self.stream
        first = stream.line_no + 1  # the number of items[0]
        lines = stream.lines(items)
        if lines is None or self.ack or not lines:
            self._submitted(items, lines, first)
            return
        listener = self.listener
        self.in_flight = True
        listener.turns.submit(listener.source, lines, int(listener.clock() * 1000), sum(map(len, lines)),
                              stream.columns, False, self._on_stored)

    def _end(self) -> None:
        """End of stream: write the unterminated last line (once what is held is written), then close."""
        if self.ended:
            return
        self.ended = True
        if self.login:
            auth = self.listener.authenticator
            assert auth is not None
            auth.failed(DOOR, self.address, None, "closed before AUTH")
            self.close()
            return
        self._next()

    def _next(self) -> None:
        """Go on after a read is done: the held reads in turn, then the end of stream, then reading."""
        while not self.in_flight and not self.writing_paused and self.transport is not None:
            if self.transport.is_closing():
                self.held.clear()
                return
            if self.held:
                self._data(self.held.pop(0))
                continue
            if self.ended:
                items = self.framer.end()  # (empty the second time)
                if items and not self.login:
                    self._submit(items)
                    if self.in_flight:
                        return
                self.close()
                return
            if self.paused:
                self.paused = False
                self.transport.resume_reading()
            return

    def _pause(self) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = True
            self.transport.pause_reading()

    def _submit(self, items: list[bytes | LineTooLong]) -> None:
        stream = self.stream
        first = stream.line_no + 1  # the number of items[0]
        self._submitted(items, stream.lines(items), first)

    def _submitted(self, items: list[bytes | LineTooLong], lines: list[bytes] | None, first: int) -> None:
        """Write a read's items, ``lines`` being ``LineStream.lines(items)`` (``first``: the number of items[0])."""
        listener = self.listener
        stream = self.stream
        arrival_ms = int(listener.clock() * 1000)
        if lines is None:  # a line over the limit or a broken CSV header: message by message, in a task
            self.in_flight = True
            listener.spawn(self._write_messages(items, arrival_ms))
            return
        if self.ack:
            numbers = None if len(lines) == len(items) else stream.numbers(items, first)
            self._ack_context = (numbers, first, stream.line_no)
        if not lines:
            if self.ack:
                self._answer(b"ACK %d\n" % stream.line_no)
            return
        self.in_flight = True
        listener.turns.submit(listener.source, lines, arrival_ms, sum(map(len, lines)), stream.columns, self.ack,
                              self._on_stored)

    def _stored(self, outcome: LineOutcome | None, error: BaseException | None) -> None:
        """The sink's word on the read in flight (``LineTurns``' callback)."""
        self.in_flight = False
        if error is not None:
            self._failed(error)
            return
        if self.ack:
            assert outcome is not None
            numbers, first, last = self._ack_context
            self._answer(line_acks(outcome, numbers, first, last, self.listener.sink.dead_letter_topic))
        if self.held or self.ended or self.paused:  # else ``_next`` has nothing to do: reading goes on
            self._guarded(self._next)

    async def _write_messages(self, items: list[bytes | LineTooLong], arrival_ms: int) -> None:
        listener = self.listener
        sink = listener.sink
        stream = self.stream
        messages, numbers = stream.messages(items, arrival_ms)
        try:
            if self.ack:
                outcomes = await sink.write(listener.source, messages)
                self._answer(ack_lines(outcomes, numbers, stream.line_no, sink.dead_letter_topic))
            else:
                await sink.ingest(listener.source, messages)
        except Exception as exc:
            self.in_flight = False
            self._failed(exc)
            return
        self.in_flight = False
        self._guarded(self._next)

    def _failed(self, error: BaseException) -> None:
        config = self.listener.config
        if isinstance(error, SinkError):
            log.error("tcp batch not stored; closing connection",
                      extra={"listener": config.name, "peer": self.peer, "error": str(error)})
            if self.ack:
                self._answer(f"FATAL {one_line(str(error))}\n".encode())
        elif not isinstance(error, asyncio.CancelledError):
            log.error("tcp connection failed", exc_info=error, extra={"listener": config.name, "peer": self.peer})
        self.close()

    def _answer(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        """Close once the answers written so far are sent (``Transport.close`` flushes them)."""
        self.held.clear()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def stop(self) -> None:
        """The listener stops: read nothing more; what is in flight is finished and answered, then closed."""
        self._pause()
        self._guarded(self._end)

    # -- login and idle ---------------------------------------------------------------------------

    def _log_in(self, items: list[bytes | LineTooLong]) -> list[bytes | LineTooLong] | None:
        """Check the AUTH line (``items[0]``); the lines behind it, or None when refused (then closed)."""
        auth = self.listener.authenticator
        assert auth is not None
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
            auth.failed(DOOR, self.address, user, str(exc))
            self._refuse(AUTH_FAILED)
            return None
        auth.succeeded(DOOR)
        self.login = False
        if self._timer is not None:
            self._timer.cancel()
        self._arm_idle(asyncio.get_running_loop())
        self.stream.line_no = 1  # the AUTH line
        if not self._may_write(principal):
            return None
        if self.ack:
            self._answer(b"ACK 1\n")
        return rest

    def _may_write(self, principal: Principal) -> bool:
        """The ACLs' word on this login (checked once, at login): refused, ``FATAL not authorized`` and the
        connection closed before any line is stored (the refusal is audited by the authorizer)."""
        may_write = self.listener.may_write
        if may_write is None or may_write(principal, self.address):
            return True
        self._refuse(NOT_AUTHORIZED)
        return False

    def _refuse(self, answer: bytes) -> None:
        self.login = False
        self._answer(answer)
        self.close()

    def _login_timed_out(self) -> None:
        self._timer = None
        if not self.login:
            return
        auth = self.listener.authenticator
        assert auth is not None
        auth.failed(DOOR, self.address, None, f"no AUTH line within {self.listener.config.auth_timeout_s:g} s")
        self._refuse(AUTH_FAILED)

    def _arm_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        idle = self.listener.config.idle_timeout_s
        if idle > 0:
            self._timer = loop.call_at(self.last_read + idle, self._idle_check)

    def _idle_check(self) -> None:
        """The idle timer: closes a connection that read nothing for ``idle_timeout_s`` (and has nothing in
        flight); otherwise re-armed from its last read."""
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        idle = self.listener.config.idle_timeout_s
        if self.in_flight or self.held or loop.time() - self.last_read < idle:
            if self.in_flight or self.held:
                self.last_read = loop.time()
            self._timer = loop.call_at(self.last_read + idle, self._idle_check)
            return
        log.info("closing idle tcp connection", extra={"listener": self.listener.config.name, "peer": self.peer})
        with contextlib.suppress(Exception):
            self.close()
