"""The state a client id keeps across connections, and its bounded queue of messages waiting for it.

Rules
-----
* Expiry: a session with no connection is dropped ``expiry_s`` seconds after its client left (the hub's
  once-a-second sweep, or the client's next CONNECT). The connection sets ``expiry_s`` from the 5.0
  Session Expiry Interval (capped by ``HubConfig.max_session_expiry_s``) or, for 3.1.1 clean session = 0,
  from ``HubConfig.session_expiry_s``; 0 ends the session with its connection.
* Delivery: QoS 0 goes out at once when the client is connected and keeping up, else it is dropped
  (counted). QoS 1/2 goes out while fewer than the client's Receive Maximum are in flight; the rest wait
  in the queue, in order.
* The queue is bounded by ``HubConfig.max_queued_messages`` and ``max_queued_bytes`` (payload bytes;
  0 = no bound). When a message does not fit it is dropped, not an older one (as Mosquitto does with its
  ``max_queued_messages`` / ``max_queued_bytes``): counted in ``HubStats.queue_drops`` (and
  ``dropped_deliveries``) and logged once, with a WARNING, until the queue has drained empty again.
* All queues together are bounded by ``HubConfig.max_queued_bytes_total`` (a ``QueueBudget`` shared by
  every session of a hub): per-session bounds alone let a client that keeps inventing client ids hold
  that many times ``max_queued_bytes``. A message that does not fit the total is dropped the same way.
* Expiry: a queued message whose Message Expiry Interval has passed is dropped (by the hub's sweep, or
  when it reaches the front of the queue), counted in ``HubStats.messages_expired``; one sent from the
  queue carries the remaining interval (``properties.py`` rule 4).
* Durable (``store`` set while the session is persistent, ``session_store.py``): each QoS 1/2 message
  accepted gets its packet id and is journaled before it is sent or queued; it is removed from the
  journal when acknowledged, expired or moved to another shared-subscription member.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, NoReturn, Protocol, TypeVar

from ingest.mqtt.hub_config import HubConfig, HubStats
from ingest.mqtt.packets import Publish, Pubrel, Subscription, Will
from ingest.mqtt.ports import Link
from ingest.mqtt.properties import for_delivery

# The shared subscription (``shared.SharedGroup``) a message came through: only stored and compared by
# identity here, so this module need not import ``shared`` (which names ``SessionState``).
GroupRef = object

__all__ = ["NONE_YET", "CompactSet", "PacketIds", "QueueBudget", "SessionJournal", "SessionState"]

log = logging.getLogger("ingest.mqtt")
T = TypeVar("T")


class CompactSet(dict[T, None]):
    """A set with ``set``'s add/discard/in/len/iteration (insertion order), stored as a dict: an empty one
    takes 64 bytes where an empty ``set`` takes 216, and a large one about half as much per member. Every
    session has two sets of packet ids (most stay empty: QoS 0 clients); the hub one of all connections."""

    __slots__ = ()

    def add(self, member: T) -> None:
        self[member] = None

    def discard(self, member: T) -> None:
        self.pop(member, None)


PacketIds = CompactSet[int]


class _NoneYet(CompactSet[Any]):
    """The one empty collection a session's subscriptions, outbound messages in flight and packet-id sets
    start as (4 x 64 bytes an idle connection does not hold). Shared by every session, so it refuses to
    grow: code that adds to one of them first gives the session its own (``x is NONE_YET``). Reading,
    ``pop`` and ``discard`` work as on any empty dict."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a session's shared empty collection: give the session its own before adding")

    __setitem__ = add = setdefault = update = __ior__ = _refuse


NONE_YET: Any = _NoneYet()


