"""Idle plain-TCP MQTT connections without an asyncio transport: one epoll watches all of their sockets.

An asyncio transport costs ~1.3 KB per socket (uvloop's; asyncio's own more), which is most of what an idle
MQTT connection costs. A *parked* connection holds only its socket's file descriptor, registered in the
``ParkingLot``'s epoll (kernel memory); the lot's one epoll descriptor is the only thing the event loop
watches for all of them. Its ``ParkedSocket`` is the connection's ``ByteTransport`` meanwhile: reads go
through the connection's shared read buffer as a transport's would, and writes go straight to the socket.

Rules
-----
1. Plain-TCP doors accept their sockets themselves (``ParkingLot.serve``): every new connection starts
   parked (TLS and WebSocket doors keep transports: their framing lives in the transport).
2. Unparking: a parked connection gets a transport (``loop.connect_accepted_socket`` on the same
   descriptor) when it becomes busy — one read of ``BUSY_READ_BYTES`` or more, or more than
   ``BUSY_READS`` reads between two sweeps of the hub, also when that read paused reads (backpressure;
   the transport starts paused) — or when a write does not fit the socket's send
   buffer (the transport then buffers the rest and applies backpressure). Until the transport is made,
   writes queue in order and pause/resume/close requests are kept; all are handed to the transport.
3. Parking: a connection with a transport is parked again by the hub's sweep once it has read nothing for
   ``park_after_s``, has nothing left to write and its reads are not paused (``MqttConnection.check_timeout``):
   its descriptor is duplicated, the transport is detached from the connection and closed — the socket
   stays open through the duplicate, so the client sees no FIN or RST and no byte is lost (unread bytes
   wait in the kernel; epoll is level-triggered).
4. Pausing reads of a parked socket removes it from the epoll; resuming adds it back.
5. A parked socket reports its end like a transport: ``connection_lost`` on a later loop turn, once.
6. Linux only (``select.epoll``); elsewhere ``ParkingLot.available()`` is False and every door uses
   transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import socket
from collections.abc import Callable
from typing import Any

from ingest.mqtt.hub_config import HubStats

__all__ = ["BUSY_READS", "BUSY_READ_BYTES", "ParkedSocket", "ParkingLot"]

log = logging.getLogger("ingest.mqtt")

BUSY_READ_BYTES = 8 * 1024  # one read this large: a busy client (rule 2)
BUSY_READS = 8  # more reads than this between two sweeps (about a second): a busy client
_EVENTS_PER_TURN = 512  # epoll events handled per loop turn (level-triggered: the rest come next turn)
_ACCEPTS_PER_TURN = 128
_ACCEPT_RETRY_S = 1.0  # out of file descriptors: accepting pauses this long (as asyncio's own server does)

_PARKED, _PAUSED, _UNPARKING, _CLOSED = 0, 1, 2, 3


class _Detached(asyncio.Protocol):
    """The protocol of a transport whose socket has been parked: nothing it reports matters any more."""

    def connection_lost(self, exc: Exception | None) -> None:
        pass


_DETACHED = _Detached()


class ParkedSocket:
    """A parked connection's ``ByteTransport`` (``session.ByteTransport``) over its bare descriptor."""

    __slots__ = ("_state", "fd", "lot", "pending", "protocol", "reads")

    def __init__(self, lot: ParkingLot, fd: int, protocol: asyncio.BufferedProtocol) -> None:
        self.lot = lot
        self.fd = fd
        self.protocol = protocol
        self.pending: list[bytes] | None = None  # writes waiting for the transport (rule 2)
        self.reads = 0  # reads since the last sweep
        self._state = _PARKED

    # ------------------------------------------------------------------ ByteTransport
    def write(self, data: bytes) -> None:
        if self._state == _CLOSED:
            return
        pending = self.pending
        if pending is not None:
            pending.append(data)
            return
        try:
            sent = os.write(self.fd, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:  # the client is gone (EPIPE, ECONNRESET)
            self._lost(exc)
            return
        if sent < len(data):  # the send buffer is full: the transport keeps the rest (rule 2)
            self.pending = [data[sent:]]
            self.unpark()

    def close(self) -> None:
        state = self._state
        if state == _CLOSED:
            return
        if state == _UNPARKING:  # the transport sends what is pending, then closes
            self.pending = [*(self.pending or ()), _CLOSE]
            return
        self._lost(None)

    def is_closing(self) -> bool:
        return self._state == _CLOSED or (self._state == _UNPARKING and _CLOSE in (self.pending or ()))

    def pause_reading(self) -> None:
        if self._state == _PARKED:
            self._state = _PAUSED
            self.lot.unwatch(self.fd)
        elif self._state == _UNPARKING:
            self.pending = [*(self.pending or ()), _PAUSE]

    def resume_reading(self) -> None:
        if self._state == _PAUSED:
            self._state = _PARKED
            self.lot.watch(self)
        elif self._state == _UNPARKING:
            self.pending = [*(self.pending or ()), _RESUME]

    def get_write_buffer_size(self) -> int:
        return sum(len(p) for p in self.pending or () if type(p) is bytes)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername" and self._state != _CLOSED:
            sock = socket.socket(fileno=self.fd)
            try:
                return sock.getpeername()
            except OSError:
                return default
            finally:
                sock.detach()
        return default

    # ------------------------------------------------------------------ the lot's side
    def readable(self) -> None:
        protocol = self.protocol
        buffer = protocol.get_buffer(-1)
        try:
            nbytes = os.readv(self.fd, [buffer])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # ECONNRESET ...
            self._lost(exc)
            return
        if not nbytes:  # the client's FIN
            if not protocol.eof_received():
                self.close()
            return
        protocol.buffer_updated(nbytes)
        self.reads += 1
        # also when that read paused reads (backpressure): a busy publisher is paused after most reads
        if self._state in (_PARKED, _PAUSED) and (nbytes >= BUSY_READ_BYTES or self.reads > BUSY_READS):
            self.unpark()

    def unpark(self) -> None:
        """Give the connection a transport on the same descriptor (rule 2)."""
        state = self._state
        if state == _PARKED:
            self.lot.unwatch(self.fd)
        elif state != _PAUSED:
            return
        pending = self.pending if self.pending is not None else []
        if state == _PAUSED:
            pending.append(_PAUSE)
        self.pending = pending
        self._state = _UNPARKING
        self.lot.unparked(self)

    def hand_over(self, transport: asyncio.Transport) -> bool:
        """The transport made by ``unpark`` is ready (its ``connection_made``): what waited goes to it, in
        order. True when its reads are to stay paused: uvloop starts reading after ``connection_made``
        whatever it was told there, so the caller pauses it again on the next loop turn if still wanted."""
        pending, self.pending = self.pending or [], None
        self._state = _CLOSED  # the transport owns the descriptor from now on
        paused = close = False
        for item in pending:
            if item is _CLOSE:
                close = True
            elif item is _PAUSE or item is _RESUME:
                paused = item is _PAUSE
            elif not close:
                transport.write(item)
        if close:
            transport.close()
            return False
        if paused:
            transport.pause_reading()
        return paused

    def wrap_failed(self, exc: Exception) -> None:
        self.pending = None
        self._state = _CLOSED
        self.protocol.connection_lost(exc)

    def _lost(self, exc: Exception | None) -> None:
        was = self._state
        self._state = _CLOSED
        self.pending = None
        if was == _PARKED:
            self.lot.unwatch(self.fd)
        if was != _UNPARKING:  # an unparking descriptor belongs to its new socket object
            os.close(self.fd)
            self.lot.left(self)
        asyncio.get_running_loop().call_soon(self.protocol.connection_lost, exc)


# markers among the pending writes of an unparking socket (never bytes: compared by identity)
_CLOSE: Any = object()
_PAUSE: Any = object()
_RESUME: Any = object()


class ParkingLot:
    """The epoll of every parked socket of one listener, and the accept loops of its plain-TCP doors."""

    def __init__(self, park_after_s: float, stats: HubStats) -> None:
        self.park_after_s = park_after_s  # rule 3
        self.stats = stats  # connections_parked, parks, unparks, accept_errors
        self._epoll: select.epoll | None = None
        self._sockets: dict[int, ParkedSocket] = {}  # fd -> parked socket being watched
        self._listening: list[socket.socket] = []
        self._wrapping: set[asyncio.Task[None]] = set()

    @staticmethod
    def available() -> bool:
        return hasattr(select, "epoll")

    def start(self) -> None:
        self._epoll = select.epoll()
        asyncio.get_running_loop().add_reader(self._epoll.fileno(), self._ready)

    async def serve(self, host: str, port: int, backlog: int,
                    connection: Callable[[], asyncio.BufferedProtocol]) -> int:
        """Listen on ``host``/``port`` (every address it resolves to, as ``loop.create_server``) and park each
        accepted socket with a new ``connection()`` (rule 1); returns the bound port."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        bound = port
        seen = set()
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address if not bound else (address[0], bound, *address[2:]))
                sock.listen(backlog)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            bound = sock.getsockname()[1]
            self._listening.append(sock)
            loop.add_reader(sock.fileno(), self._accept, sock, connection)
        return bound

    def _accept(self, listening: socket.socket, connection: Callable[[], asyncio.BufferedProtocol]) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up before we accepted it
                continue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: wait, then accept again
                self.stats.accept_errors += 1
                log.error("mqtt: accepting connections failed; retrying in %.0f s", _ACCEPT_RETRY_S,
                          extra={"error": str(exc), "errno": errno.errorcode.get(exc.errno or 0, exc.errno)})
                loop = asyncio.get_running_loop()
                loop.remove_reader(listening.fileno())
                loop.call_later(_ACCEPT_RETRY_S, self._resume_accepting, listening, connection)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            protocol = connection()
            parked = self._adopt(sock.detach(), protocol)
            protocol.connection_made(parked)  # type: ignore[arg-type]  # a ByteTransport, not a Transport

    def _resume_accepting(self, listening: socket.socket, connection: Callable[[], asyncio.BufferedProtocol]) -> None:
        if listening.fileno() >= 0:
            asyncio.get_running_loop().add_reader(listening.fileno(), self._accept, listening, connection)

    def _adopt(self, fd: int, protocol: asyncio.BufferedProtocol) -> ParkedSocket:
        parked = ParkedSocket(self, fd, protocol)
        self.stats.connections_parked += 1
        self.watch(parked)
        return parked

    def park(self, transport: asyncio.BaseTransport, protocol: asyncio.BufferedProtocol) -> ParkedSocket | None:
        """Take the socket of ``transport`` (rule 3): the transport is closed, the socket stays open."""
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            fd = os.dup(sock.fileno())
        except OSError:  # out of descriptors: it stays as it is
            return None
        transport.set_protocol(_DETACHED)
        transport.close()  # closes its descriptor; ours keeps the connection open
        self.stats.parks += 1
        return self._adopt(fd, protocol)

    def watch(self, parked: ParkedSocket) -> None:
        self._sockets[parked.fd] = parked
        if self._epoll is not None:
            self._epoll.register(parked.fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        if self._sockets.pop(fd, None) is not None and self._epoll is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def left(self, parked: ParkedSocket) -> None:
        self.stats.connections_parked -= 1

    def unparked(self, parked: ParkedSocket) -> None:
        self.stats.connections_parked -= 1
        self.stats.unparks += 1
        task = asyncio.ensure_future(self._wrap(parked))
        self._wrapping.add(task)
        task.add_done_callback(self._wrapping.discard)

    async def _wrap(self, parked: ParkedSocket) -> None:
        sock = socket.socket(fileno=parked.fd)
        try:
            # connection_made(transport) of the connection calls hand_over
            await asyncio.get_running_loop().connect_accepted_socket(lambda: parked.protocol, sock)
        except Exception as exc:
            log.error("mqtt: a parked connection could not get a transport; it is closed",
                      extra={"error": str(exc)})
            sock.close()
            parked.wrap_failed(exc)

    def _ready(self) -> None:
        epoll = self._epoll
        if epoll is None:
            return
        sockets = self._sockets
        for fd, _ in epoll.poll(0, _EVENTS_PER_TURN):
            parked = sockets.get(fd)
            if parked is not None:
                parked.readable()

    def stop_accepting(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._listening:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._listening = []

    async def close(self) -> None:
        """After the connections were shut down: wait for transports being made, then drop the epoll."""
        if self._wrapping:
            await asyncio.wait(list(self._wrapping), timeout=5.0)
        epoll, self._epoll = self._epoll, None
        if epoll is not None:
            asyncio.get_running_loop().remove_reader(epoll.fileno())
            epoll.close()
