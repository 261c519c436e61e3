"""Durable MQTT sessions: what a persistent session holds survives a restart and a ``kill -9``.

A session is persistent while its Session Expiry Interval (3.1.1: clean session = 0) is above 0. Its
state is journaled (``journal.py``) in the compacted internal topic ``__mqtt_sessions`` (keys and
values: ``durable_records.py``); the hub and the session call the hooks below, and ``restore`` rebuilds
every session from the journal when the listener is built.

Rules
-----
1. What is journaled: the session (expiry, when its client left, subscriptions with their options and
   subscription identifiers); each QoS 1/2 message owed to the client, from the moment the hub accepts
   it for the session (sent at once or queued) until the client finishes it (PUBACK, PUBCOMP, a failing
   PUBREC) or it leaves the session (expired, handed to another shared-subscription member, the session
   ended); for outbound QoS 2, the PUBREC (the message becomes "released": only PUBREL is owed); for
   inbound QoS 2, each packet id answered with PUBREC until its PUBREL. Message expiry is stored as wall
   time. QoS 0 messages are never queued for an absent client, so never journaled.
2. Copies, not references: a queued message is stored whole (an MQTT 5 PUBLISH) rather than as a
   (topic, partition, offset) pointer into the data log, because the record the ingest router stores is
   not the MQTT message (the route picks topic and key, may split, rewrite or dead-letter it; QoS and the
   retain flag are not in it), the data topic's retention is not the session's expiry, and the append
   path does not hand placements back. The copy is written only for messages routed to a persistent
   session (or retained), so ingest without persistent subscribers pays nothing.
3. Packet ids are given when a message is accepted for a persistent session (as Mosquitto does), not when
   it is sent: a message sent again after a restart carries the same packet id, so a client that stored
   an unreleased QoS 2 PUBLISH recognises it, and a client that was sent PUBREL never sees it again. A
   session holds at most 65,535 journaled messages (the packet-id space); beyond that a message is
   dropped like one that does not fit the queue bounds.
4. Order of durability, before anything is acknowledged: a publisher's PUBACK/PUBREC is sent only once
   the message is in the data log AND every journal record it caused (its copies for persistent
   subscribers, the retained message, the inbound QoS 2 packet id) is as durable as the data log's flush
   policy makes the data (``Hub.journaled``, awaited by the connection adapter). PUBREL to a subscriber
   waits for its "released" record, PUBCOMP to a publisher for the removal of its packet id, SUBACK for
   the subscription. A PUBACK or
   PUBCOMP from a subscriber removes the message without waiting (a crash before that removal is
   durable delivers a QoS 1 message again, at least once; a QoS 2 message is by then "released" and
   only its PUBREL is sent again).
5. Restore (once, before the listener accepts clients): every session is rebuilt as offline from the time
   its client left (connected at the crash: from the restore), and expires by the usual rules; one whose
   expiry has passed is removed (tombstones). Its unreleased messages are queued in their original
   order with their packet ids (the oldest go out first when the client returns), released ones owe
   PUBREL, inbound QoS 2 ids await PUBREL. Expired messages are removed, never sent. The queue bounds
   still apply to what is added later; restored messages count against them. Sessions beyond
   ``max_offline_sessions`` are ended as at any time (away longest first).
6. Ending a session (expiry, clean start, eviction, a Session Expiry Interval of 0 at DISCONNECT)
   tombstones every record it has, so compaction forgets it.
7. DUP on resend (§4.4): a message is journaled as SENT when it goes out as it is accepted; one sent
   later from the queue moves the session's sent mark (one small record per batch sent: the queue goes
   out in order, so every message up to the mark's order has been sent). After a restart the messages
   sent before go out again with DUP=1, those never sent with DUP=0.
8. Wills (§3.1.2.5, §3.1.3.2.2): the will of every open connection is journaled when the client
   connects (any session, as Mosquitto 2.1's persistence does), rewritten with the wall time it is due
   when its connection ends without DISCONNECT and a Will Delay Interval applies, and tombstoned once it
   is published (after its append), cancelled by a reconnect in time, discarded by a normal
   DISCONNECT, or replaced by the client's next CONNECT (with its own will, or none). On restore a will
   whose connection was open at the crash counts as ended then: it is due after its Will Delay Interval
   counted from the restore, or at once when its session did not survive (a clean session, or one that
   expired); a pending will is due at its time, or at once when that passed or its session ended
   meanwhile. Due wills go out at the hub's next sweep; a client that reconnects to its
   session in time cancels its will, as without a restart.
9. Not durable: QoS 0 deliveries, the round-robin position of shared subscriptions (a member's journaled
   messages stay that member's after a restart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ingest.mqtt.durable_records import (
    QUEUED,
    RELEASED,
    SENT,
    BadRecord,
    SessionRecord,
    StoredMessage,
    awaiting_key,
    decode_mark,
    decode_message,
    decode_session,
    decode_will,
    encode_mark,
    encode_message,
    encode_session,
    encode_will,
    message_key,
    parse_key,
    sent_key,
    session_key,
    will_key,
)
from ingest.mqtt.journal import Journal
from ingest.mqtt.packets import Publish, Subscription, Will

if TYPE_CHECKING:
    from ingest.mqtt.hub import Hub
    from ingest.mqtt.session_state import SessionState

__all__ = ["RETAINED_TOPIC", "SESSIONS_TOPIC", "RestoreStats", "SessionStore"]

log = logging.getLogger("ingest.mqtt")

SESSIONS_TOPIC = "__mqtt_sessions"
RETAINED_TOPIC = "__mqtt_retained"
_MAX_PID = 65_535


@dataclass(slots=True)
class RestoreStats:
    sessions: int = 0
    messages: int = 0
    sessions_expired: int = 0
    messages_expired: int = 0
    wills: int = 0
    bad_records: int = 0


class SessionStore:
    """The hub's and sessions' hooks into the journal (rules above)."""

    def __init__(self, journal: Journal, *also_durable: Journal,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.journal = journal
        self._also = also_durable  # e.g. the retained-message journal: Hub.journaled waits for it too
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        # client id -> packet id -> order, of its journaled messages; the order of the latest one sent
        self._held: dict[str, dict[int, int]] = {}
        self._marks: dict[str, int] = {}
        self._wills: dict[str, Will] = {}  # client id -> its journaled will (rule 8)
        self._ids: dict[str, dict[str, int]] = {}  # client id -> topic filter -> subscription identifier
        self._order = 0
        self.restored = RestoreStats()

    # ------------------------------------------------------------------ durability (rule 4)
    def durable(self) -> Awaitable[object] | None:
        """What must complete before a publisher is acknowledged; None when nothing is left to wait for."""
        waits = [f for f in (self.journal.durable(), *(j.durable() for j in self._also)) if f is not None]
        if not waits:
            return None
        return waits[0] if len(waits) == 1 else asyncio.gather(*waits)

    @property
    def records_written(self) -> int:
        """Journal records written (sessions and retained messages), for /metrics."""
        return self.journal.records_written + sum(j.records_written for j in self._also)

    @property
    def write_errors(self) -> int:
        """Journal appends that failed (``journal.py`` rule 3), for /metrics."""
        return self.journal.errors + sum(j.errors for j in self._also)

    def then(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything journaled so far is durable (at once when it already is)."""
        self.journal.then(callback)

    # ------------------------------------------------------------------ session hooks (hub)
    def attached(self, session: SessionState) -> None:
        """A client connected to ``session`` (its ``expiry_s`` just set)."""
        if session.expiry_s <= 0:
            if session.store is self:  # was persistent, is not any more: forget it (rule 6)
                self.dropped(session)
            return
        if session.store is not self:
            session.store = self
            self._adopt(session)
        self._write_session(session, None)

    def detached(self, session: SessionState) -> None:
        """The client left a session that stays (expiry above 0): remember when, for its expiry."""
        if session.store is not self and session.expiry_s > 0:
            session.store = self
            self._adopt(session)
        if session.store is self:
            self._write_session(session, self._wall_ms())

    def dropped(self, session: SessionState) -> None:
        """The session ended: tombstone everything it had (rule 6)."""
        if session.store is not self:
            return
        session.store = None
        client_id = session.client_id
        put = self.journal.put
        for pid in self._held.pop(client_id, ()):
            put(message_key(client_id, pid), None)
        if self._marks.pop(client_id, None) is not None:
            put(sent_key(client_id), None)
        for pid in session.awaiting_rel:
            put(awaiting_key(client_id, pid), None)
        self._ids.pop(client_id, None)
        put(session_key(client_id), None)

    def subscribed(self, session: SessionState, sub: Subscription, sub_id: int) -> None:
        self._ids.setdefault(session.client_id, {})[sub.topic_filter] = sub_id
        if session.store is self:
            self._write_session(session, None if session.connection is not None else self._wall_ms())

    def unsubscribed(self, session: SessionState, topic_filter: str) -> None:
        ids = self._ids.get(session.client_id)
        if ids is not None:
            ids.pop(topic_filter, None)
        if session.store is self:
            self._write_session(session, None if session.connection is not None else self._wall_ms())

    def _write_session(self, session: SessionState, ended_ms: int | None) -> None:
        ids = self._ids.get(session.client_id, {})
        subs = tuple((sub, ids.get(f, 0)) for f, sub in session.subscriptions.items())
        record = SessionRecord(session.expiry_s, ended_ms, subs)
        self.journal.put(session_key(session.client_id), encode_session(record))

    def _adopt(self, session: SessionState) -> None:
        """A session becomes persistent: journal what it already holds (its queue gets packet ids)."""
        held = self._held.setdefault(session.client_id, {})
        now = self._monotonic()
        for pid, packet in session.inflight_out.items():
            order = held[pid] = self._next_order()
            self.journal.put(message_key(session.client_id, pid),
                             encode_message(packet, pid, SENT if packet else RELEASED, -1, order))
        if session.queue:
            queue = list(session.queue)
            session.queue.clear()
            for packet, expiry, group in queue:
                given = self.accepted(session, packet, expiry, now)
                if given is not None:
                    session.queue.append((given, expiry, group))
        for pid in session.awaiting_rel:
            self.journal.put(awaiting_key(session.client_id, pid), b"\x01")

    # ------------------------------------------------------------------ message hooks (session)
    def accepted(self, session: SessionState, packet: Publish, expiry: float | None,
                 now: float | None = None, *, sent: bool = False) -> Publish | None:
        """A QoS 1/2 message accepted for ``session``: give it a packet id and journal it (rules 1, 3);
        ``sent``: it goes out now (rule 7). None when every packet id is taken (the caller drops it as
        from a full queue)."""
        client_id = session.client_id
        held = self._held.get(client_id)
        if held is None:
            held = self._held[client_id] = {}
        inflight = session.inflight_out
        pid = session.next_pid
        for _ in range(_MAX_PID):
            if pid not in held and pid not in inflight:
                break
            pid = pid % _MAX_PID + 1
        else:
            return None
        session.next_pid = pid % _MAX_PID + 1
        order = held[pid] = self._next_order()
        packet = Publish(packet.topic, packet.payload, packet.qos, packet.retain, False, pid, packet.properties)
        self.journal.put(message_key(client_id, pid),
                         encode_message(packet, pid, SENT if sent else QUEUED, self._expiry_ms(expiry, now), order))
        return packet

    def sent(self, session: SessionState, pid: int) -> None:
        """Queued messages up to the one with ``pid`` have been sent (rule 7)."""
        client_id = session.client_id
        held = self._held.get(client_id)
        order = held.get(pid) if held is not None else None
        if order is not None and order > self._marks.get(client_id, 0):
            self._marks[client_id] = order
            self.journal.put(sent_key(client_id), encode_mark(order))

    def finished(self, session: SessionState, pid: int) -> None:
        """The message with ``pid`` is no longer owed (acknowledged, expired, moved): rule 1."""
        held = self._held.get(session.client_id)
        if held is not None and held.pop(pid, None) is not None:
            self.journal.put(message_key(session.client_id, pid), None)

    def released(self, session: SessionState, pid: int, then: Callable[[], None]) -> None:
        """Outbound QoS 2: PUBREC received; ``then`` (send PUBREL) once that is durable (rule 4)."""
        held = self._held.get(session.client_id)
        if held is None or pid not in held:
            then()
            return
        released = encode_message(None, pid, RELEASED, -1, self._next_order())
        self.journal.put(message_key(session.client_id, pid), released)
        self.journal.then(then)

    def awaiting(self, session: SessionState, pid: int) -> None:
        """Inbound QoS 2: ``pid`` is about to be answered with PUBREC (durable first: ``durable()``)."""
        if session.store is self:
            self.journal.put(awaiting_key(session.client_id, pid), b"\x01")

    def rel_received(self, session: SessionState, pid: int, then: Callable[[], None]) -> None:
        """Inbound QoS 2: PUBREL for ``pid``; ``then`` (send PUBCOMP) once its removal is durable: until
        then a restart must still know the id, or the publisher's next message with it would be taken
        for a duplicate."""
        if session.store is not self:
            then()
            return
        self.journal.put(awaiting_key(session.client_id, pid), None)
        self.journal.then(then)

    # ------------------------------------------------------------------ wills (rule 8)
    def will_stored(self, client_id: str, will: Will, due_ms: int = -1) -> None:
        """``will`` is the client's: its connection is open (``due_ms`` -1) or it is due at ``due_ms``."""
        self._wills[client_id] = will
        self.journal.put(will_key(client_id), encode_will(client_id, will, due_ms))

    def will_gone(self, client_id: str, will: Will | None = None) -> None:
        """The client's will (if ``will``: only that one, not a newer one) is published, cancelled or discarded."""
        current = self._wills.get(client_id)
        if current is not None and (will is None or will is current):
            del self._wills[client_id]
            self.journal.put(will_key(client_id), None)

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _expiry_ms(self, expiry: float | None, now: float | None) -> int:
        if expiry is None:
            return -1
        mono = self._monotonic() if now is None else now
        return self._wall_ms() + max(0, int((expiry - mono) * 1000))

    # ------------------------------------------------------------------ restore (rule 5)
    def restore(self, hub: Hub) -> RestoreStats:
        """Rebuild the journaled sessions in ``hub`` (before any client connects)."""
        from ingest.mqtt.session_state import SessionState

        stats = self.restored
        sessions: dict[str, SessionRecord] = {}
        messages: dict[str, list[StoredMessage]] = {}
        awaiting: dict[str, set[int]] = {}
        marks: dict[str, int] = {}
        wills: dict[str, tuple[Will, int]] = {}
        orphans: list[bytes] = []
        for key, value in self.journal.load().items():
            try:
                kind, client_id, pid = parse_key(key)
                if kind == "s":
                    sessions[client_id] = decode_session(value)
                elif kind == "m":
                    messages.setdefault(client_id, []).append(decode_message(pid, value))
                elif kind == "d":
                    marks[client_id] = decode_mark(value)
                elif kind == "w":
                    stored = decode_will(value)
                    wills[client_id] = (stored.will, stored.due_ms)
                else:
                    awaiting.setdefault(client_id, set()).add(pid)
            except BadRecord as exc:
                stats.bad_records += 1
                log.warning("mqtt: skipping an unreadable session-journal record",
                            extra={"key": key[:80].decode("utf-8", "replace"), "error": str(exc)})
                orphans.append(key)
        now_ms = self._wall_ms()
        now = self._monotonic()
        for client_id in (messages.keys() | awaiting.keys()) - sessions.keys():  # written after the session ended
            orphans += [message_key(client_id, m.pid) for m in messages.get(client_id, ())]
            orphans += [awaiting_key(client_id, pid) for pid in awaiting.get(client_id, ())]
        orphans += [sent_key(client_id) for client_id in marks.keys() - sessions.keys()]
        for key in orphans:
            self.journal.put(key, None)
        # Orders go on from the highest ever given (a mark may outlive every message it covered).
        self._order = max(max((m.order for ms in messages.values() for m in ms), default=0),
                          max(marks.values(), default=0))
        restored: list[SessionState] = []
        for client_id, record in sessions.items():
            ended_ms = now_ms if record.ended_ms is None else record.ended_ms
            away_s = max(0.0, (now_ms - ended_ms) / 1000)
            session = SessionState(client_id, hub.queue_budget)
            session.expiry_s = record.expiry_s
            session.ended_at = now - away_s
            held = self._held[client_id] = {}
            mark = marks.get(client_id)
            if mark is not None:
                self._marks[client_id] = mark
            for pid in awaiting.get(client_id, ()):
                session.add_awaiting_rel(pid)
            if session.expired(now):
                stats.sessions_expired += 1
                for m in messages.get(client_id, ()):
                    held[m.pid] = m.order
                session.store = self
                self.dropped(session)
                continue
            for sub, sub_id in record.subscriptions:
                hub.subscribe(session, sub, sub_id)  # before ``store`` is set: nothing is journaled again
            session.store = self
            for m in sorted(messages.get(client_id, ()), key=lambda m: m.order):
                held[m.pid] = m.order
                if m.state == RELEASED or m.packet is None:
                    session.add_inflight(m.pid, None)
                elif 0 <= m.expiry_ms <= now_ms:
                    stats.messages_expired += 1
                    self.finished(session, m.pid)
                else:
                    expiry = None if m.expiry_ms < 0 else now + (m.expiry_ms - now_ms) / 1000
                    sent_before = m.state == SENT or (mark is not None and m.order <= mark)  # rule 7
                    session.enqueue_restored(replace(m.packet, dup=True) if sent_before else m.packet, expiry)
                    stats.messages += 1
                session.next_pid = m.pid % _MAX_PID + 1
            hub.sessions[client_id] = session
            restored.append(session)
            if record.ended_ms is None:  # connected when the process died: away from now on
                self._write_session(session, now_ms)
        for session in sorted(restored, key=lambda s: s.ended_at or 0.0):
            hub.offline[session.client_id] = session
        stats.sessions = len(restored)
        hub._evict_offline()  # more restored than max_offline_sessions: end the oldest
        for client_id, (will, due_ms) in wills.items():  # after the eviction: it publishes nothing yet
            self._restore_will(hub, client_id, will, due_ms, now, now_ms)
        stats.wills = len(wills)
        if sessions or orphans or wills:
            log.info("mqtt: durable sessions restored",
                     extra={"sessions": stats.sessions, "messages": stats.messages,
                            "sessions_expired": stats.sessions_expired, "messages_expired": stats.messages_expired,
                            "wills": stats.wills, "bad_records": stats.bad_records})
        return stats

    def _restore_will(self, hub: Hub, client_id: str, will: Will, due_ms: int, now: float, now_ms: int) -> None:
        """Rule 8: the hub's sweep publishes the will when it is due, unless its client reconnects first."""
        self._wills[client_id] = will
        session = hub.sessions.get(client_id)
        if session is None:  # its session ended (clean, expired, evicted): due now
            delay = 0.0
        elif due_ms < 0:  # its connection was open at the crash: closed now
            delay = min(float(will.properties.will_delay_interval or 0), session.expiry_s)
            if delay > 0:  # a second crash must not restart the delay
                self.will_stored(client_id, will, now_ms + int(delay * 1000))
        else:
            delay = max(0.0, (due_ms - now_ms) / 1000)
        hub.delayed_wills[client_id] = (now + delay, will)
