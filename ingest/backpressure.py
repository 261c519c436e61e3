"""Backpressure on the ingest write path: the pending-bytes budget of ``IngestSink`` (sink.py).

``write`` first reserves the payload bytes of its messages from a budget of
``max_pending_bytes`` (bytes accepted but not yet durable). When the budget is used up, callers wait
in FIFO order — a listener that awaits ``write`` before reading more simply stops reading its socket,
so the sender's TCP window fills. ``saturated`` and ``wait_writable()`` let listeners that read
independently of their writes (MQTT, pipelined readers) pause their reads too. One call larger than
the whole budget is let through alone, so nothing deadlocks.
"""

from __future__ import annotations

import asyncio
import collections

from ingest.health import HealthRegistry
from ingest.routing import SourceRef

__all__ = ["MESSAGE_OVERHEAD", "WriteBudget"]

MESSAGE_OVERHEAD = 64  # bytes charged per message beyond its payload (headers, bookkeeping)


class WriteBudget:
    """The budget of bytes accepted but not yet durable, a base of ``IngestSink``: what the writes in
    progress hold, the writers waiting for room (FIFO), and whether listeners should pause reading."""

    def __init__(self, health: HealthRegistry, max_pending_bytes: int) -> None:
        if max_pending_bytes <= 0:
            raise ValueError("max_pending_bytes must be positive")
        self.health = health
        self.max_pending_bytes = max_pending_bytes
        self._pending = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._writable = asyncio.Event()
        self._writable.set()

    @property
    def pending_bytes(self) -> int:
        """Bytes accepted by ``write`` calls that have not returned yet (not yet durable)."""
        return self._pending

    @property
    def saturated(self) -> bool:
        """True while new writes would wait: listeners should stop reading their sockets."""
        return self._pending >= self.max_pending_bytes or bool(self._waiters)

    async def wait_writable(self) -> None:
        """Return once the sink has room again (immediately when it has)."""
        while self.saturated:
            self._writable.clear()
            await self._writable.wait()

    def _update_writable(self) -> None:
        if self.saturated:
            self._writable.clear()
        else:
            self._writable.set()

    async def _reserve(self, source: SourceRef, nbytes: int) -> None:
        if self.try_reserve(nbytes):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, future)
        self._waiters.append(entry)
        self._update_writable()
        self.health.pause_started(source)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(nbytes)  # granted just as we were cancelled: give it back
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()
            raise
        finally:
            self.health.pause_ended(source)

    def _release(self, nbytes: int) -> None:
        self._pending -= nbytes
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            nbytes, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self._pending + nbytes > self.max_pending_bytes and self._pending > 0:
                break
            self._waiters.popleft()
            self._pending += nbytes
            future.set_result(None)
        self._update_writable()

    @staticmethod
    def line_charge(lines: int, nbytes: int) -> int:
        """What ``lines`` lines of ``nbytes`` bytes in all take from the pending-bytes budget."""
        return MESSAGE_OVERHEAD * lines + nbytes

    def has_room(self, nbytes: int) -> bool:
        """Whether ``try_reserve(nbytes)`` would reserve now (``_reserve`` would not wait)."""
        return not self._waiters and (self._pending + nbytes <= self.max_pending_bytes or self._pending == 0)

    def try_reserve(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the budget now if that needs no waiting (``_reserve`` would not wait)."""
        if not self.has_room(nbytes):
            return False
        self._pending += nbytes
        self._update_writable()
        return True
