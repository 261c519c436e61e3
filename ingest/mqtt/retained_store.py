"""Retained messages that survive a restart: the ``RetainedStore`` with every change journaled.

Rules
-----
1. Each change of a topic's retained message is written to the compacted internal topic
   ``__mqtt_retained`` (``journal.py``), keyed by the topic name: the message (an MQTT 5 PUBLISH with
   its properties, ``durable_records.py``) and its expiry as wall time; a deletion (an empty retained
   payload, §3.3.1.3) or an expiry is a tombstone, so a deleted or expired message stays gone after a
   restart and compaction forgets it.
2. A publisher is acknowledged only once the retained message its PUBLISH set is durable
   (``Hub.journaled`` waits for this journal too, through ``SessionStore.durable``).
3. ``restore`` loads the journal before clients connect; a message whose Message Expiry Interval has
   passed meanwhile is removed (tombstone), one that has not keeps the remaining interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ingest.mqtt.durable_records import BadRecord, decode_retained, encode_retained
from ingest.mqtt.journal import Journal
from ingest.mqtt.packets import Publish
from ingest.mqtt.subscriptions import RetainedStore

__all__ = ["DurableRetainedStore"]

log = logging.getLogger("ingest.mqtt")


class DurableRetainedStore(RetainedStore):
    __slots__ = ("_monotonic", "_restoring", "_wall_ms", "journal")

    def __init__(self, journal: Journal, *, wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.journal = journal
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._restoring = False

    def changed(self, topic: str, message: Publish | None, expiry: float | None) -> None:
        if self._restoring:
            return
        key = topic.encode()
        if message is None:
            self.journal.put(key, None)
            return
        expiry_ms = -1 if expiry is None else self._wall_ms() + max(0, int((expiry - self._monotonic()) * 1000))
        self.journal.put(key, encode_retained(message, expiry_ms))

    def restore(self) -> tuple[int, int]:
        """Load the journaled retained messages (rule 3); returns (restored, expired or unreadable)."""
        now_ms = self._wall_ms()
        now = self._monotonic()
        restored = dropped = 0
        self._restoring = True
        try:
            for key, value in self.journal.load().items():
                try:
                    message, expiry_ms = decode_retained(value)
                    if message.topic.encode() != key:
                        raise BadRecord("key and topic differ")
                except BadRecord as exc:
                    log.warning("mqtt: skipping an unreadable retained-message record",
                                extra={"key": key[:80].decode("utf-8", "replace"), "error": str(exc)})
                    self.journal.put(key, None)
                    dropped += 1
                    continue
                if 0 <= expiry_ms <= now_ms:
                    self.journal.put(key, None)
                    dropped += 1
                    continue
                self.store(message, None if expiry_ms < 0 else now + (expiry_ms - now_ms) / 1000)
                restored += 1
        finally:
            self._restoring = False
        if restored or dropped:
            log.info("mqtt: retained messages restored", extra={"retained": restored, "dropped": dropped})
        return restored, dropped
