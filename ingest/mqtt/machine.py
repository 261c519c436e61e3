"""The rules of one MQTT connection, sans-IO: bytes, append results and time in, actions out.

``ConnectionMachine`` never touches a socket, a clock or the event loop. Its inputs are the bytes the
client sent (``receive``, with the time they arrived), the outcome of the durable appends it asked for
(``take_batch`` / ``appended`` / ``append_failed``), the hub's periodic sweep (``tick``) and what the hub
routes to the client (``send_publish`` ...). Each returns the ``Action``s the connection must now carry
out, in order: ``bytes`` to write to the client, ``Do.CLOSE``, ``Do.PAUSE_READING`` / ``Do.RESUME_READING``,
``Do.START_APPENDING`` (run ``take_batch`` → ``IngestPort.ingest`` → ``appended`` until ``take_batch``
gives None) and ``Linger``. ``session.py`` carries them out over an asyncio transport; any other byte
transport (TLS, WebSocket) can drive the same machine. A call made while another call of the same
machine is running (the hub routing a message back to its own publisher) adds its actions to the outer
call's list, so the actions of one input always come out in the order the rules produced them.

Shared state (sessions by client id, subscriptions, retained messages, routing) is the hub's, passed in
at construction; the hub reaches other connections only through their ``Link`` (``ports.py``).

Rules
-----
States: NEW → CONNECTED → CLOSED (a DISCONNECT, a protocol error or a lost socket all lead to CLOSED).

1. NEW accepts only CONNECT (the codec refuses any other first byte: the socket is closed without an
   answer); whether the client gets in, and on what terms, is ``connect.py``. A refusal is a CONNACK
   with its code, then close. No CONNECT within the connect timeout closes the socket.
2. Session: clean start drops any stored session. A persistent session (3.1.1 clean session = 0, or 5.0
   Session Expiry Interval > 0) keeps, by client id, its subscriptions, the QoS 1/2 messages queued for
   the client (bounded), outbound messages in flight, and inbound QoS 2 packet ids awaiting PUBREL,
   until it expires (``session_state.py``: 5.0 interval capped at ``max_session_expiry_s``, 3.1.1
   ``session_expiry_s``; a 5.0 client whose interval was cut is told the granted one in the CONNACK).
   On reconnect in-flight messages are re-sent (DUP=1, or PUBREL after PUBREC) before queued ones. A
   second connection with the same client id takes the session over (the old one gets DISCONNECT 0x8E).
3. PUBLISH in: QoS 0/1/2 messages of one connection are appended in arrival order, in batches (one
   batch per read; reads that arrive while an append runs join the waiting batch, up to 4096 messages:
   one append, one fsync, covers many reads). PUBACK (QoS 1) / PUBREC (QoS 2) are sent ONLY after the
   batch's durable append, in arrival order, to the session's current connection. When the append fails
   (the disk is full or failing), nothing of the batch is acknowledged: a 5.0 client gets PUBACK /
   PUBREC 0x80 for each of its QoS 1/2 messages and stays connected; a 3.1.1 client (no negative acks)
   is disconnected, and resends what was not acknowledged when it reconnects. Messages are routed to
   subscribers (and the retained store) after the durable append, after the acks. With durable
   sessions (``session_store.py`` rule 4) the adapter writes the acks ``appended`` returns only once
   what routing journaled is durable (``Hub.journaled``), PUBREL and PUBCOMP wait for their journal
   record, and SUBACK for the subscription's.
4. Duplicates: a QoS 1/2 PUBLISH whose packet id is still being appended is a retry and is dropped; a
   QoS 2 PUBLISH whose id awaits PUBREL gets its PUBREC again and is not appended twice.
   PUBREL → PUBCOMP (5.0: 0x92 if unknown). A Subscription Identifier in a PUBLISH is a protocol error.
5. Flow control: reads pause while this connection has ``receive_maximum`` messages waiting for the
   append, or while the ingest backlog is above its high-water mark, and resume when the queue has
   drained to half. A 5.0 client that exceeds the advertised Receive Maximum gets DISCONNECT 0x93.
6. Topic aliases (5.0): alias 0 or above Topic Alias Maximum → DISCONNECT 0x94; an unknown alias → 0x82.
   Outbound aliases when the client allows them: ``aliases.py``.
7. Keepalive: no packet for 1.5 × keepalive → close (5.0: DISCONNECT 0x8D). Time spent with reads
   paused by backpressure does not count against the client. A keep alive above ``max_keepalive`` (or
   0) becomes ``max_keepalive``; a 5.0 client is told by Server Keep Alive in the CONNACK.
8. Will: due when the connection ends without a normal DISCONNECT (5.0: reason 0x04 also); the hub
   publishes it (appended, then delivered, with its properties) after the Will Delay Interval or when
   the session ends, whichever is first, unless the client reconnects to the session before then. With
   durable sessions the will is journaled while the connection is open and while it is pending, so it
   survives a restart (``session_store.py`` rule 8). A 5.0 DISCONNECT may change the Session Expiry
   Interval (capped like CONNECT's).
9. SUBSCRIBE: ``subscribe.py`` (identifiers, shared subscriptions, Retain Handling); SUBACK, then the
   retained messages it says. UNSUBSCRIBE: UNSUBACK (5.0: 0x11 for a filter with no subscription).
10. Errors after CONNECT: a 5.0 client gets DISCONNECT with the reason (0x81 malformed, 0x82 protocol
    error, 0x95 packet too large, 0x90 bad topic …) before the close; after 0x93 (Receive Maximum
    exceeded: the client is still sending) the connection lingers (``Linger``): nothing more is
    written, what arrives is discarded, and it closes at the client's EOF, after 0.2 s of silence or
    after 2 s, so the client reads the DISCONNECT rather than a reset. A 3.1.1 client's socket is
    closed. Packets after a bad one are never processed; those before it are (and are appended).
11. PUBLISH out: QoS = min(published, granted); at most the client's Receive Maximum QoS 1/2 in flight,
    the rest queued in the session (bounded; ``session_state.py``); a PUBLISH larger than the client's
    Maximum Packet Size is dropped and counted, and behaves as if sent (§3.1.2.11.4): it leaves the
    in-flight window, and a topic alias it would have introduced is introduced by the next one.
12. Once CLOSED nothing more is written (except the CONNACK of a refusal) and input is discarded.
13. ACLs (``hub.access``, with ``security.auth = required``), as Mosquitto applies them: a CONNECT whose
    will topic may not be published to is refused (5.0 0x87, 3.1.1 0x05). A PUBLISH the ACLs refuse is
    not stored nor delivered, and logged (rate-limited) and counted by the authorizer: QoS 0 is dropped;
    QoS 1/2 are answered in arrival order with the others' acks: 5.0 PUBACK / PUBREC 0x87, 3.1.1 (no
    negative acks) a plain PUBACK / PUBREC, as Mosquitto does. SUBSCRIBE: ``subscribe.py``.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ParamSpec, Protocol

from ingest.errors import IngestError
from ingest.mqtt.aliases import OutboundAliases
from ingest.mqtt.codec import Decoder, encode, encode_publish
from ingest.mqtt.connect import Refused, admit, expiry_seconds
from ingest.mqtt.errors import ProtocolError, UnsupportedProtocol
from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from ingest.mqtt.ports import REFUSED, Accepted, Link
from ingest.mqtt.session_state import SessionState
from ingest.mqtt.subscribe import apply_subscribe

__all__ = ["CLOSED", "CONNECTED", "NEW", "Action", "ConnectionMachine", "Do", "Endpoint", "Linger"]

log = logging.getLogger("ingest.mqtt")

NEW, CONNECTED, CLOSED = 0, 1, 2
_PINGRESP = b"\xd0\x00"
LINGER_S = 2.0  # after DISCONNECT 0x93, at most this long reading and discarding ...
LINGER_QUIET_S = 0.2  # ... or until the client has sent nothing for this long
_MAX_BATCH = 4096  # messages per append call
_PUBACK = 0x40020000  # fixed header + remaining length 2; the packet id goes in the low 16 bits
_PUBREC = 0x50020000


class Do(Enum):
    """Transport operations (``bytes`` actions are writes)."""

    CLOSE = "close"  # close the transport (it then reports the loss: ``lost``)
    PAUSE_READING = "pause"
    RESUME_READING = "resume"
    START_APPENDING = "append"  # run the append loop: take_batch → IngestPort.ingest → appended, until None


@dataclass(frozen=True, slots=True)
class Linger:
    """Rule 10: write nothing more, keep reading (the machine discards it) and close once
    ``linger_over(now, until)`` says so; ask it every ``LINGER_QUIET_S``."""

    until: float


Action = bytes | Do | Linger
P = ParamSpec("P")


class Endpoint(Link, Protocol):
    """The connection adapter as its machine sees it: the ``Link`` it registers with the hub, and the peer
    address for log lines."""

    def peername(self) -> Any: ...


class ConnectionMachine:
    """One client connection's rules (module header). The methods return the actions to carry out."""

    __slots__ = (
        "_aliases",
        "_appending",
        "_arrival_ms",
        "_batch",
        "_out",
        "_out_aliases",
        "_queue",
        "_queued",
        "_will",
        "certificate_user",
        "client_id",
        "client_max_packet",
        "client_receive_max",
        "decoder",
        "endpoint",
        "hub",
        "keepalive",
        "last_rx",
        "paused",
        "session",
        "state",
        "username",
        "version",
    )

    def __init__(self, hub: Hub, endpoint: Endpoint, now: float) -> None:
        self.hub = hub
        self.endpoint = endpoint  # the hub's handle on this connection (session.connection is this)
        # Dropped between reads once connected with nothing buffered (idle connections hold none), made again
        # on the next read with the version the CONNECT set.
        self.decoder: Decoder | None = Decoder(max_packet_size=hub.config.max_packet_size)
        self.state = NEW
        self.version = 4
        self.client_id = ""
        self.username: str | None = None  # who the client logged in as (connect.py rule 2)
        self.certificate_user: str | None = None  # the CN of a verified TLS client certificate (set by the adapter)
        self.session: SessionState | None = None
        self.keepalive = 0
        self.last_rx = now
        self.client_receive_max = 65535
        self.client_max_packet = 0
        self.paused = False
        self._out_aliases: OutboundAliases | None = None  # when the client accepts aliases from us
        self._aliases: dict[int, str] | None = None
        self._arrival_ms = 0  # receive time of the current read, shared by its packets
        self._batch: list[Accepted] | None = None  # this read's accepted PUBLISHes
        self._queue: deque[list[Accepted]] | None = None  # batches waiting for the append loop
        self._queued = 0  # messages accepted and not yet appended (or refused)
        self._appending = False  # the append loop is running (Do.START_APPENDING was returned)
        self._will: Will | None = None
        self._out: list[Action] | None = None  # the actions of the call in progress

    # ------------------------------------------------------------------ calls and their actions
    def _perform(self, step: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> list[Action]:
        out = self._out
        if out is not None:  # called back during one of our own calls: the outer call returns these
            step(*args, **kwargs)
            return []
        out = self._out = []
        try:
            step(*args, **kwargs)
        finally:
            self._out = None
        return out

    def _emit(self, action: Action) -> None:
        out = self._out
        assert out is not None
        out.append(action)

    # ------------------------------------------------------------------ inputs
    def receive(self, data: bytes, now: float, wall_ms: int) -> list[Action]:
        """Bytes from the client, read at ``now`` (monotonic s) / ``wall_ms`` (the records' arrival time)."""
        self.last_rx = now  # also while lingering (rule 10)
        if self.state == CLOSED:
            return []
        return self._perform(self._receive, data, wall_ms)

    def tick(self, now: float) -> list[Action]:
        """The periodic sweep: connect timeout (rule 1) and keep alive (rule 7)."""
        return self._perform(self._tick, now)

    def take_batch(self) -> list[Accepted] | None:
        """The next batch to append (the append loop calls this); None ends the loop."""
        queue = self._queue
        if queue:
            return queue.popleft()  # taken: later reads start a new batch
        self._appending = False
        return None

    def appended(self, batch: list[Accepted]) -> list[Action]:
        """``batch`` is durable: acknowledge and route it (rule 3)."""
        return self._perform(self._appended, batch)

    def append_failed(self, batch: list[Accepted], exc: BaseException) -> list[Action]:
        """``batch`` was not stored (rule 3)."""
        return self._perform(self._append_failed, batch, exc)

    def lost(self) -> None:
        """The transport is gone (closed by us or by the peer): the will (rule 8), the session kept or ended."""
        was_connected = self.state == CONNECTED
        self.state = CLOSED
        if self.paused:
            self.paused = False
            self.hub.port.reads_paused(False)
        if was_connected and self._will is not None:
            self._will_due()
        self._will = None
        if self.session is not None:
            self.hub.detach(self.endpoint, self.session)

    def linger_over(self, now: float, until: float) -> bool:
        """Rule 10: the client has been quiet for ``LINGER_QUIET_S``, or the linger time is up."""
        return now - self.last_rx >= LINGER_QUIET_S or now >= until

    # ------------------------------------------------------------------ what the hub sends the client
    def send(self, packet: Packet) -> list[Action]:
        return self._perform(self._send, packet)

    def send_publish(self, packet: Publish) -> list[Action]:
        return self._perform(self._send_publish, packet)

    def send_acks(self, data: bytes) -> list[Action]:
        return self._perform(self._send_acks, data)

    def shutdown(self, reason: int) -> list[Action]:
        """The server is going away (5.0 clients are told why)."""
        return self._perform(self._shutdown, reason)

    def take_over(self) -> list[Action]:
        """Another connection claimed our client id (rule 2)."""
        return self._perform(self._disconnect, Reason.SESSION_TAKEN_OVER, "session taken over")

    # ------------------------------------------------------------------ steps
    def _receive(self, data: bytes, wall_ms: int) -> None:
        self._arrival_ms = wall_ms
        decoder = self.decoder
        if decoder is None:
            decoder = self.decoder = Decoder(self.version, self.hub.config.max_packet_size)
        try:
            packets = decoder.feed(data)
        except UnsupportedProtocol as exc:
            self._refuse(0x01 if exc.level < MQTT_5 else Reason.UNSUPPORTED_PROTOCOL_VERSION, exc.level)
            return
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        plain = self.hub.access is None  # no ACLs: runs of plain PUBLISHes take the short loop
        i, count = 0, len(packets)
        while i < count:
            packet = packets[i]
            if type(packet) is Publish and self.state == CONNECTED:
                if plain:
                    taken = self._plain_publishes(packets, i)
                    if taken > i:
                        i = taken
                        continue
                self._on_publish(packet, self.session)  # type: ignore[arg-type]  # set once CONNECTED
            else:
                self._handle(packet)
            i += 1
            if self.state == CLOSED:
                break
        self._arrival_ms = 0  # (an int this large is an object: idle connections do not keep one)
        if self._batch:
            self._flush_batch()  # publishes accepted before a DISCONNECT (or an error) are still appended
        if decoder.error is not None and self.state != CLOSED:
            self._protocol_error(decoder.error)
        elif self.state == CONNECTED and not decoder.buffered:
            self.decoder = None

    def _tick(self, now: float) -> None:
        if self.state == NEW and now - self.last_rx > self.hub.config.connect_timeout_s:
            self._close()
        elif self.paused:
            self.last_rx = now  # we stopped reading, not the client: its PINGREQs wait in the socket
        elif self.state == CONNECTED and self.keepalive and now - self.last_rx > 1.5 * self.keepalive:
            log.info("keepalive expired", extra={"client_id": self.client_id})
            self._disconnect(Reason.KEEP_ALIVE_TIMEOUT, "keepalive timeout")

    def _send(self, packet: Packet) -> None:
        if self.state != CLOSED:
            self._emit(encode(packet, self.version))

    def _send_publish(self, packet: Publish) -> None:
        if self.state == CLOSED:
            return
        sent = packet if self._out_aliases is None else self._out_aliases.apply(packet)
        wire = encode_publish(sent, self.version == MQTT_5)
        if self.client_max_packet and len(wire) > self.client_max_packet:
            self._unsendable(packet, sent)
            return
        self._emit(wire)

    def _unsendable(self, packet: Publish, sent: Publish) -> None:
        """Rule 11: a PUBLISH larger than the client's Maximum Packet Size is discarded as if it had been sent
        (§3.1.2.11.4): counted, its in-flight slot freed (it would hold one for ever), and an alias it was to
        introduce forgotten (the client never learnt it)."""
        self.hub.stats.dropped_deliveries += 1
        if sent.topic and sent.properties.topic_alias is not None and self._out_aliases is not None:
            self._out_aliases.forget(sent.topic)
        if packet.qos and packet.packet_id and self.session is not None:
            self.session.unsendable(packet.packet_id)

    def _send_acks(self, data: bytes) -> None:
        if self.state == CONNECTED:
            self._emit(data)

    def _shutdown(self, reason: int) -> None:
        if self.state != CLOSED:
            self._disconnect(reason, "server shutting down")

    def _close(self) -> None:
        self._emit(Do.CLOSE)  # the transport reports the loss later (lost()); no further packet is processed
        was = self.state
        self.state = CLOSED
        if was == CONNECTED and self._will is not None:
            self._will_due()

    def _will_due(self) -> None:
        will, self._will = self._will, None
        if will is not None:
            self.hub.will_due(self.client_id, will, self.session.expiry_s if self.session is not None else 0.0)

    def _disconnect(self, reason: int, why: str, linger: bool = False) -> None:
        if self.version == MQTT_5 and self.state == CONNECTED:
            wire = encode(Disconnect(reason, Properties(reason_string=why[:200])), MQTT_5)
            if self.client_max_packet and len(wire) > self.client_max_packet:
                wire = encode(Disconnect(reason), MQTT_5)  # §3.14.2.2.3: no Reason String that would not fit
            if not self.client_max_packet or len(wire) <= self.client_max_packet:
                self._emit(wire)
            if linger:
                self._linger()
                return
        self._close()

    def _linger(self) -> None:
        was = self.state
        self.state = CLOSED  # input is discarded from now on; nothing more is written
        if was == CONNECTED and self._will is not None:
            self._will_due()
        if self.paused:
            self._emit(Do.RESUME_READING)  # read (and discard) what the client still sends
        self._emit(Linger(self.last_rx + LINGER_S))

    def _refuse(self, code: int, level: int) -> None:
        """CONNACK with a failure code, in the format of ``level``, then close."""
        version = MQTT_5 if level >= MQTT_5 else 4
        self._emit(encode(Connack(False, code), version))
        log.info("connection refused", extra={"peer": self.endpoint.peername(), "code": code, "level": level})
        self._close()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self.hub.stats.protocol_errors += 1
        log.warning(
            "mqtt protocol error",
            extra={"peer": self.endpoint.peername(), "client_id": self.client_id, "reason": hex(exc.reason_code),
                   "error": str(exc)},
        )
        if self.state == NEW and self.decoder is not None and self.decoder.version == MQTT_5:
            self._refuse(exc.reason_code, MQTT_5)
            return
        self._disconnect(exc.reason_code, str(exc), linger=exc.reason_code == Reason.RECEIVE_MAXIMUM_EXCEEDED)

    # ------------------------------------------------------------------ packets
    def _handle(self, packet: Packet) -> None:
        if self.state == NEW:
            if isinstance(packet, Connect):
                self._on_connect(packet)
            return
        session = self.session
        assert session is not None
        if isinstance(packet, Publish):
            self._on_publish(packet, session)
        elif isinstance(packet, Puback | Pubcomp):
            session.acked(packet.packet_id)
        elif isinstance(packet, Pubrec):
            if packet.packet_id in session.inflight_out:
                if packet.reason_code >= 0x80:
                    session.acked(packet.packet_id)
                else:
                    session.inflight_out[packet.packet_id] = None
                    if session.shared_inflight:  # received: the client's now, whatever happens to the group
                        session.shared_inflight.pop(packet.packet_id, None)
                    if session.store is not None:  # PUBREL once "released" is durable
                        session.store.released(session, packet.packet_id, self._later(Pubrel(packet.packet_id)))
                    else:
                        self._send(Pubrel(packet.packet_id))
            else:
                self._send(Pubrel(packet.packet_id, Reason.PACKET_ID_NOT_FOUND))
        elif isinstance(packet, Pubrel):
            known = packet.packet_id in session.awaiting_rel
            session.awaiting_rel.discard(packet.packet_id)
            pubcomp = Pubcomp(packet.packet_id, 0 if known else Reason.PACKET_ID_NOT_FOUND)
            if known and session.store is not None:  # PUBCOMP once the id's removal is durable
                session.store.rel_received(session, packet.packet_id, self._later(pubcomp))
            else:
                self._send(pubcomp)
        elif isinstance(packet, Pingreq):
            self._emit(_PINGRESP)
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet, session)
        elif isinstance(packet, Unsubscribe):
            codes = tuple(
                0 if self.hub.unsubscribe(session, f) else Reason.NO_SUBSCRIPTION_EXISTED for f in packet.topic_filters
            )
            self._send(Unsuback(packet.packet_id, codes if self.version == MQTT_5 else ()))
        elif isinstance(packet, Disconnect):
            interval = packet.properties.session_expiry_interval
            if interval and not session.expiry_s:  # §3.14.2.2.2: not a valid DISCONNECT; the will goes out
                self._protocol_error(ProtocolError("Session Expiry Interval set at DISCONNECT after 0 at CONNECT",
                                                   Reason.PROTOCOL_ERROR))
                return
            if packet.reason_code != Reason.DISCONNECT_WITH_WILL and self._will is not None:
                self._will = None
                self.hub.will_discarded(self.client_id)
            if interval is not None:
                session.expiry_s = min(expiry_seconds(interval), self.hub.config.max_session_expiry_s)
            self._close()
        else:  # CONNECT twice, AUTH, or a packet only a server sends
            self._protocol_error(ProtocolError(f"unexpected {type(packet).__name__}", Reason.PROTOCOL_ERROR))

    def _on_connect(self, packet: Connect) -> None:
        hub = self.hub
        terms = admit(hub, packet, self.certificate_user)
        if isinstance(terms, Refused):
            if terms.login:
                hub.stats.refused_logins += 1
            if terms.protocol_error:
                self.version = terms.level
                self._protocol_error(ProtocolError(terms.why, terms.code))
            else:
                self._refuse(terms.code, terms.level)
            return
        will = packet.will
        if will is not None and hub.access is not None and not hub.access.may_publish(
                terms.username, self._peer_host(), will.topic):  # rule 13
            self._refuse(Reason.NOT_AUTHORIZED if packet.protocol_level == MQTT_5 else 0x05, packet.protocol_level)
            return
        self.version = level = packet.protocol_level
        props = packet.properties
        self.client_id = client_id = terms.client_id
        self.username = terms.username
        self.keepalive = terms.keepalive
        if level == MQTT_5 and props.topic_alias_maximum:
            self._out_aliases = OutboundAliases(props.topic_alias_maximum)
        self.client_receive_max = props.receive_maximum or (65535 if level == MQTT_5 else 20)
        self.client_max_packet = max_packet = props.maximum_packet_size or 0
        if max_packet and len(encode(Connack(False, 0, terms.connack_properties), level)) > max_packet:
            # §3.1.2.11.4: nothing larger than the client's Maximum Packet Size is sent, and a CONNACK cannot
            # leave out what it tells: closed without an answer, as Mosquitto does
            log.info("connection closed: the CONNACK is larger than the client's Maximum Packet Size",
                     extra={"peer": self.endpoint.peername(), "client_id": client_id,
                            "maximum_packet_size": max_packet})
            self._close()
            return
        self._will = packet.will
        session, present = hub.attach(self.endpoint, client_id, packet.clean_start, terms.expiry_s, packet.will)
        self.session = session
        self.state = CONNECTED
        self._send(Connack(present, 0, terms.connack_properties))
        log.debug("client connected", extra={"client_id": client_id, "version": level, "session_present": present})
        if present:
            session.resend()

    def _on_publish(self, packet: Publish, session: SessionState) -> None:
        topic = packet.topic
        props = packet.properties
        alias = None
        if props is not NO_PROPERTIES:
            if props.subscription_identifier:  # §3.3.4: only the server sends these
                self._protocol_error(ProtocolError("subscription identifier in PUBLISH", Reason.PROTOCOL_ERROR))
                return
            alias = props.topic_alias
        if alias is not None:
            if alias == 0 or alias > self.hub.config.topic_alias_maximum:
                self._protocol_error(ProtocolError(f"topic alias {alias} out of range", Reason.TOPIC_ALIAS_INVALID))
                return
            if self._aliases is None:
                self._aliases = {}
            if topic:
                self._aliases[alias] = topic
            else:
                known = self._aliases.get(alias)
                if known is None:
                    self._protocol_error(ProtocolError(f"unknown topic alias {alias}", Reason.PROTOCOL_ERROR))
                    return
                topic = known
        if not topic or "+" in topic or "#" in topic:  # valid_topic(), inlined on the hot path
            self._protocol_error(ProtocolError(f"invalid topic name {topic!r}", Reason.TOPIC_NAME_INVALID))
            return
        qos = packet.qos
        pid = packet.packet_id or 0
        if qos:
            pending_in = session.pending_in
            if pid in pending_in:
                self.hub.stats.duplicates += 1
                return
            if qos == 2 and pid in session.awaiting_rel:
                self.hub.stats.duplicates += 1
                self._send(Pubrec(pid))
                return
            if (
                self.version == MQTT_5
                and len(pending_in) + len(session.awaiting_rel) >= self.hub.config.receive_maximum
            ):
                self._protocol_error(ProtocolError("Receive Maximum exceeded", Reason.RECEIVE_MAXIMUM_EXCEEDED))
                return
            pending_in[pid] = None  # PacketIds.add, without the method call (per message)
        arrival = self._arrival_ms
        access = self.hub.access
        if access is not None and not access.may_publish(self.username, self._peer_host(), topic):  # rule 13
            if not qos:
                return
            arrival = REFUSED
        if topic is not packet.topic:  # resolved from a topic alias
            packet = Publish(topic, packet.payload, qos, packet.retain, packet.dup, packet.packet_id, props)
        batch = self._batch
        if batch is None:
            batch = self._batch = []
        batch.append((packet, pid, arrival))

    def _plain_publishes(self, packets: list[Packet], i: int) -> int:
        """``_on_publish`` for a run of the commonest PUBLISHes, from ``packets[i]``, in one loop: QoS 0 or 1,
        no properties, a valid topic name, no ACLs (the caller checks), within Receive Maximum. Returns the
        index of the first packet not taken; ``_on_publish`` decides that one (rules 3-6, 13)."""
        session = self.session
        assert session is not None
        pending_in = session.pending_in
        awaiting_rel = session.awaiting_rel
        stats = self.hub.stats
        limit = self.hub.config.receive_maximum if self.version == MQTT_5 else 0
        arrival = self._arrival_ms
        batch = self._batch
        if batch is None:
            batch = self._batch = []
        take = batch.append
        count = len(packets)
        while i < count:
            packet = packets[i]
            if type(packet) is not Publish or packet.properties is not NO_PROPERTIES:
                return i
            topic = packet.topic
            if not topic or "+" in topic or "#" in topic:
                return i
            qos = packet.qos
            if qos:
                pid = packet.packet_id
                if qos != 1 or pid is None:
                    return i
                if pid in pending_in:  # rule 4: a retry of a message still being appended
                    stats.duplicates += 1
                    i += 1
                    continue
                if limit and len(pending_in) + len(awaiting_rel) >= limit:
                    return i  # rule 5: Receive Maximum exceeded
                pending_in[pid] = None
                take((packet, pid, arrival))
            else:
                take((packet, 0, arrival))
            i += 1
        return i

    def _peer_host(self) -> str:
        peer = self.endpoint.peername()
        return str(peer[0]) if isinstance(peer, tuple | list) and peer else str(peer)

    def _on_subscribe(self, packet: Subscribe, session: SessionState) -> None:
        try:
            access = self.hub.access
            may = None if access is None else (
                lambda topic_filter: access.may_subscribe(self.username, self._peer_host(), topic_filter))
            ack, retained, sub_id = apply_subscribe(self.hub, session, packet, self.version == MQTT_5, may)
        except ProtocolError as exc:  # filters before the bad one stay subscribed; the connection ends
            self._protocol_error(exc)
            return
        if session.store is None:
            self._send(ack)
            for sub in retained:
                self.hub.send_retained(session, sub, sub_id)
            return
        later = self._later(ack)  # SUBACK once the subscription is durable, then the retained messages

        def answer() -> None:
            later()
            for sub in retained:
                self.hub.send_retained(session, sub, sub_id)

        session.store.then(answer)

    def _later(self, packet: Packet) -> Callable[[], None]:
        """Send ``packet`` when called: within a call of ours among its actions, else through the adapter
        (a journal write completed); nothing once CLOSED."""
        return lambda: self._send(packet) if self._out is not None else self.endpoint.send(packet)

    # ------------------------------------------------------------------ the append pipeline (rules 3, 5)
    def _flush_batch(self) -> None:
        batch = self._batch
        assert batch
        self._batch = None
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        # Reads that arrive while an append is running join the waiting batch: one append (one fsync)
        # then covers many reads (group commit), and acks still leave in arrival order.
        if queue and len(queue[-1]) < _MAX_BATCH:
            queue[-1].extend(batch)
        else:
            queue.append(batch)
        self._queued += len(batch)
        hub = self.hub
        stats = hub.stats
        stats.messages_in += len(batch)
        stats.bytes_in += sum([len(m[0].payload) for m in batch])
        if self._queued > stats.max_queued:
            stats.max_queued = self._queued
        if not self._appending:
            self._appending = True
            self._emit(Do.START_APPENDING)
        if not self.paused and self.state != CLOSED and (
            self._queued >= hub.config.receive_maximum or hub.port.backlog_bytes() > hub.config.backlog_high_bytes
        ):
            self.paused = True
            stats.read_pauses += 1
            hub.port.reads_paused(True)
            self._emit(Do.PAUSE_READING)

    def _appended(self, batch: list[Accepted]) -> None:
        session = self.session
        assert session is not None
        self._queued -= len(batch)
        acks: list[Any] = []
        pending_in = session.pending_in
        refused = False
        for msg, pid, arrival in batch:
            if pid:
                pending_in.pop(pid, None)  # PacketIds.discard, without the method call (per message)
                if arrival == REFUSED:  # rule 13: 5.0 PUBACK/PUBREC 0x87 (remaining length 3), in order
                    refused = True
                    if self.version == MQTT_5:
                        acks.append(bytes((0x40 if msg.qos == 1 else 0x50, 3, pid >> 8, pid & 0xFF,
                                           Reason.NOT_AUTHORIZED)))
                        continue
                if msg.qos == 1:
                    acks.append(_PUBACK | pid)
                else:
                    session.awaiting_rel.add(pid)
                    acks.append(_PUBREC | pid)
        conn = session.connection
        if acks and conn is not None:
            data = (b"".join(a if isinstance(a, bytes) else a.to_bytes(4, "big") for a in acks) if refused
                    else struct.pack(f">{len(acks)}I", *acks))  # 4-byte PUBACK/PUBREC each
            if conn is self.endpoint:
                self._send_acks(data)
            else:  # the session moved to a newer connection of the client: the acks go there
                conn.send_acks(data)
        self.hub.deliver(self.client_id, [m for m in batch if m[2] != REFUSED] if refused else batch)
        self._maybe_resume()

    def _append_failed(self, batch: list[Accepted], exc: BaseException) -> None:
        session = self.session
        assert session is not None
        hub = self.hub
        hub.stats.append_errors += 1
        if isinstance(exc, IngestError):  # the sink has logged the storage failure itself
            log.info("append failed; the client is not acknowledged",
                     extra={"client_id": self.client_id, "messages": len(batch)})
        else:
            log.error("durable append failed; the client is not acknowledged",
                      extra={"client_id": self.client_id, "messages": len(batch)}, exc_info=exc)
        if self.version == MQTT_5 and self.state == CONNECTED:
            self._queued -= len(batch)
            # the batch was not stored: PUBACK/PUBREC 0x80 for each QoS 1/2 message, so the client knows now
            for msg, pid, arrival in batch:
                if pid:
                    session.pending_in.discard(pid)
                    reason = Reason.NOT_AUTHORIZED if arrival == REFUSED else Reason.UNSPECIFIED_ERROR
                    self._send((Puback if msg.qos == 1 else Pubrec)(pid, reason))
            self._maybe_resume()
            return
        # 3.1.1 has no negative ack: nothing waiting is acknowledged, the client resends after reconnecting
        queue = self._queue or deque()
        for failed in (batch, *queue):
            for _, pid, _ in failed:
                session.pending_in.discard(pid)
        queue.clear()
        self._queued = 0
        if self.state != CLOSED:
            self._disconnect(Reason.UNSPECIFIED_ERROR, f"append failed: {exc}")

    def _maybe_resume(self) -> None:
        hub = self.hub
        if self.paused and self._queued <= hub.config.receive_maximum // 2:
            self.paused = False
            hub.port.reads_paused(False)
            if self.state != CLOSED:
                self._emit(Do.RESUME_READING)