class QueueBudget:
    """Payload bytes queued in all sessions of one hub, against ``limit`` (0: no bound)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, size: int) -> bool:
        return not self.limit or self.used + size <= self.limit


class SessionJournal(Protocol):
    """Where persistent sessions are journaled (``session_store.SessionStore``): what the hub, the
    sessions and the connection machine tell it. Defined here so that none of them imports it."""

    def attached(self, session: SessionState) -> None:
        """A client connected to ``session`` (its ``expiry_s`` set)."""
        ...

    def detached(self, session: SessionState) -> None:
        """The client left a session that stays."""
        ...

    def dropped(self, session: SessionState) -> None:
        """The session ended."""
        ...

    def subscribed(self, session: SessionState, sub: Subscription, sub_id: int) -> None: ...

    def unsubscribed(self, session: SessionState, topic_filter: str) -> None: ...

    def accepted(self, session: SessionState, packet: Publish, expiry: float | None, *,
                 sent: bool = False) -> Publish | None:
        """Journal a QoS 1/2 message accepted for ``session`` (``sent``: it goes out now); it comes back with
        its packet id (None: every packet id is taken)."""
        ...

    def sent(self, session: SessionState, pid: int) -> None:
        """Queued messages of ``session`` up to the one with ``pid`` have been sent (DUP=1 if sent again)."""
        ...

    def finished(self, session: SessionState, pid: int) -> None:
        """The message with ``pid`` is no longer owed to the client."""
        ...

    def released(self, session: SessionState, pid: int, then: Callable[[], None]) -> None:
        """Outbound QoS 2: PUBREC received; ``then`` (send PUBREL) once that is durable."""
        ...

    def awaiting(self, session: SessionState, pid: int) -> None:
        """Inbound QoS 2: ``pid`` is about to be answered with PUBREC."""
        ...

    def rel_received(self, session: SessionState, pid: int, then: Callable[[], None]) -> None:
        """Inbound QoS 2: PUBREL for ``pid``; ``then`` (send PUBCOMP) once its removal is durable."""
        ...

    def then(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything journaled so far is durable (at once when it is)."""
        ...

    def will_stored(self, client_id: str, will: Will, due_ms: int = -1) -> None:
        """The client's will: its connection is open (``due_ms`` -1) or it is due then (wall ms)."""
        ...

    def will_gone(self, client_id: str, will: Will | None = None) -> None:
        """The client's will (if ``will``: only that one) is published, cancelled or discarded."""
        ...

    def durable(self) -> Awaitable[object] | None:
        """What must complete before a publisher is acknowledged; None when nothing is left to wait for."""
        ...


