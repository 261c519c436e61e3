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
at construction; the hub reaches other connections only through their ``Link`` (``ports.py``). The
PUBLISHes the client sends (rules 3-6, 13) are ``publish_in.py``'s (``InboundPublishes``, a base class
of ``ConnectionMachine``); the states, ``Action``s and ``Endpoint`` are in ``actions.py``.

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
3. PUBLISH in — batches, the durable append, and acks only after it: ``publish_in.py`` rule 3. PUBREL and
   PUBCOMP wait for their journal record and SUBACK for the subscription's when sessions are durable
   (``session_store.py`` rule 4).
4. Duplicates of a PUBLISH, and a Subscription Identifier in one: ``publish_in.py`` rule 4.
   PUBREL → PUBCOMP (5.0: 0x92 if unknown).
5. Flow control (reads paused while appends are behind; Receive Maximum): ``publish_in.py`` rule 5.
6. Topic aliases (5.0) from the client: ``publish_in.py`` rule 6. Outbound aliases when the client allows
   them: ``aliases.py``.
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
   retained messages it says. UNSUBSCRIBE: UNSUBACK (5.0: 0x11 for a filter with no subscription); a
   filter that breaks the topic filter syntax makes it malformed (DISCONNECT 0x81, nothing unsubscribed),
   as for SUBSCRIBE and as Mosquitto answers.
10. Errors after CONNECT: a 5.0 client gets DISCONNECT with the reason (0x81 malformed, 0x82 protocol
    error, 0x95 packet too large, 0x90 bad topic …) before the close; after 0x93 (Receive Maximum
    exceeded: the client is still sending) the connection lingers (``Linger``): nothing more is
    written, what arrives is discarded, and it closes at the client's EOF, after 0.2 s of silence or
    after 2 s, so the client reads the DISCONNECT rather than a reset. A 3.1.1 client's socket is
    closed. Packets after a bad one are never processed; those before it are (and are appended).
11. PUBLISH out: QoS = min(published, granted); at most the client's Receive Maximum QoS 1/2 in flight,
    the rest queued in the session (bounded; ``session_state.py``), and sent as PUBACK/PUBCOMP free the
    window (once per read: the room all of a read's acknowledgements made); a PUBLISH larger than the client's
    Maximum Packet Size is dropped and counted, and behaves as if sent (§3.1.2.11.4): it leaves the
    in-flight window, and a topic alias it would have introduced is introduced by the next one.
12. Once CLOSED nothing more is written (except the CONNACK of a refusal) and input is discarded.
13. ACLs (``hub.access``, with ``security.auth = required``), as Mosquitto applies them: a CONNECT whose
    will topic may not be published to is refused (5.0 0x87, 3.1.1 0x05). PUBLISH: ``publish_in.py`` rule
    13. SUBSCRIBE: ``subscribe.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec

from ingest.mqtt.actions import CLOSED, CONNECTED, NEW, Action, Do, Endpoint, Linger
from ingest.mqtt.aliases import OutboundAliases
from ingest.mqtt.codec import Decoder, encode, encode_publish
from ingest.mqtt.connect import Refused, admit, expiry_seconds
from ingest.mqtt.errors import MalformedPacket, ProtocolError, UnsupportedProtocol
from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import (
    MQTT_5,
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
from ingest.mqtt.ports import Accepted
from ingest.mqtt.publish_in import InboundPublishes
from ingest.mqtt.session_state import SessionState
from ingest.mqtt.subscribe import apply_subscribe
from ingest.mqtt.subscriptions import filter_error

__all__ = ["LINGER_QUIET_S", "LINGER_S", "ConnectionMachine"]

log = logging.getLogger("ingest.mqtt")

_PINGRESP = b"\xd0\x00"
LINGER_S = 2.0  # after DISCONNECT 0x93, at most this long reading and discarding ...
LINGER_QUIET_S = 0.2  # ... or until the client has sent nothing for this long
P = ParamSpec("P")


class ConnectionMachine(InboundPublishes):
    """One client connection's rules (module header). The methods return the actions to carry out."""

    __slots__ = (
        "_out",
        "_out_aliases",
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
        "session",
        "state",
        "username",
        "version",
    )

    def __init__(self, hub: Hub, endpoint: Endpoint, now: float) -> None:
        super().__init__()
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
        self._out_aliases: OutboundAliases | None = None  # when the client accepts aliases from us
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
        session = self.session
        if session is not None and session.queue and self.state == CONNECTED:
            session.pump()  # what the PUBACKs of this read made room for (rule 11), written together
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
            session.acked(packet.packet_id, pump=False)  # the queue is pumped once per read (_receive)
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
            bad = next((why for f in packet.topic_filters if (why := filter_error(f)) is not None), None)
            if bad is not None:  # rule 9, as for SUBSCRIBE
                self._protocol_error(MalformedPacket(bad))
                return
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
