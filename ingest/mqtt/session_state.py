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
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ingest.mqtt.packets import Publish, Pubrel, Subscription

if TYPE_CHECKING:
    from ingest.mqtt.hub import Hub
    from ingest.mqtt.session import MqttConnection

__all__ = ["SessionState"]

log = logging.getLogger("ingest.mqtt")


class SessionState:
    """What a client id keeps across connections (for persistent sessions)."""

    __slots__ = (
        "awaiting_rel",
        "client_id",
        "connection",
        "dropping",
        "ended_at",
        "expiry_s",
        "inflight_out",
        "next_pid",
        "pending_in",
        "queue",
        "queued_bytes",
        "subscriptions",
    )

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.subscriptions: dict[str, Subscription] = {}
        self.inflight_out: dict[int, Publish | None] = {}  # None: PUBREC received, PUBREL sent
        self.queue: deque[tuple[str, bytes, int, bool]] | None = None
        self.queued_bytes = 0  # payload bytes in ``queue``
        self.dropping = False  # the queue overflowed and that was logged; cleared once it drains
        self.awaiting_rel: set[int] = set()  # inbound QoS 2 ids answered with PUBREC
        self.pending_in: set[int] = set()  # inbound QoS 1/2 ids being appended
        self.next_pid = 1
        self.expiry_s = 0.0
        self.ended_at: float | None = None
        self.connection: MqttConnection | None = None

    def expired(self, now: float) -> bool:
        return self.ended_at is not None and now - self.ended_at >= self.expiry_s

    def _alloc_pid(self) -> int:
        pid = self.next_pid
        while pid in self.inflight_out:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def offer(self, topic: str, payload: bytes, qos: int, retain: bool, hub: Hub) -> None:
        """Deliver one message to this session's client, now or (QoS 1/2) when it can take it."""
        conn = self.connection
        if qos == 0:
            if conn is not None and conn.can_take_qos0():
                conn.send_publish(Publish(topic, payload, 0, retain))
                hub.stats.delivered += 1
            else:
                hub.stats.dropped_deliveries += 1
            return
        if conn is not None and not self.queue and len(self.inflight_out) < conn.client_receive_max:
            self._send_new(conn, topic, payload, qos, retain)
            hub.stats.delivered += 1
            return
        queue = self.queue
        if queue is None:
            queue = self.queue = deque()
        config = hub.config
        if (config.max_queued_messages and len(queue) >= config.max_queued_messages) or (
            config.max_queued_bytes and self.queued_bytes + len(payload) > config.max_queued_bytes
        ):
            hub.stats.dropped_deliveries += 1
            hub.stats.queue_drops += 1
            if not self.dropping:
                self.dropping = True
                log.warning(
                    "session queue full: new messages for this client are dropped until it catches up",
                    extra={"client_id": self.client_id, "messages": len(queue), "bytes": self.queued_bytes,
                           "max_queued_messages": config.max_queued_messages,
                           "max_queued_bytes": config.max_queued_bytes},
                )
            return
        queue.append((topic, payload, qos, retain))
        self.queued_bytes += len(payload)

    def _send_new(self, conn: MqttConnection, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        pid = self._alloc_pid()
        packet = Publish(topic, payload, qos, retain, False, pid)
        self.inflight_out[pid] = packet
        conn.send_publish(packet)

    def pump(self) -> None:
        conn = self.connection
        queue = self.queue
        if conn is None or not queue:
            return
        while queue and len(self.inflight_out) < conn.client_receive_max:
            topic, payload, qos, retain = queue.popleft()
            self.queued_bytes -= len(payload)
            self._send_new(conn, topic, payload, qos, retain)
        if not queue:
            self.dropping = False

    def resend(self) -> None:
        conn = self.connection
        if conn is None:
            return
        for pid, packet in self.inflight_out.items():
            if packet is None:
                conn.send(Pubrel(pid))
            else:
                conn.send_publish(Publish(packet.topic, packet.payload, packet.qos, packet.retain, True, pid))
        self.pump()
