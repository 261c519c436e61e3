"""What every device helper shares: a bounded local buffer, a sender task, reconnect with backoff.

State machine of the sender task::

    DISCONNECTED --open() ok--> CONNECTED --deliver() fails--> DISCONNECTED (after a backoff delay)
         ^   |                      |
         |   +--open() fails--> wait backoff (doubling from backoff_initial to backoff_max, with jitter)
         +-------- close() from any state --> CLOSED

Rules:
- ``send`` only appends to the buffer; it never touches the network, so a device's sampling loop is
  never held up by a slow or absent broker — unless the buffer is full and ``overflow="block"``.
- Items leave the buffer only once delivered: written and drained (plain mode) or acknowledged by the
  server after its durable append (ack mode). A batch cut short by a disconnect is sent again on the
  next connection, so delivery is at-least-once in ack mode.
- Overflow policy when the buffer is full: ``block`` (default: backpressure on the caller),
  ``drop_oldest`` (load shedding the caller asked for; counted in ``stats.dropped``) or ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal, Self

from clients.errors import BufferFullError, ClientClosedError

__all__ = ["BufferedDevice", "DeviceStats", "Overflow", "encode_payload"]

log = logging.getLogger("clients.devices")

Overflow = Literal["block", "drop_oldest", "error"]


@dataclass
class DeviceStats:
    queued: int = 0  # in the local buffer now (not yet delivered)
    sent: int = 0  # delivered (written, or acknowledged in ack mode)
    dropped: int = 0  # shed by overflow="drop_oldest"
    connects: int = 0
    disconnects: int = 0
    connected: bool = False
    last_error: str | None = None


def encode_payload(value: Any) -> bytes:
    """dict/list/number → compact JSON; str → UTF-8; bytes as they are."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


class BufferedDevice(ABC):
    def __init__(
        self,
        *,
        buffer_size: int = 10_000,
        overflow: Overflow = "block",
        max_batch: int = 500,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        name: str = "device",
    ) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.buffer_size = buffer_size
        self.overflow = overflow
        self.max_batch = max_batch
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.name = name
        self.stats = DeviceStats()
        self._buffer: deque[bytes] = deque()
        self._in_flight = 0  # items at the buffer's front being delivered now
        self._changed = asyncio.Condition()
        self._closing = asyncio.Event()
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what transports provide ------------------------------------------------------------

    @abstractmethod
    async def _open(self) -> None:
        """Connect; raise OSError (or a transport error) on failure."""

    @abstractmethod
    async def _deliver(self, items: list[bytes]) -> None:
        """Send ``items``; return once delivered (acknowledged in ack mode); raise on a broken link."""

    @abstractmethod
    async def _drop_connection(self) -> None:
        """Close the current connection, quietly."""

    _link_errors: tuple[type[BaseException], ...] = (OSError, ConnectionError, asyncio.IncompleteReadError)

    # -- public API -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sender task; it connects (and reconnects) in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sluice-device-{self.name}")

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def send(self, value: Any) -> None:
        """Queue one reading (dict → JSON, str, bytes). Applies the overflow policy when full."""
        if self._closing.is_set():
            raise ClientClosedError(f"device {self.name} is closed")
        payload = encode_payload(value)
        async with self._changed:
            while len(self._buffer) >= self.buffer_size:
                if self.overflow == "error":
                    raise BufferFullError(
                        f"device {self.name}: local buffer of {self.buffer_size} readings is full "
                        f"(broker unreachable?); raise buffer_size or use overflow='drop_oldest'"
                    )
                if self.overflow == "drop_oldest" and len(self._buffer) > self._in_flight:
                    del self._buffer[self._in_flight]
                    self.stats.dropped += 1
                    continue
                await self._changed.wait()
                if self._closing.is_set():
                    raise ClientClosedError(f"device {self.name} is closed")
            self._buffer.append(payload)
            self.stats.queued = len(self._buffer)
            self._changed.notify_all()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far has been delivered."""

        async def drained() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: not self._buffer)

        await asyncio.wait_for(drained(), timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Deliver what is buffered (up to ``timeout``), then disconnect. Undelivered readings stay counted
        in ``stats.queued``."""
        if self._task is not None and not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await self.flush(timeout)
        self._closing.set()
        async with self._changed:
            self._changed.notify_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._drop_connection()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the sender task --------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.backoff_initial
        while not self._closing.is_set():
            try:
                await self._open()
            except self._link_errors as exc:
                self.stats.last_error = str(exc) or type(exc).__name__
                log.debug("device connect failed", extra={"device": self.name, "error": self.stats.last_error})
                await self._sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = self.backoff_initial
            self.stats.connects += 1
            self.stats.connected = True
            self._connected.set()
            try:
                await self._pump()
            except self._link_errors as exc:
                self.stats.last_error = str(exc) or type(exc).__name__
                log.info("device link lost", extra={"device": self.name, "error": self.stats.last_error})
            finally:
                self.stats.connected = False
                self._connected.clear()
                self._in_flight = 0
                self.stats.disconnects += 1
                await self._drop_connection()
            await self._sleep(delay)

    async def _pump(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._buffer))
                batch = [self._buffer[i] for i in range(min(len(self._buffer), self.max_batch))]
                self._in_flight = len(batch)
            await self._deliver(batch)
            async with self._changed:
                for _ in range(len(batch)):
                    self._buffer.popleft()
                self._in_flight = 0
                self.stats.sent += len(batch)
                self.stats.queued = len(self._buffer)
                self._changed.notify_all()

    async def _sleep(self, delay: float) -> None:
        jittered = delay * (0.5 + random.random() / 2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), jittered)
