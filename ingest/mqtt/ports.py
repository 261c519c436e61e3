"""What the MQTT core is given from outside, and how it sees a connected client.

* ``IngestPort``: the durable append (and source health), implemented by the assembly over the ingest sink.
* ``Authenticator``: the user database check, passed by the assembly.
* ``TopicAccess``: the ACL check of topics (``security.auth = required``), passed by the assembly.
* ``Link``: one connected client as the hub and its session see it. The connection adapter
  (``session.MqttConnection``) implements it over any byte transport (TCP, TLS, WebSocket); the hub
  and ``SessionState`` only ever go through it, so neither imports the adapter or the state machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol

from ingest.mqtt.packets import Packet, Publish

__all__ = ["REFUSED", "Accepted", "Authenticator", "IngestPort", "Link", "Refusal", "TopicAccess"]

# A PUBLISH accepted from a device: (the packet with its topic resolved, its packet id or 0, arrival ms).
Accepted = tuple[Publish, int, int]
# The arrival ms of a QoS 1/2 PUBLISH the ACLs refused: it rides in its batch only so that its answer
# leaves in arrival order with the others' acks; nothing stores or delivers it (publish_in.py rule 13).
REFUSED = -1

# (client_id, username, password) -> accepted?
Authenticator = Callable[[str, str | None, bytes | None], bool]
# Why a CONNECT was refused: no credentials while anonymous clients are not allowed; credentials while there
# is no user database to check them against; credentials the user database does not accept.
Refusal = Literal["anonymous", "no-users", "bad-credentials"]


class TopicAccess(Protocol):
    """May this client (its user name, from its address) publish to a topic name / subscribe to a filter?"""

    def may_publish(self, username: str | None, peer: str, topic: str) -> bool: ...

    def may_subscribe(self, username: str | None, peer: str, topic_filter: str) -> bool: ...


class IngestPort(Protocol):
    """The durable append, implemented by the assembly on top of the ingest sink."""

    def ingest(self, client_id: str, messages: Sequence[Accepted]) -> Awaitable[None]:
        """Append ``messages`` of ``client_id`` in order; complete only once durable (per the flush policy)."""
        ...

    def backlog_bytes(self) -> int:
        """Bytes accepted but not yet durable across all sources (reads pause above a high-water mark)."""
        ...

    def connections_changed(self, delta: int) -> None:
        """A client connected (+1) or went away (-1); for source health."""
        ...

    def reads_paused(self, paused: bool) -> None:
        """A connection's socket reads were paused (True) or resumed (False) by backpressure."""
        ...


class Link(Protocol):
    """A client connection as the hub and the sessions see it. Every method is a no-op once it is closed."""

    @property
    def client_id(self) -> str:
        """The client id of its CONNECT ("" before it)."""
        ...

    @property
    def keepalive(self) -> int:
        """The keep alive granted in the CONNACK (seconds, 0: none)."""
        ...

    @property
    def client_receive_max(self) -> int:
        """How many outbound QoS 1/2 messages the client takes in flight (its Receive Maximum)."""
        ...

    def can_take_qos0(self) -> bool:
        """Connected and keeping up with what is written to it (QoS 0 deliveries are dropped otherwise)."""
        ...

    def send(self, packet: Packet) -> None:
        """Write a control packet (PUBREL ...) in the connection's protocol version."""
        ...

    def send_publish(self, packet: Publish) -> None:
        """Write a PUBLISH to the client (outbound topic alias and the client's Maximum Packet Size applied)."""
        ...

    def send_acks(self, data: bytes) -> None:
        """Write already encoded PUBACK/PUBREC packets (appends of the session's previous connection)."""
        ...

    def take_over(self) -> None:
        """Another connection claimed the client id (5.0: DISCONNECT 0x8E), then close."""
        ...

    def shutdown(self, reason: int) -> None:
        """The server is going away (5.0: DISCONNECT with ``reason``), then close."""
        ...

    def check_timeout(self, now: float) -> None:
        """The hub's periodic sweep: connect timeout and keep alive (``now``: monotonic seconds)."""
        ...
