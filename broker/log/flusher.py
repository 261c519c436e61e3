"""When a partition's written bytes reach the disk: the flush policies and group commit.

Rules (one ``Flusher`` per partition):
- Every write (or other change that needs an fsync: a roll, a deleted segment) calls ``note_write()``,
  which bumps the *written* generation. A sync records the generation it started at and, once the
  fsync returns, marks everything up to it *durable*.
- ``always``: ``wait_durable()`` returns once the generation current at the call (or the one given,
  read earlier from ``written``) is durable. If no
  sync is running, one starts; if one is running, the caller waits for it to end and then for the
  next one, which covers every write made meanwhile. Concurrent appends thus share one fsync
  (group commit) and an fsync never runs twice at once for a partition.
- ``interval``: the first write after a sync arms a timer of ``flush_interval_ms``; when it fires a
  sync runs in the background. Appends never wait.
- ``os``: nothing is synced on a timer; ``kick()`` (called when a segment rolls, like Kafka) and
  ``flush()`` still sync, so a crash can only tear the active segment.
- A failed sync is reported to ``on_error`` and raised to the waiters; the partition then refuses
  further writes (after a failed fsync the kernel may have dropped the dirty pages, so retrying
  could report data as durable that is not).

The fsync itself runs in a worker thread (see ``SegmentPartitionLog._sync``): measured faster than
aiofiles for this path, see bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker.log.config import FlushPolicy

__all__ = ["Flusher"]

log = logging.getLogger("broker.log.flusher")


class Flusher:
    def __init__(
        self,
        policy: FlushPolicy,
        interval_ms: int,
        sync: Callable[[], Awaitable[None]],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.policy = policy
        self.interval_s = max(interval_ms, 0) / 1000
        self._sync = sync
        self._on_error = on_error
        self._written = 0
        self._durable = 0
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.syncs = 0  # how many fsync rounds ran (group commit shows as syncs << appends)

    @property
    def pending(self) -> bool:
        return self._durable < self._written

    @property
    def durable(self) -> int:
        """The write generation known to be on disk: ``wait_durable(g)`` for ``g <= durable`` returns at once."""
        return self._durable

    @property
    def written(self) -> int:
        """The current write generation: ``wait_durable(written)`` waits for exactly these writes."""
        return self._written

    def note_write(self) -> None:
        self._written += 1
        if self.policy is FlushPolicy.INTERVAL and self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (synchronous use): flush() or close() will sync
            self._timer = loop.call_later(self.interval_s, self._on_timer)

    async def wait_durable(self, target: int | None = None) -> None:
        """Return once every write noted before this call (or up to generation ``target``) is on disk."""
        if target is None:
            target = self._written
        while self._durable < target:
            task = self._task if self._task is not None else self._start()
            await asyncio.shield(task)

    def kick(self) -> None:
        """Start a background sync if anything is pending and none is running."""
        if self.pending and self._task is None:
            self._start()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.wait_durable()

    def _on_timer(self) -> None:
        self._timer = None
        self.kick()

    def _start(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run())
        task.add_done_callback(self._report)
        self._task = task
        return task

    async def _run(self) -> None:
        target = self._written
        try:
            await self._sync()
        finally:
            self._task = None
        self.syncs += 1
        self._durable = max(self._durable, target)

    def _report(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # also marks it retrieved when nobody waited (background syncs)
        if exc is not None:
            self._on_error(exc)
