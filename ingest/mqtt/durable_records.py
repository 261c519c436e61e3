"""How durable MQTT state is written as journal records (``journal.py``): keys and values, both ways.

Values hold a message as an MQTT 5 PUBLISH packet (the codec's own bytes: topic, QoS, retain flag,
packet id and every property, subscription identifiers included) behind a small fixed header. Expiry is
kept as wall-clock milliseconds (the hub's monotonic clock does not survive a restart); -1 means never.

Keys (``__mqtt_sessions``): ``s<client id>`` the session (JSON: expiry, when its client left, its
subscriptions with options and identifiers); ``m<packet id: 2 bytes><client id>`` a QoS 1/2 message owed
to the client; ``r<packet id: 2 bytes><client id>`` an inbound QoS 2 packet id awaiting PUBREL;
``d<client id>`` the order of the latest message sent to the client from its queue (every message of the
session up to that order has been sent at least once: the queue goes out in order); ``w<client id>`` the
will of the client's connection (open, or closed with its Will Delay Interval pending), stored as an MQTT
5 CONNECT carrying the will (topic, payload, QoS, retain flag and will properties) behind the wall-clock
time it is due (-1: the connection is open).
Keys (``__mqtt_retained``): the topic name.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Any, Final

from ingest.mqtt.codec import Decoder, encode, encode_publish
from ingest.mqtt.errors import MqttError
from ingest.mqtt.packets import MQTT_5, Connect, Publish, Subscription, Will

__all__ = [
    "QUEUED",
    "RELEASED",
    "BadRecord",
    "SessionRecord",
    "StoredMessage",
    "SENT",
    "StoredWill",
    "awaiting_key",
    "decode_mark",
    "decode_message",
    "decode_retained",
    "decode_session",
    "decode_will",
    "encode_mark",
    "encode_message",
    "encode_retained",
    "encode_session",
    "encode_will",
    "message_key",
    "parse_key",
    "sent_key",
    "session_key",
    "will_key",
]

QUEUED: Final = 0  # not yet acknowledged by the client (sent, if the session's mark says so, or not)
RELEASED: Final = 1  # QoS 2: the client sent PUBREC, we owe it PUBREL only
SENT: Final = 2  # sent at least once when accepted, not yet acknowledged (sent again with DUP=1)
_VERSION: Final = 1
_MESSAGE = struct.Struct(">BBqQ")  # version, state, expiry ms (-1: never), order
_RETAINED = struct.Struct(">Bq")  # version, expiry ms (-1: never)
_PID = struct.Struct(">H")
_MARK = struct.Struct(">Q")
_WILL = struct.Struct(">Bq")  # version, when it is due (wall ms; -1: its connection is open)


class BadRecord(ValueError):
    """A journal record that cannot be read (skipped, logged by the caller)."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    expiry_s: float  # inf: never
    ended_ms: int | None  # when its client left (wall clock); None: connected when written
    subscriptions: tuple[tuple[Subscription, int], ...]  # with their subscription identifier (0: none)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    pid: int
    state: int
    expiry_ms: int  # -1: never
    order: int
    packet: Publish | None  # None once RELEASED


@dataclass(frozen=True, slots=True)
class StoredWill:
    will: Will
    due_ms: int  # -1: its connection was open when written


def will_key(client_id: str) -> bytes:
    return b"w" + client_id.encode()


def session_key(client_id: str) -> bytes:
    return b"s" + client_id.encode()


def message_key(client_id: str, pid: int) -> bytes:
    return b"m" + _PID.pack(pid) + client_id.encode()


def awaiting_key(client_id: str, pid: int) -> bytes:
    return b"r" + _PID.pack(pid) + client_id.encode()


def sent_key(client_id: str) -> bytes:
    return b"d" + client_id.encode()


def encode_mark(order: int) -> bytes:
    return _MARK.pack(order)


def decode_mark(value: bytes) -> int:
    if len(value) != _MARK.size:
        raise BadRecord("sent mark of the wrong size")
    return int(_MARK.unpack(value)[0])


