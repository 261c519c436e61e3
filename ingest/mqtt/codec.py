"""Sans-IO MQTT 3.1.1 / 5.0 codec: ``Decoder.feed(bytes) -> [packets]`` and ``encode(packet, version)``.

No sockets, no asyncio. A server-side decoder starts without a version and learns it from CONNECT's
protocol level (§3.1.2.2); a client-side decoder is given it. Every malformed input raises a
``ProtocolError`` subclass whose ``reason_code`` is the MQTT 5 reason to answer with: 0x81 for bytes that
cannot be a packet, 0x82 for packets that break a rule, 0x95 above the maximum packet size (checked as soon
as the fixed header is read, before the body is buffered).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ingest.mqtt.errors import EncodeError, MalformedPacket, PacketTooLarge, ProtocolError, UnsupportedProtocol
from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from ingest.mqtt.wire import (
    MAX_REMAINING_LENGTH,
    U16,
    binary,
    decode_properties,
    decode_varint,
    enc_bin,
    enc_str,
    encode_properties,
    encode_varint,
    u16,
    utf8,
)

__all__ = ["MAX_REMAINING_LENGTH", "Decoder", "decode_varint", "encode", "encode_publish", "encode_varint"]

_PINGREQ = Pingreq()
_PINGRESP = Pingresp()
# PUBLISH topic names already decoded and checked (well-formed UTF-8, no U+0000), by their bytes: shared by
# every connection, emptied when full.
_TOPICS: dict[bytes, str] = {}
_TOPICS_MAX = 4096


# ---------------------------------------------------------------------------------------------- decoding
class Decoder:
    """Incremental decoder for one connection. ``version`` is None until a CONNECT has been decoded."""

    __slots__ = ("_buf", "_need", "error", "max_packet_size", "version")

    def __init__(self, version: int | None = None, max_packet_size: int = MAX_REMAINING_LENGTH + 5) -> None:
        self._buf = bytearray()
        self._need = 0
        self.version = version
        self.max_packet_size = max_packet_size
        # Set when bad bytes followed good packets in one feed(): those packets are returned, the error is
        # kept here and raised by the next feed(). Nothing after a decoding error is ever decoded.
        self.error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Packet]:
        """Consume ``data``; return every packet now complete, in order."""
        if self.error is not None:
            raise self.error
        out: list[Packet] = []
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return out
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = bytes(data)
        try:
            pos = self._parse(buf, out)
        except ProtocolError as exc:
            if not out:
                raise
            self.error = exc
            return out
        if pos < len(buf):
            self._buf += memoryview(buf)[pos:]
        return out

    def _parse(self, buf: bytes, out: list[Packet]) -> int:
        pos = 0
        n = len(buf)
        limit = self.max_packet_size
        append = out.append
        publish = self._publish
        while True:
            if n - pos < 2:
                if n > pos:
                    self._check_first_byte(buf[pos])
                self._need = 2
                return pos
            first = buf[pos]
            is_publish = first >> 4 == 3 and self.version is not None  # PUBLISH (flags: _publish)
            if not is_publish:
                self._check_first_byte(first)
            # Remaining length: up to 4 bytes after the first (one byte below 128, the common case).
            rl = buf[pos + 1]
            i = pos + 2
            if rl & 0x80:
                rl &= 0x7F
                shift = 7
                while True:
                    if i >= n:
                        self._need = i - pos + 1
                        return pos
                    byte = buf[i]
                    rl |= (byte & 0x7F) << shift
                    i += 1
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 21:
                        raise MalformedPacket("remaining length longer than 4 bytes")
            end = i + rl
            if end - pos > limit:
                raise PacketTooLarge(f"packet of {end - pos} bytes exceeds the maximum of {limit}")
            if end > n:
                self._need = end - pos
                return pos
            append(publish(first & 0x0F, buf, i, end) if is_publish else self._decode(first, buf, i, end))
            pos = end

    def _check_first_byte(self, first: int) -> None:
        """Reject a bad fixed header as soon as its first byte arrives, not after the body."""
        ptype = first >> 4
        if self.version is None and ptype != 1:
            raise ProtocolError("the first packet must be CONNECT")
        if ptype == 3:
            return
        if ptype not in _DECODERS:
            raise MalformedPacket(f"reserved packet type {ptype}")
        expected_flags = 0x02 if ptype in (6, 8, 10) else 0
        if first & 0x0F != expected_flags:
            raise MalformedPacket(f"bad fixed-header flags 0x{first & 0x0F:x} for packet type {ptype}")

    def _decode(self, first: int, buf: bytes, pos: int, end: int) -> Packet:
        ptype = first >> 4
        if ptype == 3:
            return self._publish(first & 0x0F, buf, pos, end)
        if ptype == 1:
            packet = _decode_connect(buf, pos, end)
            self.version = packet.protocol_level
            return packet
        assert self.version is not None  # _check_first_byte let only CONNECT through before a version
        return _DECODERS[ptype](self.version, buf, pos, end)

    def _publish(self, flags: int, buf: bytes, pos: int, end: int) -> Publish:
        version = self.version
        if version is None:
            raise ProtocolError("the first packet must be CONNECT")
        qos = (flags >> 1) & 3
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        dup = bool(flags & 8)
        if dup and not qos:
            raise MalformedPacket("PUBLISH with DUP set at QoS 0")
        # The hot path, inlined: topic (UTF-8 string), packet id, properties, payload.
        if pos + 2 > end:
            raise MalformedPacket("truncated topic length")
        tstart = pos + 2
        pos = tstart + ((buf[pos] << 8) | buf[pos + 1])
        if pos > end:
            raise MalformedPacket("topic runs past the packet")
        raw_topic = buf[tstart:pos]
        topic = _TOPICS.get(raw_topic)
        if topic is None:  # not seen lately: checked, then remembered (devices repeat their topics)
            try:
                topic = raw_topic.decode()
            except UnicodeDecodeError as exc:
                raise MalformedPacket("topic is not well-formed UTF-8") from exc
            if "\x00" in topic:
                raise MalformedPacket("topic contains U+0000")
            if len(_TOPICS) >= _TOPICS_MAX:
                _TOPICS.clear()
            _TOPICS[raw_topic] = topic
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise MalformedPacket("truncated packet identifier")
            packet_id = (buf[pos] << 8) | buf[pos + 1]
            if packet_id == 0:
                raise MalformedPacket("PUBLISH with packet identifier 0")
            pos += 2
        if version == MQTT_5:
            if pos < end and buf[pos] == 0:
                pos += 1
            else:
                props, pos = decode_properties(buf, pos, end, PacketType.PUBLISH)
                return Publish(topic, buf[pos:end], qos, bool(flags & 1), dup, packet_id, props)
        return Publish(topic, buf[pos:end], qos, bool(flags & 1), dup, packet_id)


def _decode_connect(buf: bytes, pos: int, end: int) -> Connect:
    name, pos = utf8(buf, pos, end)
    if pos >= end:
        raise MalformedPacket("CONNECT without protocol level")
    level = buf[pos]
    pos += 1
    if (name, level) not in (("MQTT", MQTT_311), ("MQTT", MQTT_5), ("MQIsdp", 3)):
        if name not in ("MQTT", "MQIsdp"):
            raise MalformedPacket(f"unknown protocol name {name!r}")
        raise UnsupportedProtocol(f"protocol level {level} is not supported", level)
    if pos + 3 > end:
        raise MalformedPacket("truncated CONNECT header")
    cflags = buf[pos]
    keepalive = int(U16.unpack_from(buf, pos + 1)[0])
    pos += 3
    if cflags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    will_flag = bool(cflags & 0x04)
    will_qos = (cflags >> 3) & 3
    will_retain = bool(cflags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS/retain set without a will")
    if will_qos == 3:
        raise MalformedPacket("will QoS 3")
    props = NO_PROPERTIES
    if level == MQTT_5:
        props, pos = decode_properties(buf, pos, end, PacketType.CONNECT)
    client_id, pos = utf8(buf, pos, end)
    will = None
    if will_flag:
        will_props = NO_PROPERTIES
        if level == MQTT_5:
            will_props, pos = decode_properties(buf, pos, end, "will")
        will_topic, pos = utf8(buf, pos, end)
        will_payload, pos = binary(buf, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = None
    password = None
    if cflags & 0x80:
        username, pos = utf8(buf, pos, end)
    elif cflags & 0x40 and level != MQTT_5:
        raise MalformedPacket("password without a username")
    if cflags & 0x40:
        password, pos = binary(buf, pos, end)
    if pos != end:
        raise MalformedPacket("trailing bytes after CONNECT payload")
    return Connect(client_id, level, bool(cflags & 0x02), keepalive, username, password, will, props, name)


def _decode_connack(version: int, buf: bytes, pos: int, end: int) -> Connack:
    if pos + 2 > end:
        raise MalformedPacket("truncated CONNACK")
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set")
    pos += 2
    props = NO_PROPERTIES
    if version == MQTT_5 and pos < end:
        props, pos = decode_properties(buf, pos, end, PacketType.CONNACK)
    _expect_end(pos, end, "CONNACK")
    return Connack(bool(ack_flags & 1), code, props)


def _expect_end(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{what} has trailing bytes")


def _ack_decoder(cls: type[Puback | Pubrec | Pubrel | Pubcomp]) -> Callable[[int, bytes, int, int], Packet]:
    ptype = cls.packet_type

    def decode(version: int, buf: bytes, pos: int, end: int) -> Packet:
        packet_id = u16(buf, pos, end)
        pos += 2
        code = 0
        props = NO_PROPERTIES
        if version == MQTT_5:
            if pos < end:
                code = buf[pos]
                pos += 1
            if pos < end:
                props, pos = decode_properties(buf, pos, end, ptype)
        _expect_end(pos, end, ptype.name)
        return cls(packet_id, code, props)

    return decode


def _id_and_properties(
    version: int, buf: bytes, pos: int, end: int, ptype: PacketType
) -> tuple[int, Properties, int]:
    """The packet identifier and (MQTT 5) properties that open SUBSCRIBE, SUBACK and UNSUBSCRIBE."""
    packet_id = u16(buf, pos, end)
    if version == MQTT_5:
        props, pos = decode_properties(buf, pos + 2, end, ptype)
        return packet_id, props, pos
    return packet_id, NO_PROPERTIES, pos + 2


def _decode_subscribe(version: int, buf: bytes, pos: int, end: int) -> Subscribe:
    packet_id, props, pos = _id_and_properties(version, buf, pos, end, PacketType.SUBSCRIBE)
    subs: list[Subscription] = []
    while pos < end:
        topic_filter, pos = utf8(buf, pos, end)
        if pos >= end:
            raise MalformedPacket("subscription without options")
        opts = buf[pos]
        pos += 1
        qos = opts & 3
        if qos == 3:
            raise MalformedPacket("subscription with QoS 3")
        if version == MQTT_5:
            if opts & 0xC0 or (opts >> 4) & 3 == 3:
                raise MalformedPacket("reserved subscription option bits set")
            subs.append(Subscription(topic_filter, qos, bool(opts & 4), bool(opts & 8), (opts >> 4) & 3))
        else:
            if opts & 0xFC:
                raise MalformedPacket("reserved subscription option bits set")
            subs.append(Subscription(topic_filter, qos))
    if not subs:
        raise ProtocolError("SUBSCRIBE without topic filters", 0x82)
    return Subscribe(packet_id, tuple(subs), props)


def _decode_suback(version: int, buf: bytes, pos: int, end: int) -> Suback:
    packet_id, props, pos = _id_and_properties(version, buf, pos, end, PacketType.SUBACK)
    return Suback(packet_id, tuple(buf[pos:end]), props)


def _decode_unsubscribe(version: int, buf: bytes, pos: int, end: int) -> Unsubscribe:
    packet_id, props, pos = _id_and_properties(version, buf, pos, end, PacketType.UNSUBSCRIBE)
    filters: list[str] = []
    while pos < end:
        topic_filter, pos = utf8(buf, pos, end)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without topic filters", 0x82)
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(version: int, buf: bytes, pos: int, end: int) -> Unsuback:
    packet_id = u16(buf, pos, end)
    pos += 2
    if version != MQTT_5:
        _expect_end(pos, end, "UNSUBACK")
        return Unsuback(packet_id)
    props, pos = decode_properties(buf, pos, end, PacketType.UNSUBACK)
    return Unsuback(packet_id, tuple(buf[pos:end]), props)


def _decode_empty(packet: Packet) -> Callable[[int, bytes, int, int], Packet]:
    def decode(version: int, buf: bytes, pos: int, end: int) -> Packet:
        _expect_end(pos, end, packet.packet_type.name)
        return packet

    return decode


def _reason_decoder(cls: type[Disconnect | Auth]) -> Callable[[int, bytes, int, int], Packet]:
    ptype = cls.packet_type

    def decode(version: int, buf: bytes, pos: int, end: int) -> Packet:
        if version != MQTT_5:
            if ptype is PacketType.AUTH:
                raise MalformedPacket("AUTH exists only in MQTT 5")
            _expect_end(pos, end, ptype.name)
            return cls()
        code = 0
        props = NO_PROPERTIES
        if pos < end:
            code = buf[pos]
            pos += 1
        if pos < end:
            props, pos = decode_properties(buf, pos, end, ptype)
        _expect_end(pos, end, ptype.name)
        return cls(code, props)

    return decode


_DECODERS: dict[int, Callable[[int, bytes, int, int], Packet]] = {
    1: lambda version, buf, pos, end: _decode_connect(buf, pos, end),
    2: _decode_connack,
    4: _ack_decoder(Puback),
    5: _ack_decoder(Pubrec),
    6: _ack_decoder(Pubrel),
    7: _ack_decoder(Pubcomp),
    8: _decode_subscribe,
    9: _decode_suback,
    10: _decode_unsubscribe,
    11: _decode_unsuback,
    12: _decode_empty(_PINGREQ),
    13: _decode_empty(_PINGRESP),
    14: _reason_decoder(Disconnect),
    15: _reason_decoder(Auth),
}


# ---------------------------------------------------------------------------------------------- encoding
def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def encode(packet: Packet, version: int = MQTT_311) -> bytes:
    """Encode ``packet`` for a connection speaking protocol ``version`` (4 = 3.1.1, 5 = 5.0)."""
    v5 = version == MQTT_5
    if isinstance(packet, Publish):
        return encode_publish(packet, v5)
    if isinstance(packet, Puback | Pubrec | Pubrel | Pubcomp):
        first = (packet.packet_type << 4) | (0x02 if isinstance(packet, Pubrel) else 0)
        body = U16.pack(packet.packet_id)
        if v5 and (packet.reason_code or packet.properties is not NO_PROPERTIES):
            body += bytes((packet.reason_code,))
            if packet.properties is not NO_PROPERTIES:
                body += encode_properties(packet.properties, packet.packet_type)
        return _frame(first, body)
    if isinstance(packet, Pingreq):
        return b"\xc0\x00"
    if isinstance(packet, Pingresp):
        return b"\xd0\x00"
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, Connack):
        body = bytes((1 if packet.session_present else 0, packet.reason_code))
        if v5:
            body += encode_properties(packet.properties, PacketType.CONNACK)
        return _frame(0x20, body)
    if isinstance(packet, Subscribe):
        sub_body = bytearray(U16.pack(packet.packet_id))
        if v5:
            sub_body += encode_properties(packet.properties, PacketType.SUBSCRIBE)
        for sub in packet.subscriptions:
            opts = sub.qos
            if v5:
                opts |= (4 if sub.no_local else 0) | (8 if sub.retain_as_published else 0) | (sub.retain_handling << 4)
            sub_body += enc_str(sub.topic_filter) + bytes((opts,))
        return _frame(0x82, bytes(sub_body))
    if isinstance(packet, Suback):
        body = U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties, PacketType.SUBACK)
        return _frame(0x90, body + bytes(packet.reason_codes))
    if isinstance(packet, Unsubscribe):
        body = U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties, PacketType.UNSUBSCRIBE)
        return _frame(0xA2, body + b"".join(enc_str(f) for f in packet.topic_filters))
    if isinstance(packet, Unsuback):
        body = U16.pack(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties, PacketType.UNSUBACK) + bytes(packet.reason_codes)
        return _frame(0xB0, body)
    if isinstance(packet, Disconnect | Auth):
        first = packet.packet_type << 4
        if not v5:
            if isinstance(packet, Auth):
                raise EncodeError("AUTH exists only in MQTT 5")
            return bytes((first, 0))
        if not packet.reason_code and packet.properties is NO_PROPERTIES:
            return bytes((first, 0))
        body = bytes((packet.reason_code,))
        if packet.properties is not NO_PROPERTIES:
            body += encode_properties(packet.properties, packet.packet_type)
        return _frame(first, body)
    raise EncodeError(f"not an MQTT packet: {packet!r}")


def encode_publish(packet: Publish, v5: bool) -> bytes:
    # Every delivery (and every journaled copy for a persistent session) is encoded here: one join, and
    # the fixed header with the topic length in one pack when the remaining length fits one byte.
    qos = packet.qos
    first = 0x30 | (qos << 1) | (8 if packet.dup else 0) | (1 if packet.retain else 0)
    topic = packet.topic.encode("utf-8")
    payload = packet.payload
    props = b"" if not v5 else b"\x00" if packet.properties is NO_PROPERTIES else encode_properties(
        packet.properties, PacketType.PUBLISH)
    size = 2 + len(topic) + len(props) + len(payload)
    if qos:
        if not packet.packet_id:
            raise EncodeError("QoS > 0 PUBLISH needs a packet identifier")
        size += 2
        props = U16.pack(packet.packet_id) + props
    if size < 0x80:
        head = _PUBLISH_HEAD.pack(first, size, len(topic))
    else:
        head = bytes((first,)) + encode_varint(size) + U16.pack(len(topic))
    return b"".join((head, topic, props, payload))


_PUBLISH_HEAD = struct.Struct(">BBH")  # first byte, a one-byte remaining length, topic length


def _encode_connect(packet: Connect) -> bytes:
    level = packet.protocol_level
    v5 = level == MQTT_5
    flags = 0x02 if packet.clean_start else 0
    will = packet.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        flags |= 0x40
    body = bytearray(enc_str(packet.protocol_name) + bytes((level, flags)) + U16.pack(packet.keepalive))
    if v5:
        body += encode_properties(packet.properties, PacketType.CONNECT)
    body += enc_str(packet.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties, "will")
        body += enc_str(will.topic) + enc_bin(will.payload)
    if packet.username is not None:
        body += enc_str(packet.username)
    if packet.password is not None:
        body += enc_bin(packet.password)
    return _frame(0x10, bytes(body))

