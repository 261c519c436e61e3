"""PUBLISH in, for ``ConnectionMachine`` (``machine.py``): each PUBLISH a client sends is checked, batched,
appended durably, acknowledged and handed to the hub for routing. Sans-IO like the machine it is part of.

``InboundPublishes`` is a base class of ``ConnectionMachine``: it holds the state of the append pipeline and
takes the rest (the hub, the session, the version, how to emit actions and end the connection) from the
machine, declared below. The rules keep the machine header's numbers.

Rules
-----
3. PUBLISH in: QoS 0/1/2 messages of one connection are appended in arrival order, in batches (one
   batch per read; reads that arrive while an append runs join the waiting batch, up to 4096 messages:
   one append, one fsync, covers many reads). PUBACK (QoS 1) / PUBREC (QoS 2) are sent ONLY after the
   batch's durable append, in arrival order, to the session's current connection. When the append fails
   (the disk is full or failing), nothing of the batch is acknowledged: a 5.0 client gets PUBACK /
   PUBREC 0x80 for each of its QoS 1/2 messages and stays connected; a 3.1.1 client (no negative acks)
   is disconnected, and resends what was not acknowledged when it reconnects. Messages are routed to
   subscribers (and the retained store) after the durable append, after the acks. With durable
   sessions (``session_store.py`` rule 4) the adapter writes the acks ``appended`` returns only once
   what routing journaled is durable (``Hub.journaled``).
4. Duplicates: a QoS 1/2 PUBLISH whose packet id is still being appended is a retry and is dropped; a
   QoS 2 PUBLISH whose id awaits PUBREL gets its PUBREC again and is not appended twice. A Subscription
   Identifier in a PUBLISH is a protocol error.
5. Flow control: reads pause while this connection has ``receive_maximum`` messages waiting for the
   append, or while the ingest backlog is above its high-water mark, and resume when the queue has
   drained to half. A 5.0 client that exceeds the advertised Receive Maximum gets DISCONNECT 0x93.
6. Topic aliases in (5.0): alias 0 or above Topic Alias Maximum → DISCONNECT 0x94; an unknown alias → 0x82.
13. ACLs (``hub.access``): a PUBLISH the ACLs refuse is not stored nor delivered, and logged (rate-limited)
    and counted by the authorizer: QoS 0 is dropped; QoS 1/2 are answered in arrival order with the
    others' acks: 5.0 PUBACK / PUBREC 0x87, 3.1.1 (no negative acks) a plain PUBACK / PUBREC, as
    Mosquitto does.

``_plain_publishes`` takes runs of the commonest PUBLISHes (QoS 0/1, no properties, no ACLs) in one loop and
hands every other case to ``_on_publish``; ``tests/ingest/mqtt/test_machine_plain_publishes.py`` checks that
both decide alike.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from typing import Any

from ingest.errors import IngestError
from ingest.mqtt.actions import CLOSED, CONNECTED, Action, Do, Endpoint
from ingest.mqtt.errors import ProtocolError
from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import MQTT_5, NO_PROPERTIES, Packet, Puback, Publish, Pubrec, Reason
from ingest.mqtt.ports import REFUSED, Accepted
from ingest.mqtt.session_state import NONE_YET, PacketIds, SessionState

__all__ = ["InboundPublishes"]

log = logging.getLogger("ingest.mqtt")

_MAX_BATCH = 4096  # messages per append call
_PUBACK = 0x40020000  # fixed header + remaining length 2; the packet id goes in the low 16 bits
_PUBREC = 0x50020000


class InboundPublishes:
    """The PUBLISH-in rules (module header) of one connection; a base class of ``ConnectionMachine``."""

    __slots__ = ("_aliases", "_appending", "_arrival_ms", "_batch", "_queue", "_queued", "paused")

    # The machine's (machine.py), used here.
    hub: Hub
    endpoint: Endpoint
    session: SessionState | None
    state: int
    version: int
    client_id: str
    username: str | None

    def __init__(self) -> None:
        self.paused = False  # reads are paused (rule 5)
        self._aliases: dict[int, str] | None = None  # the client's topic aliases (rule 6)
        self._arrival_ms = 0  # receive time of the current read, shared by its packets
        self._batch: list[Accepted] | None = None  # this read's accepted PUBLISHes
        self._queue: deque[list[Accepted]] | None = None  # batches waiting for the append loop
        self._queued = 0  # messages accepted and not yet appended (or refused)
        self._appending = False  # the append loop is running (Do.START_APPENDING was returned)

    # ------------------------------------------------------------------ the machine's steps, used here
    def _emit(self, action: Action) -> None:
        raise NotImplementedError  # ConnectionMachine's

    def _send(self, packet: Packet) -> None:
        raise NotImplementedError  # ConnectionMachine's

    def _send_acks(self, data: bytes) -> None:
        raise NotImplementedError  # ConnectionMachine's

    def _disconnect(self, reason: int, why: str, linger: bool = False) -> None:
        raise NotImplementedError  # ConnectionMachine's

    def _protocol_error(self, exc: ProtocolError) -> None:
        raise NotImplementedError  # ConnectionMachine's

    def _peer_host(self) -> str:
        raise NotImplementedError  # ConnectionMachine's

    # ------------------------------------------------------------------ accepting PUBLISHes (rules 3-6, 13)
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
            if pending_in is NONE_YET:
                pending_in = session.pending_in = PacketIds()
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
                if pending_in is NONE_YET:
                    pending_in = session.pending_in = PacketIds()
                pending_in[pid] = None
                take((packet, pid, arrival))
            else:
                take((packet, 0, arrival))
            i += 1
        return i

    # ------------------------------------------------------------------ the append pipeline (rules 3, 5)
    def take_batch(self) -> list[Accepted] | None:
        """The next batch to append (the append loop calls this); None ends the loop."""
        queue = self._queue
        if queue:
            return queue.popleft()  # taken: later reads start a new batch
        self._appending = False
        return None

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
                    session.add_awaiting_rel(pid)
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

