"""The MQTT connection state machine (one per socket) and the session state that outlives it.

Rules
-----
States: NEW → CONNECTED → CLOSED (a DISCONNECT, a protocol error or a lost socket all lead to CLOSED).

* Admission: beyond the hub's connection caps (total, per client address) a socket is closed as soon as
  it is accepted, before CONNECT is read (as Mosquitto does at max_connections); see ``ingest/admission.py``.
* NEW accepts only CONNECT (the codec refuses any other first byte: the socket is closed without an answer).
  A protocol level we do not accept gets CONNACK 0x01 in 3.1.1 format (levels < 5) or 0x84 in 5.0 format,
  then close. An empty client id is refused (3.1.1, 0x02) unless the session is clean; under 5.0 one is
  assigned. Credentials go through the hub's authentication hook (anonymous only when allowed):
  3.1.1 refusals are 0x04 (bad credentials) / 0x05 (not authorised), 5.0 are 0x86 / 0x87. With
  anonymous clients refused and no user database, nobody gets in: 3.1.1 0x05, 5.0 0x86 (0x87 when
  no credentials were sent). No CONNECT within the connect timeout closes the socket.
* Session: clean start drops any stored session. A persistent session (3.1.1 clean session = 0, or 5.0
  Session Expiry Interval > 0) keeps, by client id, its subscriptions, the QoS 1/2 messages queued for the
  client (bounded), outbound messages in flight, and inbound QoS 2 packet ids awaiting PUBREL, until it
  expires (``session_state.py``: 5.0 interval capped at ``max_session_expiry_s``, 3.1.1 ``session_expiry_s``;
  a 5.0 client whose interval was cut is told the granted one in the CONNACK). On reconnect
  in-flight messages are re-sent (DUP=1, or PUBREL after PUBREC) before queued ones. A second connection
  with the same client id takes the session over (the old one gets DISCONNECT 0x8E).
* PUBLISH in: QoS 0/1/2 messages of one connection are appended in arrival order, in batches (one batch
  per socket read). PUBACK (QoS 1) / PUBREC (QoS 2) are sent ONLY after the batch's durable append.
  When the append fails (the disk is full or failing), nothing of the batch is acknowledged: a 5.0
  client gets PUBACK / PUBREC 0x80 for each of its QoS 1/2 messages and stays connected; a 3.1.1
  client (no negative acks) is disconnected, and resends what was not acknowledged when it reconnects.
  A QoS 1/2 PUBLISH whose packet id is still being appended is a retry and is dropped; a QoS 2 PUBLISH
  whose id awaits PUBREL gets its PUBREC again, and is not appended twice. PUBREL → PUBCOMP (5.0: 0x92
  if unknown). Messages are routed to subscribers (and the retained store) after the durable append.
* Flow control: socket reads pause while this connection has ``receive_maximum`` messages waiting for
  the append, or while the ingest backlog is above its high-water mark, and resume when the queue has
  drained to half. A 5.0 client that exceeds the advertised Receive Maximum gets DISCONNECT 0x93.
* Topic aliases (5.0): alias 0 or above Topic Alias Maximum → DISCONNECT 0x94; an unknown alias → 0x82.
  Outbound aliases when the client allows them: ``aliases.py``.
* Keepalive: no packet for 1.5 × keepalive → close (5.0: DISCONNECT 0x8D). Time spent with reads paused
  by backpressure does not count against the client. A keep alive above ``max_keepalive`` (or 0) becomes
  ``max_keepalive``; a 5.0 client is told by Server Keep Alive in the CONNACK.
* Will: due when the connection ends without a normal DISCONNECT (5.0: reason 0x04 also); the hub
  publishes it (appended, then delivered, with its properties) after the Will Delay Interval or when the
  session ends, whichever is first, unless the client reconnects to the session before then.
* SUBSCRIBE: ``subscribe.py`` (identifiers, shared subscriptions, Retain Handling); SUBACK, then the
  retained messages it says.
* Errors after CONNECT: a 5.0 client gets DISCONNECT with the reason (0x81 malformed, 0x82 protocol
  error, 0x95 packet too large, 0x90 bad topic …) before the close; after 0x93 (Receive Maximum
  exceeded: the client is still sending) the server lingers, writing nothing more and reading and
  discarding until the client's EOF, 0.2 s of silence or 2 s, so the client reads the DISCONNECT rather
  than a reset. A 3.1.1 client's socket is closed.
  One bad connection never affects the others.
* PUBLISH out: QoS = min(published, granted); at most the client's Receive Maximum QoS 1/2 in flight,
  the rest queued in the session (bounded; what does not fit is dropped, counted and logged once).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from ingest.errors import IngestError
from ingest.mqtt.aliases import OutboundAliases
from ingest.mqtt.codec import Decoder, encode, encode_publish
from ingest.mqtt.errors import ProtocolError, UnsupportedProtocol
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
from ingest.mqtt.session_state import SessionState
from ingest.mqtt.subscribe import apply_subscribe

if TYPE_CHECKING:
    from ingest.mqtt.hub import Accepted, Hub

__all__ = ["READ_SIZE", "MqttConnection", "SessionState"]  # SessionState: from session_state, re-exported

log = logging.getLogger("ingest.mqtt")

_NEW, _CONNECTED, _CLOSED = 0, 1, 2
_PINGRESP = b"\xd0\x00"
_FOREVER = float("inf")
_LINGER_S = 2.0  # after DISCONNECT 0x93, at most this long reading and discarding ...
_LINGER_QUIET_S = 0.2  # ... or until the client has sent nothing for this long
_MAX_BATCH = 4096  # messages per append call
_PUBACK = 0x40020000  # fixed header + remaining length 2; the packet id goes in the low 16 bits
_PUBREC = 0x50020000
# CONNACK code per ``Hub.authenticate`` refusal: (3.1.1, 5.0). Without a user database nobody is "not
# authorised" under 3.1.1 (as Mosquitto answers); 5.0 says the credentials were not accepted.
_LOGIN_REFUSALS: dict[str, tuple[int, int]] = {
    "anonymous": (0x05, Reason.NOT_AUTHORIZED),
    "no-users": (0x05, Reason.BAD_USERNAME_OR_PASSWORD),
    "bad-credentials": (0x04, Reason.BAD_USERNAME_OR_PASSWORD),
}


# One read buffer shared by every connection: a read is handled synchronously (decoded, and any partial
# packet copied into that connection's decoder) before the next read, so idle connections hold no buffer,
# and one read never brings in more than this many bytes.
READ_SIZE = 64 * 1024
_READ_VIEW = memoryview(bytearray(READ_SIZE))


class MqttConnection(asyncio.BufferedProtocol):
    """One client socket: decodes packets, drives the rules above, writes answers."""

    __slots__ = (
        "_address",
        "_admitted",
        "_aliases",
        "_arrival_ms",
        "_batch",
        "_queue",
        "_queued",
        "_will",
        "_out_aliases",
        "client_id",
        "client_max_packet",
        "client_receive_max",
        "hub",
        "keepalive",
        "last_rx",
        "paused",
        "decoder",
        "session",
        "state",
        "transport",
        "version",
        "worker",
    )

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport | None = None
        self.decoder = Decoder(max_packet_size=hub.config.max_packet_size)
        self.state = _NEW
        self.version = 4
        self.client_id = ""
        self.session: SessionState | None = None
        self.keepalive = 0
        self.last_rx = 0.0
        self.client_receive_max = 65535
        self.client_max_packet = 0
        self._out_aliases: OutboundAliases | None = None  # when the client accepts aliases from us
        self.paused = False
        self.worker: asyncio.Task[None] | None = None
        self._aliases: dict[int, str] | None = None
        self._arrival_ms = 0  # receive time of the current read, shared by its packets
        self._batch: list[Accepted] = []
        self._queue: deque[list[Accepted]] | None = None
        self._queued = 0
        self._will: Will | None = None
        self._address = "?"
        self._admitted = False

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.hub.admission.admit(self._address) is not None:  # over a connection cap: closed unread
            self.state = _CLOSED
            transport.close()
            return
        self._admitted = True
        self.last_rx = time.monotonic()
        self.hub.connections.add(self)
        self.hub.stats.connections_total += 1
        self.hub.port.connections_changed(1)

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ_VIEW

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_READ_VIEW[:nbytes]))

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()  # also while lingering (see _linger)
        if self.state == _CLOSED:
            return
        self._arrival_ms = int(time.time() * 1000)
        try:
            packets = self.decoder.feed(data)
        except UnsupportedProtocol as exc:
            self._refuse(0x01 if exc.level < MQTT_5 else Reason.UNSUPPORTED_PROTOCOL_VERSION, exc.level)
            return
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        for packet in packets:
            if type(packet) is Publish and self.state == _CONNECTED:
                self._on_publish(packet, self.session)  # type: ignore[arg-type]  # set once CONNECTED
            else:
                self._handle(packet)
            if self.state == _CLOSED:
                break
        self._flush_batch()  # publishes accepted before a DISCONNECT (or an error) are still appended
        if self.decoder.error is not None and self.state != _CLOSED:
            self._protocol_error(self.decoder.error)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self.hub.admission.release(self._address)
        was_connected = self.state == _CONNECTED
        self.state = _CLOSED
        self.hub.connections.discard(self)
        self.hub.port.connections_changed(-1)
        if self.paused:
            self.paused = False
            self.hub.port.reads_paused(False)
        if was_connected and self._will is not None:
            self._will_due()
        self._will = None
        if self.session is not None:
            self.hub.detach(self, self.session)

    def pause_writing(self) -> None:  # the client is slow to read what we send
        pass

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------------ writing
    def send(self, packet: Packet) -> None:
        if self.state != _CLOSED and self.transport is not None:
            self.transport.write(encode(packet, self.version))

    def send_publish(self, packet: Publish) -> None:
        if self.state == _CLOSED or self.transport is None:
            return
        if self._out_aliases is not None:
            packet = self._out_aliases.apply(packet)
        wire = encode_publish(packet, self.version == MQTT_5)
        if self.client_max_packet and len(wire) > self.client_max_packet:
            self.hub.stats.dropped_deliveries += 1  # §3.1.2.11.4: too large for this client, discard
            return
        self.transport.write(wire)

    def can_take_qos0(self) -> bool:
        t = self.transport
        return (
            self.state == _CONNECTED and t is not None
            and t.get_write_buffer_size() < self.hub.config.max_write_buffer
        )

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        # connection_lost does the rest; mark now so no further packet is processed
        was = self.state
        self.state = _CLOSED
        if was == _CONNECTED and self._will is not None:
            self._will_due()

    def _will_due(self) -> None:
        will, self._will = self._will, None
        if will is not None:
            self.hub.will_due(self.client_id, will, self.session.expiry_s if self.session is not None else 0.0)

    def _disconnect(self, reason: int, why: str, linger: bool = False) -> None:
        if self.version == MQTT_5 and self.state == _CONNECTED:
            self.send(Disconnect(reason, Properties(reason_string=why[:200])))
            if linger and self.transport is not None:
                self._linger(self.transport)
                return
        self._close()

    def _linger(self, transport: asyncio.Transport) -> None:
        """After DISCONNECT 0x93: write nothing more, but read and discard what the client still sends, so it
        reads our DISCONNECT instead of a reset (closing with unread bytes sends RST). Closed at the client's
        EOF, once it has sent nothing for ``_LINGER_QUIET_S``, or after ``_LINGER_S``."""
        was = self.state
        self.state = _CLOSED  # data_received discards from now on; send() writes nothing
        if was == _CONNECTED and self._will is not None:
            self._will_due()
        if self.paused:
            transport.resume_reading()
        self.last_rx = time.monotonic()
        asyncio.get_running_loop().call_later(_LINGER_QUIET_S, self._end_linger, self.last_rx + _LINGER_S)

    def _end_linger(self, deadline: float) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = time.monotonic()
        if now - self.last_rx >= _LINGER_QUIET_S or now >= deadline:
            transport.close()
        else:
            asyncio.get_running_loop().call_later(_LINGER_QUIET_S, self._end_linger, deadline)

    def _refuse(self, code: int, level: int) -> None:
        """CONNACK with a failure code, in the format of ``level``, then close."""
        if self.transport is not None:
            version = MQTT_5 if level >= MQTT_5 else 4
            self.transport.write(encode(Connack(False, code), version))
        log.info("connection refused", extra={"peer": self._peer(), "code": code, "level": level})
        self._close()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self.hub.stats.protocol_errors += 1
        log.warning(
            "mqtt protocol error",
            extra={"peer": self._peer(), "client_id": self.client_id, "reason": hex(exc.reason_code),
                   "error": str(exc)},
        )
        if self.state == _NEW and self.decoder.version == MQTT_5:
            self._refuse(exc.reason_code, MQTT_5)
            return
        self._disconnect(exc.reason_code, str(exc), linger=exc.reason_code == Reason.RECEIVE_MAXIMUM_EXCEEDED)

    def shutdown(self, reason: int) -> None:
        """The server is going away (5.0 clients are told why)."""
        if self.state != _CLOSED:
            self._disconnect(reason, "server shutting down")

    def take_over(self) -> None:
        """Another connection claimed our client id."""
        self._disconnect(Reason.SESSION_TAKEN_OVER, "session taken over")

    def check_timeout(self, now: float) -> None:
        if self.state == _NEW and now - self.last_rx > self.hub.config.connect_timeout_s:
            self._close()
        elif self.paused:
            self.last_rx = now  # we stopped reading, not the client: its PINGREQs wait in the socket
        elif self.state == _CONNECTED and self.keepalive and now - self.last_rx > 1.5 * self.keepalive:
            log.info("keepalive expired", extra={"client_id": self.client_id})
            self._disconnect(Reason.KEEP_ALIVE_TIMEOUT, "keepalive timeout")

    def _peer(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    # ------------------------------------------------------------------ dispatch
    def _handle(self, packet: Packet) -> None:
        if self.state == _NEW:
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
                    self.send(Pubrel(packet.packet_id))
            else:
                self.send(Pubrel(packet.packet_id, Reason.PACKET_ID_NOT_FOUND))
        elif isinstance(packet, Pubrel):
            known = packet.packet_id in session.awaiting_rel
            session.awaiting_rel.discard(packet.packet_id)
            self.send(Pubcomp(packet.packet_id, 0 if known else Reason.PACKET_ID_NOT_FOUND))
        elif isinstance(packet, Pingreq):
            if self.transport is not None:
                self.transport.write(_PINGRESP)
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet, session)
        elif isinstance(packet, Unsubscribe):
            codes = tuple(
                0 if self.hub.unsubscribe(session, f) else Reason.NO_SUBSCRIPTION_EXISTED for f in packet.topic_filters
            )
            self.send(Unsuback(packet.packet_id, codes if self.version == MQTT_5 else ()))
        elif isinstance(packet, Disconnect):
            if packet.reason_code != Reason.DISCONNECT_WITH_WILL:
                self._will = None
            if packet.properties.session_expiry_interval is not None:
                session.expiry_s = min(_expiry(packet.properties.session_expiry_interval),
                                       self.hub.config.max_session_expiry_s)
            self._close()
        else:  # CONNECT twice, AUTH, or a packet only a server sends
            self._protocol_error(ProtocolError(f"unexpected {type(packet).__name__}", Reason.PROTOCOL_ERROR))

    def _on_connect(self, packet: Connect) -> None:
        level = packet.protocol_level
        hub = self.hub
        if level not in hub.config.protocol_versions:
            self._refuse(0x01 if level < MQTT_5 else Reason.UNSUPPORTED_PROTOCOL_VERSION, level)
            return
        self.version = level
        v5 = level == MQTT_5
        props = packet.properties
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not v5 and not packet.clean_start:
                self._refuse(0x02, level)
                return
            client_id = assigned = "auto-" + uuid.uuid4().hex
        if v5 and props.authentication_method is not None:
            self._refuse(Reason.BAD_AUTHENTICATION_METHOD, level)
            return
        refusal = hub.authenticate(client_id, packet.username, packet.password)
        if refusal is not None:
            hub.stats.refused_logins += 1
            self._refuse(_LOGIN_REFUSALS[refusal][1 if v5 else 0], level)
            return
        if v5 and props.receive_maximum == 0:
            self._protocol_error(ProtocolError("Receive Maximum of 0", Reason.PROTOCOL_ERROR))
            return
        self.client_id = client_id
        cfg = hub.config
        self.keepalive = cfg.granted_keepalive(packet.keepalive)
        if v5 and props.topic_alias_maximum:
            self._out_aliases = OutboundAliases(props.topic_alias_maximum)
        self.client_receive_max = props.receive_maximum or (65535 if v5 else 20)
        self.client_max_packet = props.maximum_packet_size or 0
        self._will = packet.will
        # 5.0: the Session Expiry Interval says how long, up to our maximum (the CONNACK tells the client
        # when it was cut, §3.2.2.3.2); 3.1.1: clean session 0 keeps it for the configured time.
        requested = _expiry(props.session_expiry_interval or 0)
        persistent_311 = 0.0 if packet.clean_start else cfg.session_expiry_s
        expiry = min(requested, cfg.max_session_expiry_s) if v5 else persistent_311
        session, present = hub.attach(self, client_id, packet.clean_start, expiry)
        self.session = session
        self.state = _CONNECTED
        ack_props = NO_PROPERTIES
        if v5:
            ack_props = cfg.connack_properties(
                assigned_client_id=assigned,
                session_expiry=int(expiry) if expiry != requested else None,
                server_keep_alive=self.keepalive if self.keepalive != packet.keepalive else None,
            )
        self.send(Connack(present, 0, ack_props))
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
            if pid in session.pending_in:
                self.hub.stats.duplicates += 1
                return
            if qos == 2 and pid in session.awaiting_rel:
                self.hub.stats.duplicates += 1
                self.send(Pubrec(pid))
                return
            if (
                self.version == MQTT_5
                and len(session.pending_in) + len(session.awaiting_rel) >= self.hub.config.receive_maximum
            ):
                self._protocol_error(ProtocolError("Receive Maximum exceeded", Reason.RECEIVE_MAXIMUM_EXCEEDED))
                return
            session.pending_in.add(pid)
        if topic is not packet.topic:  # resolved from a topic alias
            packet = Publish(topic, packet.payload, qos, packet.retain, packet.dup, packet.packet_id, props)
        self._batch.append((packet, pid, self._arrival_ms))

    def _on_subscribe(self, packet: Subscribe, session: SessionState) -> None:
        try:
            ack, retained, sub_id = apply_subscribe(self.hub, session, packet, self.version == MQTT_5)
        except ProtocolError as exc:  # filters before the bad one stay subscribed; the connection ends
            self._protocol_error(exc)
            return
        self.send(ack)
        for sub in retained:
            self.hub.send_retained(session, sub, sub_id)

    # ------------------------------------------------------------------ the append pipeline
    def _flush_batch(self) -> None:
        batch = self._batch
        if not batch:
            return
        self._batch = []
        if self._queue is None:
            self._queue = deque()
        queue = self._queue
        # Reads that arrive while an append is running join the waiting batch: one append (one fsync)
        # then covers many reads (group commit), and acks still leave in arrival order.
        if queue and len(queue[-1]) < _MAX_BATCH:
            queue[-1].extend(batch)
        else:
            queue.append(batch)
        self._queued += len(batch)
        stats = self.hub.stats
        stats.messages_in += len(batch)
        stats.bytes_in += sum(len(m.payload) for m, _, _ in batch)
        if self._queued > stats.max_queued:
            stats.max_queued = self._queued
        if self.worker is None:
            self.worker = self.hub.spawn(self._drain())
        if not self.paused and self.state != _CLOSED and (
            self._queued >= self.hub.config.receive_maximum
            or self.hub.port.backlog_bytes() > self.hub.config.backlog_high_bytes
        ):
            self.paused = True
            stats.read_pauses += 1
            self.hub.port.reads_paused(True)
            if self.transport is not None:
                self.transport.pause_reading()

    async def _drain(self) -> None:
        queue = self._queue
        assert queue is not None and self.session is not None
        session = self.session
        hub = self.hub
        try:
            while queue:
                batch = queue.popleft()  # taken: later reads start a new batch
                try:
                    await hub.port.ingest(self.client_id, batch)
                except Exception as exc:
                    hub.stats.append_errors += 1
                    if isinstance(exc, IngestError):  # the sink has logged the storage failure itself
                        log.info("append failed; the client is not acknowledged",
                                 extra={"client_id": self.client_id, "messages": len(batch)})
                    else:
                        log.exception("durable append failed; the client is not acknowledged",
                                      extra={"client_id": self.client_id, "messages": len(batch)})
                    if self.version == MQTT_5 and self.state == _CONNECTED:
                        self._queued -= len(batch)
                        self._refuse_batch(batch, session)
                        self._maybe_resume()
                        continue
                    for failed in (batch, *queue):
                        for _, pid, _ in failed:
                            session.pending_in.discard(pid)
                    queue.clear()
                    self._queued = 0
                    if self.state != _CLOSED:
                        self._disconnect(Reason.UNSPECIFIED_ERROR, f"append failed: {exc}")
                    return
                self._queued -= len(batch)
                acks = []
                pending_in = session.pending_in
                for msg, pid, _ in batch:
                    if pid:
                        pending_in.discard(pid)
                        if msg.qos == 1:
                            acks.append(_PUBACK | pid)
                        else:
                            session.awaiting_rel.add(pid)
                            acks.append(_PUBREC | pid)
                conn = session.connection
                if acks and conn is not None and conn.state == _CONNECTED and conn.transport is not None:
                    conn.transport.write(struct.pack(f">{len(acks)}I", *acks))  # 4-byte PUBACK/PUBREC each
                hub.deliver(self.client_id, batch)
                self._maybe_resume()
        finally:
            self.worker = None

    def _refuse_batch(self, batch: list[Accepted], session: SessionState) -> None:
        """5.0: the batch was not stored; each QoS 1/2 message gets PUBACK/PUBREC 0x80 so the client knows
        now (a 3.1.1 client has no negative ack: its connection is closed unacknowledged instead)."""
        for msg, pid, _ in batch:
            if pid:
                session.pending_in.discard(pid)
                self.send((Puback if msg.qos == 1 else Pubrec)(pid, Reason.UNSPECIFIED_ERROR))

    def _maybe_resume(self) -> None:
        hub = self.hub
        if self.paused and self._queued <= hub.config.receive_maximum // 2:
            self.paused = False
            hub.port.reads_paused(False)
            if self.transport is not None and self.state != _CLOSED:
                self.transport.resume_reading()


def _expiry(seconds: int) -> float:
    return _FOREVER if seconds == 0xFFFFFFFF else float(seconds)