class SessionState:
    """What a client id keeps across connections (for persistent sessions)."""

    __slots__ = (
        "awaiting_rel",
        "budget",
        "client_id",
        "connection",
        "dropping",
        "ended_at",
        "messages_expired",
        "expiry_s",
        "inflight_out",
        "next_pid",
        "pending_in",
        "queue",
        "queued_bytes",
        "shared_inflight",
        "store",
        "subscriptions",
    )

    def __init__(self, client_id: str, budget: QueueBudget | None = None) -> None:
        self.client_id = client_id
        self.budget = budget or QueueBudget()
        # NONE_YET (shared, empty) until something is added: idle connections hold none of these four
        self.subscriptions: dict[str, Subscription] = NONE_YET
        self.inflight_out: dict[int, Publish | None] = NONE_YET  # None: PUBREC received, PUBREL sent
        # (packet, when it expires, the shared subscription it came through)
        self.queue: deque[tuple[Publish, float | None, GroupRef | None]] | None = None
        self.shared_inflight: dict[int, GroupRef] | None = None  # outbound pid -> its shared subscription
        self.messages_expired = 0  # queued messages dropped because their Message Expiry Interval passed
        self.queued_bytes = 0  # payload bytes in ``queue``
        self.dropping = False  # the queue overflowed and that was logged; cleared once it drains
        self.awaiting_rel: set[int] | PacketIds = NONE_YET  # inbound QoS 2 ids answered with PUBREC
        self.pending_in: PacketIds = NONE_YET  # inbound QoS 1/2 ids being appended
        self.next_pid = 1
        self.expiry_s = 0.0
        self.ended_at: float | None = None
        self.connection: Link | None = None
        self.store: SessionJournal | None = None  # the journal, while the session is persistent

    def add_inflight(self, pid: int, packet: Publish | None) -> None:
        if self.inflight_out is NONE_YET:
            self.inflight_out = {}
        self.inflight_out[pid] = packet

    def add_awaiting_rel(self, pid: int) -> None:
        if self.awaiting_rel is NONE_YET:
            self.awaiting_rel = PacketIds()
        self.awaiting_rel.add(pid)

    def expired(self, now: float) -> bool:
        return self.ended_at is not None and now - self.ended_at >= self.expiry_s

    def _alloc_pid(self) -> int:
        pid = self.next_pid
        while pid in self.inflight_out:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def offer(self, packet: Publish, expiry: float | None, config: HubConfig, stats: HubStats,
              group: GroupRef | None = None) -> None:
        """Deliver one message (``packet``: QoS, retain flag and properties as this client gets it, no
        packet id) now or, QoS 1/2, when the client can take it; ``expiry``: when it expires (monotonic);
        ``group``: the shared subscription it came through (its messages move if this member leaves)."""
        conn = self.connection
        if packet.qos == 0:
            if conn is not None and conn.can_take_qos0():
                conn.send_publish(packet)
                stats.delivered += 1
            else:
                stats.dropped_deliveries += 1
            return
        now = conn is not None and not self.queue and len(self.inflight_out) < conn.client_receive_max
        size = len(packet.payload)
        queued = len(self.queue) if self.queue else 0
        full = not now and bool(
            (config.max_queued_messages and queued >= config.max_queued_messages)
            or (config.max_queued_bytes and self.queued_bytes + size > config.max_queued_bytes)
            or not self.budget.fits(size)
        )
        if not full and self.store is not None:  # persistent: journaled with its packet id first
            given = self.store.accepted(self, packet, expiry, sent=now)
            full = given is None  # every packet id is taken
            packet = given or packet
        if full:
            stats.dropped_deliveries += 1
            stats.queue_drops += 1
            if not self.dropping:
                self.dropping = True
                log.warning(
                    "session queue full: new messages for this client are dropped until it catches up",
                    extra={"client_id": self.client_id, "messages": queued, "bytes": self.queued_bytes,
                           "max_queued_messages": config.max_queued_messages,
                           "max_queued_bytes": config.max_queued_bytes,
                           "queued_bytes_all_sessions": self.budget.used},
                )
            return
        if now:
            assert conn is not None
            self._send_new(conn, packet, group)
            stats.delivered += 1
            return
        queue = self.queue
        if queue is None:
            queue = self.queue = deque()
        queue.append((packet, expiry, group))
        self._account(size)

    def enqueue_restored(self, packet: Publish, expiry: float | None) -> None:
        """A journaled message put back in the queue at start-up (``session_store.py`` rule 5); DUP=1 when
        it was sent before the restart (rule 7), and it goes out so."""
        if self.queue is None:
            self.queue = deque()
        self.queue.append((packet, expiry, None))
        self._account(len(packet.payload))

    def _account(self, delta: int) -> None:
        self.queued_bytes += delta
        self.budget.used += delta

    def release(self) -> None:
        """The session ends: its queue is dropped and its bytes returned to the budget."""
        self.budget.used -= self.queued_bytes
        self.queued_bytes = 0
        self.queue = None

    def _send_new(self, conn: Link, packet: Publish, group: GroupRef | None) -> None:
        pid = packet.packet_id  # given when journaled (session_store.py rule 3)
        if not pid or pid in self.inflight_out:
            pid = self._alloc_pid()
            packet = Publish(packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, pid,
                             packet.properties)
        self.add_inflight(pid, packet)
        if group is not None:
            if self.shared_inflight is None:
                self.shared_inflight = {}
            self.shared_inflight[pid] = group
        conn.send_publish(packet)

    def acked(self, pid: int, *, pump: bool = True) -> None:
        """The client finished an outbound QoS 1/2 message (PUBACK, PUBCOMP, or a failing PUBREC); ``pump``
        False: the caller pumps the queue once it has handled every acknowledgement of its read."""
        if self.inflight_out.pop(pid, 0) != 0:
            if self.store is not None:
                self.store.finished(self, pid)
            if self.shared_inflight:
                self.shared_inflight.pop(pid, None)
            if pump:
                self.pump()

    def unsendable(self, pid: int) -> None:
        """An outbound PUBLISH too large for the client was discarded: it counts as delivered (§3.1.2.11.4),
        so it leaves the in-flight window (the caller goes on sending; no pump here)."""
        if self.inflight_out.pop(pid, 0) != 0:
            if self.store is not None:
                self.store.finished(self, pid)
            if self.shared_inflight:
                self.shared_inflight.pop(pid, None)

    def take_shared(self, group: GroupRef) -> list[tuple[Publish, float | None]]:
        """Remove and return this session's unacknowledged and queued messages of ``group`` (shared rule 4);
        a QoS 2 message already PUBREC'd is the client's, and stays."""
        taken: list[tuple[Publish, float | None]] = []
        if self.shared_inflight:
            for pid, owner in list(self.shared_inflight.items()):
                packet = self.inflight_out.get(pid)
                if owner is group and packet is not None:
                    del self.shared_inflight[pid]
                    del self.inflight_out[pid]
                    if self.store is not None:
                        self.store.finished(self, pid)
                    taken.append((replace(packet, packet_id=None, dup=False), None))
        if self.queue:
            kept: deque[tuple[Publish, float | None, GroupRef | None]] = deque()
            for entry in self.queue:
                if entry[2] is group:
                    if self.store is not None and entry[0].packet_id:
                        self.store.finished(self, entry[0].packet_id)
                    taken.append((replace(entry[0], packet_id=None), entry[1]))
                    self._account(-len(entry[0].payload))
                else:
                    kept.append(entry)
            self.queue = kept
        return taken

    def pump(self) -> None:
        conn = self.connection
        queue = self.queue
        if conn is None or not queue:
            return
        now = time.monotonic()
        last = 0
        while queue and len(self.inflight_out) < conn.client_receive_max:
            packet, expiry, group = queue.popleft()
            self._account(-len(packet.payload))
            ready = for_delivery(packet, expiry, now)
            if ready is None:  # expired while it waited (properties rule 4)
                self.messages_expired += 1
                if self.store is not None and packet.packet_id:
                    self.store.finished(self, packet.packet_id)
                continue
            self._send_new(conn, ready, group)
            if ready.packet_id in self.inflight_out:  # not discarded as too large for the client
                last = ready.packet_id
        if last and self.store is not None:
            self.store.sent(self, last)  # one mark for the batch (session_store.py rule 7)
        if not queue:
            self.dropping = False

    def drop_expired(self, now: float) -> None:
        """Remove queued messages whose expiry has passed (counted in ``messages_expired``)."""
        queue = self.queue
        if not queue:
            return
        kept: deque[tuple[Publish, float | None, GroupRef | None]] = deque()
        dropped = 0
        for entry in queue:
            if entry[1] is not None and entry[1] <= now:
                dropped += 1
                self._account(-len(entry[0].payload))
                if self.store is not None and entry[0].packet_id:
                    self.store.finished(self, entry[0].packet_id)
            else:
                kept.append(entry)
        self.queue = kept
        self.messages_expired += dropped

    def resend(self) -> None:
        conn = self.connection
        if conn is None:
            return
        for pid, packet in list(self.inflight_out.items()):  # a PUBLISH too large for the client leaves it
            if packet is None:
                conn.send(Pubrel(pid))
            else:
                conn.send_publish(replace(packet, dup=True))
        self.pump()
