"""One Kafka client connection: a reader, a dispatcher and a sender task around a ``FrameAssembler``.

The socket is read by ``KafkaStreamProtocol`` (an ``asyncio.BufferedProtocol``): each read lands in a
buffer the ``FrameAssembler`` hands out, so a large Produce request goes from the kernel into its own
frame buffer with no copy in user space (a ``StreamReader`` copied every byte three to four times:
the event loop's bytes, the reader's buffer, ``read()``, the join of a frame's chunks).

Rules:
- The reader keeps reading while earlier requests are pending and queues whole frames, in order. It
  pauses (backpressure) while ``PIPELINE_DEPTH`` requests or ``READ_AHEAD_BYTES`` are queued (checked
  when a frame completes, so one request of any allowed size is always read whole). The bound is in
  bytes, not requests, so that the frames alive at once fit the listener's ``FramePool``: read further
  ahead, 1 MB Produce requests each took fresh pages (bench/RESULTS.md); the socket's own buffer keeps
  the client sending meanwhile.
- The dispatcher handles one request at a time, in arrival order (Kafka's per-connection ordering: a
  request is handled only after the previous one was). Produce appends at dispatch and leaves its wait
  for durability to the sender, so pipelined produces keep their order and share fsyncs.
- The sender writes the answers in request order (acks=0 produces have none).
- End of stream from the peer cancels whatever is still pending (a long-poll Fetch, a JoinGroup
  waiting for its rebalance, a Produce's wait for its fsync — its append is already done) and drops
  the socket at once: a client that went away never pins a socket or its fd.
- A frame that cannot be framed (negative or oversized length, truncated at end of stream) closes the
  connection at once; a request that cannot be decoded is refused by the dispatcher: the answers to
  the requests before it still go out, then the connection closes. Either is logged once (WARNING).
- Idle (Kafka's ``connections.max.idle.ms``): no byte read or written for that long closes the
  connection, whatever is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from broker.protocol.kafka import FrameAssembler, FrameError, FramePool, RequestHeader, encode_response_parts
from broker.server.handlers_common import ConnectionInfo
from broker.server.stats import KafkaStats

__all__ = ["PIPELINE_DEPTH", "READ_AHEAD_BYTES", "CloseConnection", "KafkaConnection", "KafkaStreamProtocol"]

log = logging.getLogger("broker.server.kafka")

PIPELINE_DEPTH = 64  # requests read ahead of the dispatcher before reading pauses (backpressure)
# Complete frames held unread (by the protocol, then again by the dispatcher's queue) that pause reading.
# Twice this plus the frame being dispatched and the one being read stay under FramePool's default.
READ_AHEAD_BYTES = 4 * 1024 * 1024
_DRAIN_ABOVE = 4 * 1024 * 1024  # unsent response bytes after which the sender waits for the socket
_CLOSE_GRACE_S = 5.0  # time for a refused client to read the answers sent before the close

Response = tuple[RequestHeader | None, Any]  # (header, body or awaitable) or (None, raw frame bytes)
Frame = bytes | memoryview  # a large frame arrives as a read-only view of its own buffer
Dispatch = Callable[[Frame, ConnectionInfo], Awaitable[Response]]


class CloseConnection(Exception):
    """Raised by the dispatch callable: stop serving this connection (the cause is already logged).

    ``answer``, if given, is sent before the close (a refused SASL login hears why, as in Kafka)."""

    def __init__(self, answer: Response | None = None) -> None:
        super().__init__()
        self.answer = answer


class KafkaStreamProtocol(asyncio.BufferedProtocol):
    """The socket side of one Kafka connection: reads into a ``FrameAssembler``'s buffers, keeps the
    frames until ``read_frames`` takes them (pausing the socket while it holds ``PIPELINE_DEPTH`` frames
    or ``READ_AHEAD_BYTES``), and gives the ``asyncio.StreamWriter`` the connection answers through its
    write flow control: ``_drain_helper`` and ``_get_close_waiter``, what ``StreamWriter.drain`` and
    ``wait_closed`` call, as in ``asyncio.streams.FlowControlMixin``. Not that mixin itself: it is an
    ``asyncio.Protocol``, and uvloop's TLS transport then feeds ``data_received`` instead of the buffers."""

    def __init__(
        self,
        on_connect: Callable[[KafkaStreamProtocol, asyncio.StreamWriter], Coroutine[Any, Any, None]],
        max_request_bytes: int,
        loop: asyncio.AbstractEventLoop,
        pool: FramePool | None = None,
    ) -> None:
        self._event_loop = loop
        self._writing_paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self._lost = False
        self._on_connect = on_connect
        self._assembler = FrameAssembler(max_request_bytes, pool)
        self._hold_bytes = READ_AHEAD_BYTES
        self._frames: deque[Frame] = deque()
        self._held = 0
        self._eof = False
        self._error: FrameError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._over_ssl = False
        self._task: asyncio.Task[None] | None = None
        self.last_read = loop.time()  # the idle timer's clock: a slow large request is activity

    @property
    def pending_bytes(self) -> int:
        """Bytes of a frame not yet complete (at end of stream: a truncated frame)."""
        return self._assembler.pending_bytes

    def limit_frames(self, max_bytes: int, limit_name: str) -> None:
        """Frames whose size prefix is read from now on are refused above ``max_bytes`` (a lower limit before
        the SASL login, lifted once logged in)."""
        self._assembler.max_frame_bytes = max_bytes
        self._assembler.limit_name = limit_name

    async def read_frames(self) -> list[Frame]:
        """The frames received since the last call, waiting for at least one; [] at end of stream.
        Raises the ``FrameError`` that made the stream untrustworthy."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._eof:
                return []
            self._waiter = self._event_loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error  # a stream that broke framing is closed at once, frames held or not
        frames = list(self._frames)
        self._frames.clear()
        self._held = 0
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        return frames

    # -- asyncio protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._over_ssl = transport.get_extra_info("sslcontext") is not None
        writer = asyncio.StreamWriter(self._transport, self, None, self._event_loop)
        self._task = self._event_loop.create_task(self._on_connect(self, writer))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._assembler.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.last_read = self._event_loop.time()
        try:
            frames = self._assembler.received(nbytes)
        except FrameError as exc:
            self._error = exc
            self._pause_reading()
            self._wake()
            return
        if frames:
            self._frames.extend(frames)
            self._held += sum(map(len, frames))
            if self._held >= self._hold_bytes or len(self._frames) >= PIPELINE_DEPTH:
                self._pause_reading()
            self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return not self._over_ssl  # as StreamReaderProtocol: keep a plain socket open for the answers

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._release_drains(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._release_drains(exc)
        self._eof = True
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    # -- what asyncio.StreamWriter asks of its protocol ---------------------------------------

    async def _drain_helper(self) -> None:
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = self._event_loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed

    def _release_drains(self, exc: Exception | None) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._transport.is_closing():
            self._reading_paused = True
            self._transport.pause_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


_CLOSE: Any = object()  # queued by the dispatcher after a refused request: answer what came before, then close


class KafkaConnection:
    """Serves one accepted socket until the peer leaves, a request is refused or it sits idle."""

    def __init__(
        self,
        stream: KafkaStreamProtocol,
        writer: asyncio.StreamWriter,
        conn: ConnectionInfo,
        *,
        dispatch: Dispatch,
        stats: KafkaStats,
        max_idle_ms: int,
    ) -> None:
        self.stream = stream
        self.writer = writer
        self.conn = conn
        self._dispatch = dispatch
        self._stats = stats
        self._idle_s = max_idle_ms / 1000 if max_idle_ms > 0 else None
        self._requests: asyncio.Queue[Frame] = asyncio.Queue()
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._responses: asyncio.Queue[Response] = asyncio.Queue(PIPELINE_DEPTH)
        self._in_flight = 0  # requests read and not yet answered (or found to need no answer)
        self._last_activity = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reading: asyncio.Task[None] | None = None
        self._graceful = False  # the sender ended after a refused request: let its answers drain

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._last_activity = loop.time()
        reading = self._reading = asyncio.create_task(self._read_loop())
        dispatching = asyncio.create_task(self._dispatch_loop())
        sending = asyncio.create_task(self._send_loop())
        if self._idle_s is not None:
            self._idle_timer = loop.call_at(self._last_activity + self._idle_s, self._check_idle)
        try:
            await asyncio.wait((reading, sending), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            tasks = (reading, dispatching, sending)
            for task in tasks:
                task.cancel()
            if self._in_flight:
                self._stats.requests_cancelled += self._in_flight
                log.debug("Kafka connection ended with requests pending; their answers are dropped",
                          extra={"peer": self.conn.peer_host, "pending": self._in_flight})
            # A second cancellation (shutdown) only cuts this wait short: the socket is still closed below.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
            for task in tasks:
                self._log_failure(task)
            await self._close_socket()

    # -- the three tasks -------------------------------------------------------------------

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        budget = READ_AHEAD_BYTES
        while True:
            try:
                frames = await self.stream.read_frames()
            except FrameError as exc:
                self._stats.closed_bad_input += 1
                log.warning(f"closing Kafka connection: {exc}", extra={"peer": self.conn.peer_host})
                return
            self._last_activity = loop.time()
            if not frames:
                if self.stream.pending_bytes:
                    log.warning("closing Kafka connection: truncated frame at end of stream",
                                extra={"peer": self.conn.peer_host, "pending_bytes": self.stream.pending_bytes})
                return
            for frame in frames:
                self._in_flight += 1
                self._queued_bytes += len(frame)
                self._requests.put_nowait(frame)
                if self._queued_bytes >= budget or self._requests.qsize() >= PIPELINE_DEPTH:
                    self._room.clear()
                    await self._room.wait()
            del frames, frame  # not held while waiting: a handled frame's buffer takes the next one

    async def _dispatch_loop(self) -> None:
        while True:
            frame = await self._requests.get()
            self._queued_bytes -= len(frame)
            self._room.set()
            try:
                response = await self._dispatch(frame, self.conn)
                del frame  # handled: its buffer may take the next large frame (FrameAssembler)
            except CloseConnection as close:
                if close.answer is None:
                    self._in_flight -= 1
                else:
                    await self._responses.put(close.answer)
                await self._responses.put(_CLOSE)
                return
            except Exception:  # even the error answer failed: logged once here, the connection ends
                log.exception("Kafka request failed; closing the connection", extra={"peer": self.conn.peer_host})
                self._in_flight -= 1
                await self._responses.put(_CLOSE)
                return
            await self._responses.put(response)

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        writer = self.writer
        queue = self._responses
        while True:
            response = await queue.get()
            if response is _CLOSE:
                self._graceful = True
                return
            header, item = response
            if inspect.isawaitable(item):
                try:
                    item = await item
                except CloseConnection:  # the answer is a closed socket (a failed acks=0 produce, as Kafka)
                    self._in_flight -= 1
                    self._graceful = True  # the answers before it are written; then the socket closes
                    return
            self._in_flight -= 1
            if item is None:
                continue  # acks=0
            if writer.transport.is_closing():
                return  # the peer reset meanwhile: uvloop raises on writes to a closed transport
            if header is None:
                writer.write(item)
            else:
                self._stats.count_response(item)
                writer.writelines(encode_response_parts(header, item))
            self._last_activity = loop.time()
            if writer.transport.get_write_buffer_size() > _DRAIN_ABOVE or queue.empty():
                await writer.drain()
                self._last_activity = loop.time()

    # -- endings ---------------------------------------------------------------------------

    def _check_idle(self) -> None:
        assert self._idle_s is not None
        loop = asyncio.get_running_loop()
        due = max(self._last_activity, self.stream.last_read) + self._idle_s
        if loop.time() < due:
            self._idle_timer = loop.call_at(due, self._check_idle)
            return
        self._idle_timer = None
        self._stats.closed_idle += 1
        log.debug("closing idle Kafka connection",
                  extra={"peer": self.conn.peer_host, "idle_ms": int(self._idle_s * 1000)})
        if self._reading is not None:
            self._reading.cancel()

    def _log_failure(self, task: asyncio.Task[None]) -> None:
        if not task.done() or task.cancelled():
            return  # not done: serve() was cancelled again while its tasks were ending (shutdown)
        exc = task.exception()
        if exc is None or isinstance(exc, ConnectionError):
            return
        log.error("Kafka connection failed; closing it", exc_info=exc, extra={"peer": self.conn.peer_host})

    async def _close_socket(self) -> None:
        writer = self.writer
        if not self._graceful:
            writer.transport.abort()  # the peer left, sat idle or broke framing: nothing more to send
            return
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), _CLOSE_GRACE_S)
        except (Exception, asyncio.CancelledError):
            writer.transport.abort()
