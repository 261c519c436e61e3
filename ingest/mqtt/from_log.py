"""Records written to the log by others (Kafka producers, the HTTP API) reach MQTT subscribers.

Rules
-----
1. Follows every partition of the log topics in ``topics`` (setting ``mqtt.deliver_from_topics``, none by
   default), from the log end when it starts (records written while Sluice was down are not replayed);
   a topic or partition created later is followed from its beginning, picked up within a second.
2. A record is delivered when it has an ``mqtt_topic`` header holding a valid topic name and it was not
   written by this MQTT listener (``source`` header ``mqtt:default``: those went to subscribers as they
   arrived). The value is the payload; the ``mqtt.*`` and other headers are its properties
   (``properties.py`` rule 3); it is sent at QoS 1 (capped by each subscription's QoS), not retained.
3. Read as a ``read_committed`` Kafka consumer reads (``broker.txn.committed``): up to the last stable
   offset, without control batches and without the records of aborted transactions, so a transactional
   producer's records reach devices once committed and never when aborted. Without a transaction
   coordinator (Kafka listener off: nobody can write a transaction) up to the high watermark. Records
   lost to retention before they were read are skipped.
4. A record that cannot be delivered (no or a bad ``mqtt_topic``) is skipped and counted in
   ``HubStats.log_records_skipped``; headers that cannot become properties in ``log_headers_skipped``.
   A record whose delivery fails in any other way is skipped, counted the same and logged with its
   offset: one poison record must not stop the partition's later records (they would be retried at
   the same offset every second, for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from broker.errors import OffsetOutOfRangeError
from broker.log.api import LogStore
from broker.log.partition_log import PartitionLog, wait_for_any
from broker.protocol.records import Record, decode_records, split_complete_batches
from broker.txn.committed import StableOffsets, read_committed
from ingest.mqtt.errors import EncodeError
from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import Publish
from ingest.mqtt.properties import from_headers
from ingest.mqtt.subscriptions import valid_topic

__all__ = ["LogToMqtt"]

log = logging.getLogger("ingest.mqtt")

_READ_BYTES = 1024 * 1024
_OWN_SOURCE = b"mqtt:default"


class LogToMqtt:
    """Follows log topics and hands their MQTT-addressed records to the hub (rules above)."""

    def __init__(self, hub: Hub, store: LogStore, topics: Sequence[str], *, poll_s: float = 1.0,
                 committed: Callable[[], StableOffsets | None] = lambda: None) -> None:
        self.hub = hub
        self.store = store
        self.topics = tuple(topics)
        self._committed = committed  # the transaction coordinator, looked up when reading (rule 3)
        self._poll_s = poll_s
        self._positions: dict[tuple[str, int], int] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_problem = ""

    async def start(self) -> None:
        self._discover(at_start=True)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _discover(self, at_start: bool = False) -> None:
        """Partitions to follow: from their end at start, from their beginning when they appear later."""
        for topic in self.topics:
            if not self.store.has_topic(topic):
                continue
            for number, plog in enumerate(self.store.partitions(topic)):
                start = plog.log_end_offset if at_start else plog.log_start_offset
                self._positions.setdefault((topic, number), start)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._discover()
                txns = self._committed()
                for key, offset in list(self._positions.items()):
                    plog = self.store.partition(*key)
                    self._positions[key] = self._drain(plog, offset) if txns is None else \
                        self._drain_committed(txns, plog, offset)
                waits = [(plog, self._wait_at(txns, plog, offset))
                         for plog, offset in ((self.store.partition(*key), offset)
                                              for key, offset in self._positions.items())]
                if waits:
                    await wait_for_any(waits, self._poll_s, self._stop)
                else:
                    await asyncio.sleep(self._poll_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a deleted topic, a corrupt batch: logged once, retried where it stopped
                problem = f"{type(exc).__name__}: {exc}"
                if problem != self._last_problem:
                    self._last_problem = problem
                    log.exception("mqtt: following the log for MQTT subscribers failed; retrying every second")
                self._positions = {k: v for k, v in self._positions.items() if self.store.has_topic(k[0])}
                await asyncio.sleep(self._poll_s)

    def _drain(self, plog: PartitionLog, offset: int) -> int:
        """Deliver what is readable from ``offset``; returns the next offset to read."""
        while plog.high_watermark > offset:
            try:
                data = plog.read(offset, _READ_BYTES)
            except OffsetOutOfRangeError:
                return plog.log_start_offset if offset < plog.log_start_offset else plog.log_end_offset
            headers, _ = split_complete_batches(data)
            if not headers:
                return offset
            view = memoryview(data)
            pos = 0
            for header in headers:
                batch = view[pos : pos + header.size]
                pos += header.size
                if not header.is_control:
                    for record in decode_records(batch, header):
                        if record.offset >= offset and record.offset < plog.high_watermark:
                            self._deliver_or_skip(record)
                offset = max(offset, header.last_offset + 1)
        return offset

    def _drain_committed(self, txns: StableOffsets, plog: PartitionLog, offset: int) -> int:
        """``_drain`` up to the last stable offset, aborted transactions' records left out (rule 3)."""
        while True:
            try:
                read = read_committed(txns, plog, offset, _READ_BYTES)
            except OffsetOutOfRangeError:
                return plog.log_start_offset if offset < plog.log_start_offset else plog.log_end_offset
            if read.next_offset <= offset:
                return offset  # at the last stable offset
            view = memoryview(read.data)
            headers, _ = split_complete_batches(view)
            pos = 0
            for header in headers:
                for record in decode_records(view[pos : pos + header.size], header):
                    if record.offset >= offset:
                        self._deliver_or_skip(record)
                pos += header.size
            offset = read.next_offset

    @staticmethod
    def _wait_at(txns: StableOffsets | None, plog: PartitionLog, offset: int) -> int:
        """The offset whose arrival wakes this reader: held at an open transaction, its marker."""
        if txns is None or offset < txns.last_stable_offset(plog):
            return offset
        return max(offset, plog.high_watermark)

    def _deliver_or_skip(self, record: Record) -> None:
        try:
            self._deliver(record)
        except Exception as exc:  # rule 4: this record only
            self.hub.stats.log_records_skipped += 1
            log.warning("mqtt: delivering a record from the log failed; skipped",
                        extra={"topic": record.header("mqtt_topic"), "offset": record.offset, "error": repr(exc)})

    def _deliver(self, record: Record) -> None:
        stats = self.hub.stats
        if record.header("source") == _OWN_SOURCE:
            return
        raw_topic = record.header("mqtt_topic")
        try:
            topic = raw_topic.decode() if raw_topic is not None else ""
        except UnicodeDecodeError:
            topic = ""
        if not valid_topic(topic) or "\x00" in topic or len(raw_topic or b"") > 65_535:
            stats.log_records_skipped += 1
            return
        props, skipped = from_headers(record.headers)
        stats.log_headers_skipped += skipped
        msg = Publish(topic, record.value or b"", 1, False, False, None, props)
        try:
            self.hub.deliver("", [(msg, 0, record.timestamp if record.timestamp >= 0 else int(time.time() * 1000))])
        except EncodeError as exc:  # e.g. a topic name longer than MQTT allows: this record only
            stats.log_records_skipped += 1
            log.warning("mqtt: a record cannot be sent over MQTT; skipped",
                        extra={"topic": topic[:200], "offset": record.offset, "error": str(exc)})
            return
        stats.log_records_delivered += 1
