"""One write per source per event-loop turn: the reads of many connections that arrive together share it.

A line source's reads (``IngestSink.ingest_lines`` / ``write_lines``: one TCP read each) are not written one
by one. The first read of a source in a turn opens the source's ``_Turn`` and schedules its write with
``call_soon``; every further read of that source before the write runs joins it. The write then runs once for
all of them (``line_writes.LineWrite``: one route, one RecordBatch per partition, one append each), so a
hundred device connections sending a line each cost about one append per partition instead of a hundred.

Each caller still returns only when its own lines are durable (or raises the write's ``SinkError``: then
nothing of the turn is acknowledged), and gets what became of its own lines; its lines keep their order
and their arrival time. The write runs in the ``call_soon`` callback itself when it needs no waiting (the
budget has room, the flush policy makes nothing wait, no dead letters): no task per turn then; otherwise one
task finishes it. Backpressure is the sink's byte budget, reserved for the whole turn in FIFO order with
the sink's other writes (a turn is closed early when the next read would make it larger than the budget); a
caller cancelled while it waits leaves its lines in the write (they may be stored
and are not acknowledged).

Coalescing (``IngestSink.coalesce_s``, the ``ingest.coalesce_ms`` setting): a turn nobody waits on for an
answer (no read asks for its outcome: TCP without ack mode, files) is written at once unless the source's
previous write was small (fewer than ``SMALL_WRITE_LINES`` lines and ``SMALL_WRITE_BYTES`` bytes) and began
less than ``coalesce_s`` ago;
then it is written ``coalesce_s`` after that one began, with every read of the source that arrives
meanwhile. Devices trickling a line each then cost one write per ``coalesce_s`` instead of one per loop turn
(a turn's route, encoding, append and answers cost the same for one line as for fifty), and no line waits
longer than ``coalesce_s`` for it; a bulk sender's writes are large and never wait. A read that asks for its
outcome (ack mode) and joins a waiting turn has it written at once. Each connection still has one read in
flight, so a waiting turn holds back its connections' next reads (the kernel buffers them), as a slow write
does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, overload

from ingest.line_writes import LineOutcome, LineWrite
from ingest.routing import SourceRef

if TYPE_CHECKING:
    from ingest.sink import IngestSink

__all__ = ["LineTurns", "Notify"]

log = logging.getLogger("ingest.sink")

# A read's callback instead of a future: (its outcome or None, None) once durable, (None, the failure) if not.
Notify = Callable[[LineOutcome | None, BaseException | None], None]

SMALL_WRITE_LINES = 64  # a write of fewer lines and bytes than these makes the source's next turn wait for
SMALL_WRITE_BYTES = 32 * 1024  # coalescing (a file of long lines is not held back a chunk at a time)

class _Turn:
    """The reads of one source gathered in one loop turn: their lines in order, and per read its span and
    the future its caller waits on (or its callback)."""

    __slots__ = ("arrivals", "charge", "columns", "lines", "nbytes", "outcomes", "spans", "timer", "waiters")

    def __init__(self, columns: tuple[str, ...] | None) -> None:
        self.columns = columns  # a CSV stream's header: reads of other headers are other turns
        self.lines: list[bytes] = []
        self.arrivals: list[tuple[int, int]] = []  # (first line, arrival ms) of each run of one arrival time
        self.spans: list[tuple[int, int]] = []  # per read: its lines' [start, end)
        self.waiters: list[asyncio.Future[LineOutcome | None] | Notify] = []
        self.nbytes = 0
        self.charge = 0  # of the sink's pending-bytes budget
        self.outcomes = False  # some read wants its outcome
        self.timer: asyncio.TimerHandle | None = None  # the write's, when it waits for coalescing


class LineTurns:
    def __init__(self, sink: IngestSink) -> None:
        self.sink = sink
        self._open: dict[tuple[SourceRef, tuple[str, ...] | None], _Turn] = {}
        self._last: dict[SourceRef, tuple[float, bool]] = {}  # per source: its last write's start (loop time), small
        self._tasks: set[asyncio.Task[None]] = set()

    @overload
    def submit(self, source: SourceRef, lines: list[bytes], arrival_ms: int, nbytes: int,
               columns: tuple[str, ...] | None, outcome: bool) -> asyncio.Future[LineOutcome | None]: ...

    @overload
    def submit(self, source: SourceRef, lines: list[bytes], arrival_ms: int, nbytes: int,
               columns: tuple[str, ...] | None, outcome: bool, notify: Notify) -> None: ...

    def submit(self, source: SourceRef, lines: list[bytes], arrival_ms: int, nbytes: int,
               columns: tuple[str, ...] | None, outcome: bool,
               notify: Notify | None = None) -> asyncio.Future[LineOutcome | None] | None:
        """Add a read's lines to this turn's write of ``source`` (of the reads with the same ``columns``: a
        CSV stream's header). Once they are durable the future is done (their ``LineOutcome`` when
        ``outcome``, else None; or the write's failure); with ``notify`` no future: ``notify(outcome, None)``
        or ``notify(None, failure)`` is called instead (a protocol's read, no future per read)."""
        slot = (source, columns)
        turn = self._open.get(slot)
        charge = self.sink.line_charge(len(lines), nbytes)
        if turn is None or turn.charge + charge > self.sink.max_pending_bytes:
            # a new turn; also when this read would make the turn larger than the whole budget (a turn is
            # reserved at once: the budget bounds what is pending only if each turn fits in it)
            turn = self._open[slot] = _Turn(columns)
            loop = asyncio.get_running_loop()
            coalesce = self.sink.coalesce_s
            last = self._last.get(source) if coalesce > 0 and not outcome else None
            if last is not None and last[1] and last[0] + coalesce > loop.time():
                turn.timer = loop.call_at(last[0] + coalesce, self._run, source, turn)
            else:
                loop.call_soon(self._run, source, turn)
        elif outcome and turn.timer is not None:  # someone waits for this one's answer: no coalescing
            turn.timer.cancel()
            turn.timer = None
            asyncio.get_running_loop().call_soon(self._run, source, turn)
        turn_lines = turn.lines
        start = len(turn_lines)
        arrivals = turn.arrivals
        if not arrivals or arrivals[-1][1] != arrival_ms:
            arrivals.append((start, arrival_ms))
        turn_lines += lines
        turn.spans.append((start, len(turn_lines)))
        turn.nbytes += nbytes
        turn.charge += charge
        if outcome:
            turn.outcomes = True
        if notify is not None:
            turn.waiters.append(notify)
            return None
        future: asyncio.Future[LineOutcome | None] = asyncio.get_running_loop().create_future()
        turn.waiters.append(future)
        return future

    def _run(self, source: SourceRef, turn: _Turn) -> None:
        slot = (source, turn.columns)
        if self._open.get(slot) is turn:
            del self._open[slot]
        turn.timer = None
        sink = self.sink
        if sink.coalesce_s > 0:
            small = len(turn.lines) < SMALL_WRITE_LINES and turn.nbytes < SMALL_WRITE_BYTES
            self._last[source] = (asyncio.get_running_loop().time(), small)
        charge = turn.charge
        write = LineWrite(sink, source, turn.lines, turn.arrivals, turn.nbytes, turn.columns, outcomes=turn.outcomes)
        if not sink.has_room(charge):
            self._spawn(self._finish(source, turn, charge, write, reserved=False))
            return
        # The budget has room: ``start`` does what needs no waiting. When that is all (the usual turn), the
        # write began and ended in this callback: its budget and in-flight count would be taken and given back
        # with nothing in between to see them, so neither is touched; otherwise they are taken now (the
        # budget still has room: nothing ran in between) and a task finishes the write.
        try:
            pending = write.start()
        except BaseException as exc:
            self._answer(turn, None, exc)
            return
        if not pending:
            write.done()
            self._answer(turn, write, None)
            return
        reserved = sink.try_reserve(charge)
        assert reserved
        sink.health.add_in_flight(source, len(turn.lines))
        self._spawn(self._finish(source, turn, charge, write, reserved=True))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, source: SourceRef, turn: _Turn, charge: int, write: LineWrite, *, reserved: bool) -> None:
        """The rest of a turn's write in a task: the budget when it had no room, then what ``start`` left."""
        sink = self.sink
        if not reserved:
            try:
                await sink._reserve(source, charge)
            except BaseException as exc:  # cancelled (the loop is closing): nothing was written
                self._answer(turn, None, exc)
                raise
            sink.health.add_in_flight(source, len(turn.lines))
        try:
            if reserved or write.start():  # (reserved: ``_run`` started it)
                await write.finish()
        except BaseException as exc:
            self._settle(source, turn, charge, None, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self._settle(source, turn, charge, write, None)

    def _settle(self, source: SourceRef, turn: _Turn, charge: int, write: LineWrite | None,
                error: BaseException | None) -> None:
        """Release the turn's budget and answer every read: its outcome, or the write's failure."""
        sink = self.sink
        sink.health.add_in_flight(source, -len(turn.lines))
        sink._release(charge)
        if write is not None:
            write.done()
        self._answer(turn, write, error)

    @staticmethod
    def _answer(turn: _Turn, write: LineWrite | None, error: BaseException | None) -> None:
        if error is None and not turn.outcomes:
            # The usual turn (nobody asked for outcomes, nothing failed): each reader is told None.
            for waiter in turn.waiters:
                if not isinstance(waiter, asyncio.Future):
                    try:
                        waiter(None, None)
                    except Exception:  # one reader's failure is its own: the others are answered all the same
                        log.exception("a line reader failed on its write's outcome")
                elif not waiter.done():  # (done: its caller was cancelled)
                    waiter.set_result(None)
            return
        for (start, end), waiter in zip(turn.spans, turn.waiters, strict=True):
            result = write.outcome(start, end) if write is not None and turn.outcomes else None
            if not isinstance(waiter, asyncio.Future):
                try:
                    waiter(result, error)
                except Exception:  # one reader's failure is its own: the others are answered all the same
                    log.exception("a line reader failed on its write's outcome")
            elif waiter.done():  # its caller was cancelled
                continue
            elif isinstance(error, asyncio.CancelledError):
                waiter.cancel()
            elif error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(result)