def parse_key(key: bytes) -> tuple[str, str, int]:
    """(kind ``s``/``m``/``r``/``d``/``w``, client id, packet id or 0)."""
    kind = key[:1]
    try:
        if kind in (b"s", b"d", b"w"):
            return kind.decode(), key[1:].decode(), 0
        if kind in (b"m", b"r") and len(key) >= 3:
            return kind.decode(), key[3:].decode(), _PID.unpack_from(key, 1)[0]
    except UnicodeDecodeError as exc:
        raise BadRecord(f"client id is not UTF-8: {exc}") from exc
    raise BadRecord(f"unknown journal key {key[:40]!r}")


def encode_session(record: SessionRecord) -> bytes:
    subs = [[s.topic_filter, s.qos, s.no_local, s.retain_as_published, s.retain_handling, sub_id]
            for s, sub_id in record.subscriptions]
    expiry = None if record.expiry_s == float("inf") else record.expiry_s
    return json.dumps({"v": _VERSION, "expiry_s": expiry, "ended_ms": record.ended_ms, "subs": subs},
                      separators=(",", ":")).encode()


def decode_session(value: bytes) -> SessionRecord:
    try:
        data: Any = json.loads(value)
        expiry = data["expiry_s"]
        subs = tuple(
            (Subscription(str(f), int(q), bool(nl), bool(rap), int(rh)), int(sub_id))
            for f, q, nl, rap, rh, sub_id in data["subs"]
        )
        ended = data["ended_ms"]
        return SessionRecord(float("inf") if expiry is None else float(expiry),
                             None if ended is None else int(ended), subs)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRecord(f"bad session record: {exc}") from exc


def encode_message(packet: Publish | None, pid: int, state: int, expiry_ms: int, order: int) -> bytes:
    head = _MESSAGE.pack(_VERSION, state, expiry_ms, order)
    if packet is None:
        return head
    if packet.packet_id != pid or packet.dup:
        packet = replace(packet, packet_id=pid, dup=False)
    return head + encode_publish(packet, True)


def decode_message(pid: int, value: bytes) -> StoredMessage:
    if len(value) < _MESSAGE.size:
        raise BadRecord("message record too short")
    version, state, expiry_ms, order = _MESSAGE.unpack_from(value)
    if version != _VERSION or state not in (QUEUED, RELEASED, SENT):
        raise BadRecord(f"message record version {version}, state {state}")
    packet = None if state == RELEASED else replace(_publish(value[_MESSAGE.size:]), packet_id=pid)
    return StoredMessage(pid, state, expiry_ms, order, packet)


def encode_retained(packet: Publish, expiry_ms: int) -> bytes:
    pid = 1 if packet.qos else None  # the codec wants one at QoS 1/2; dropped again when read
    return _RETAINED.pack(_VERSION, expiry_ms) + encode_publish(replace(packet, packet_id=pid, dup=False), True)


def decode_retained(value: bytes) -> tuple[Publish, int]:
    if len(value) < _RETAINED.size:
        raise BadRecord("retained record too short")
    version, expiry_ms = _RETAINED.unpack_from(value)
    if version != _VERSION:
        raise BadRecord(f"retained record version {version}")
    return replace(_publish(value[_RETAINED.size:]), packet_id=None), expiry_ms


def _publish(wire: bytes) -> Publish:
    try:
        packets = Decoder(MQTT_5, max_packet_size=len(wire) + 1).feed(wire)
    except MqttError as exc:
        raise BadRecord(f"stored PUBLISH cannot be decoded: {exc}") from exc
    if len(packets) != 1 or not isinstance(packets[0], Publish):
        raise BadRecord("stored value is not one PUBLISH")
    return packets[0]


def encode_will(client_id: str, will: Will, due_ms: int) -> bytes:
    return _WILL.pack(_VERSION, due_ms) + encode(Connect(client_id, MQTT_5, will=will), MQTT_5)


def decode_will(value: bytes) -> StoredWill:
    if len(value) < _WILL.size:
        raise BadRecord("will record too short")
    version, due_ms = _WILL.unpack_from(value)
    if version != _VERSION:
        raise BadRecord(f"will record version {version}")
    wire = value[_WILL.size:]
    try:
        packets = Decoder(max_packet_size=len(wire) + 1).feed(wire)
    except MqttError as exc:
        raise BadRecord(f"stored will cannot be decoded: {exc}") from exc
    if len(packets) != 1 or not isinstance(packets[0], Connect) or packets[0].will is None:
        raise BadRecord("stored value is not one CONNECT with a will")
    return StoredWill(packets[0].will, due_ms)
