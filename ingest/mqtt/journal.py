"""A key -> value journal kept in one partition of a compacted internal topic of Sluice's own log.

Durable MQTT state (``session_store.py``, ``retained_store.py``) is written here rather than to a side
database: the log already gives ordered, checksummed, crash-recovered appends, and compaction
(``broker/log/cleaner.py``, ``cleanup.policy=compact``) keeps only the latest value per key, dropping
tombstones (null values) after ``delete.retention.ms``.

Rules
-----
1. ``put``/``delete`` only buffer a record; every record buffered in one turn of the event loop is
   appended as one RecordBatch (split at ``_BATCH_BYTES``) at the end of that turn, or at once by
   ``durable()``. Appends are synchronous (``append_nowait``), so the log holds records in the order
   they were put, and a batch is stored whole or not at all (recovery drops a torn tail batch).
2. ``durable()`` answers when everything put so far is as durable as the topic's flush policy
   promises, the same promise the data log gives its records: under ``flush=os``/``interval`` that is
   once written (None is returned: nothing to wait for); under ``flush=always`` once fsynced (a future;
   concurrent callers share one fsync). ``then(callback)`` runs ``callback`` at that point. The fsync
   is asked for by the first such call after a write, not by the write: records nothing waits for
   (a subscriber's PUBACK removing its message, a sent mark) cost no fsync and no task of their own,
   and become durable with the next fsync asked for.
3. A failed append (disk full or failing) loses the records it held: it is logged once per run of
   failures, counted in ``errors``, and every waiter gets the exception, so nothing that depends on
   them is acknowledged. Callbacks registered with ``then`` are not run.
4. ``load()`` replays the partition from its start: the latest value per key, tombstones removed. A
   batch that cannot be read ends the replay there (logged): a restart never stops on a bad journal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker import native
from broker.log.api import LogStore
from broker.log.config import FlushPolicy
from broker.log.keyed import keyed_records
from broker.log.partition_log import PartitionLog
from ingest.mqtt import journal_batch

__all__ = ["Journal", "encode_journal_batch"]

encode_journal_batch = native.select(journal_batch).encode_journal_batch  # compiled when built

log = logging.getLogger("ingest.mqtt")

_BATCH_BYTES = 1 << 20  # records per appended batch, well below the topic's max.message.bytes
_RECORD_OVERHEAD = 24
# Compaction only cleans closed segments: small segments that roll at least hourly let it keep the
# journal near the size of the state it holds. A single record can be a whole MQTT message (1 MiB).
_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(64 * 1024 * 1024),
    "segment.ms": str(3_600_000),
    "max.message.bytes": str(8 * 1024 * 1024),
}


class Journal:
    """One compacted internal topic with one partition (rules above)."""

    def __init__(self, store: LogStore, topic: str) -> None:
        self.store = store
        self.topic = topic
        self.errors = 0  # appends that failed (rule 3)
        self.records_written = 0
        self._pending: list[tuple[bytes, bytes | None]] = []  # (key, value or None: a tombstone)
        self._pending_bytes = 0
        self._scheduled = False
        self._log: PartitionLog | None = None
        self._unsynced: asyncio.Future[None] | None = None  # fsync covering writes not yet durable
        self._sync_due: int | None = None  # flush=always: the write mark of writes nobody waits for yet
        self._failing = False

    def _partition(self) -> PartitionLog:
        if self._log is None:
            if not self.store.has_topic(self.topic):
                config = self.store.default_config.with_kafka_configs(_TOPIC_CONFIG)
                self.store.create_topic(self.topic, 1, config, internal=True)
            self._log = self.store.partition(self.topic, 0)
        return self._log

    # ------------------------------------------------------------------ reading (rule 4)
    def load(self) -> dict[bytes, bytes]:
        """The latest value of every key that has one (tombstoned keys left out)."""
        if not self.store.has_topic(self.topic):
            return {}
        latest: dict[bytes, bytes | None] = {}
        try:
            for key, value in keyed_records(self._partition()):
                latest[key] = value
        except Exception as exc:  # a damaged journal must not stop the broker from starting
            log.error("mqtt: the rest of a durable-state journal cannot be read; state after it is lost",
                      extra={"topic": self.topic, "keys_read": len(latest),
                             "error": f"{type(exc).__name__}: {exc}"})
        return {key: value for key, value in latest.items() if value is not None}

    # ------------------------------------------------------------------ writing (rules 1-3)
    def put(self, key: bytes, value: bytes | None) -> None:
        """Buffer ``key = value`` (None: a tombstone); appended at the end of this loop turn."""
        self._pending.append((key, value))
        self._pending_bytes += len(key) + (len(value) if value is not None else 0) + _RECORD_OVERHEAD
        if self._pending_bytes >= _BATCH_BYTES:
            self._write()
        elif not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self._write)
            except RuntimeError:  # no loop (a restore at start-up): written by the next durable()/put
                self._scheduled = False

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def durable(self) -> asyncio.Future[None] | None:
        """Write what is buffered; None when it is already as durable as promised, else a future that
        completes then (or fails with the append's error)."""
        failure = self._write()
        if failure is not None:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.set_exception(failure)
            return future
        mark = self._sync_due
        if mark is not None and self._log is not None:
            self._sync_due = None
            self._sync(self._log, mark)
        return self._unsynced

    def then(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything put so far is durable (now, when it already is)."""
        future = self.durable()
        if future is None:
            callback()
            return

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                callback()

        future.add_done_callback(done)

    def _write(self) -> BaseException | None:
        self._scheduled = False
        records = self._pending
        if not records:
            return None
        self._pending = []
        self._pending_bytes = 0
        try:
            plog = self._partition()
            now_ms = int(time.time() * 1000)
            for chunk in _chunks(records):
                plog.append_nowait(encode_journal_batch(chunk, now_ms), verified=True)  # its CRC is ours
        except Exception as exc:  # StorageError, or a record too large: rule 3
            self._failed(exc)
            return exc
        self.records_written += len(records)
        if self._failing:
            self._failing = False
            log.info("mqtt: durable-state journal writes succeed again", extra={"topic": self.topic})
        if plog.config.flush is FlushPolicy.ALWAYS:
            self._sync_due = plog.write_mark()  # fsynced once somebody waits (durable(), then())
        return None

    def _sync(self, plog: PartitionLog, mark: int) -> None:
        """One future for the fsync of everything written up to ``mark`` (``wait_durable(mark)`` covers
        every earlier write too); callers that took an older future keep waiting on theirs."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._unsynced = future

        async def sync() -> None:
            try:
                await plog.wait_durable(mark)
            except Exception as exc:  # handed to every waiter (rule 3)
                self._failed(exc)
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(None)
            finally:
                if self._unsynced is future:
                    self._unsynced = None

        task = loop.create_task(sync())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)
        future.add_done_callback(_retrieve)

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._failing:
            self._failing = True
            log.error("mqtt: a durable-state journal write failed; what depends on it is not acknowledged",
                      extra={"topic": self.topic, "error": f"{type(exc).__name__}: {exc}"})


_TASKS: set[asyncio.Task[None]] = set()


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a failed future's exception as seen (each waiter handles it; nobody may be waiting)."""
    if not future.cancelled():
        future.exception()


def _chunks(records: list[tuple[bytes, bytes | None]]) -> list[list[tuple[bytes, bytes | None]]]:
    total = 0
    for key, value in records:
        total += len(key) + (len(value) if value is not None else 0)
    if total + len(records) * _RECORD_OVERHEAD <= _BATCH_BYTES:  # the common case: one batch
        return [records]
    out: list[list[tuple[bytes, bytes | None]]] = [[]]
    size = 0
    for key, value in records:
        rsize = len(key) + (len(value) if value is not None else 0) + _RECORD_OVERHEAD
        if out[-1] and size + rsize > _BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append((key, value))
        size += rsize
    return out
