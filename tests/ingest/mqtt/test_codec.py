"""The sans-IO MQTT codec: every packet type round-trips in 3.1.1 and 5.0, whole and one byte at a time;
malformed input raises with the right MQTT 5 reason code."""

from __future__ import annotations

import pytest

from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.errors import MalformedPacket, PacketTooLarge, ProtocolError, UnsupportedProtocol
from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
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
from ingest.mqtt.wire import decode_varint, encode_varint

P5 = Properties(user_property=(("k", "v"), ("k", "w")), reason_string="because")


def packets(version: int) -> list[Packet]:
    v5 = version == MQTT_5
    props = P5 if v5 else Properties()
    pub_props = (
        Properties(payload_format_indicator=1, message_expiry_interval=60, content_type="application/json",
                   response_topic="r/t", correlation_data=b"\x00\x01", topic_alias=3,
                   user_property=(("a", "b"),))
        if v5 else Properties()
    )
    sub = (Subscription("a/+/c", 1, True, True, 2) if v5 else Subscription("a/+/c", 1))
    out: list[Packet] = [
        Connect("dev-1", version, clean_start=False, keepalive=30, username="u", password=b"p\x00w",
                will=Will("last/will", b"gone", 1, True,
                          Properties(will_delay_interval=5) if v5 else Properties()),
                properties=Properties(session_expiry_interval=3600, receive_maximum=10,
                                      topic_alias_maximum=5) if v5 else Properties()),
        Connect("", version),
        Connack(True, 0, Properties(receive_maximum=64, topic_alias_maximum=10, maximum_packet_size=1 << 20,
                                    assigned_client_identifier="x", shared_subscription_available=0)
                if v5 else Properties()),
        Connack(False, 0x86 if v5 else 4),
        Publish("a/b", b"hello", 0),
        Publish("a/b", b"x" * 300, 1, True, True, 7, pub_props),
        Publish("a/b", b"", 2, False, False, 65535),
        Puback(1), Pubrec(2), Pubrel(3), Pubcomp(4),
        Subscribe(9, (sub, Subscription("#", 2)), Properties(subscription_identifier=(12,)) if v5 else Properties()),
        Suback(9, (1, 0x80)),
        Unsubscribe(10, ("a/+/c", "#"), Properties(user_property=(("k", "v"),)) if v5 else props),
        Unsuback(10, (0, 0x11) if v5 else (), props),
        Pingreq(), Pingresp(),
        Disconnect(),
    ]
    if v5:
        out += [Puback(1, 0x10, P5), Pubrec(2, 0x80), Pubrel(3, 0x92), Pubcomp(4, 0, P5),
                Disconnect(0x95, P5), Disconnect(0x04), Auth(0x18, Properties(authentication_method="SCRAM",
                                                                               authentication_data=b"d")), Auth()]
    return out


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_every_packet_round_trips_whole_and_byte_by_byte(version: int) -> None:
    for packet in packets(version):
        wire = encode(packet, version)
        assert Decoder(version).feed(wire) == [packet], packet
        dec = Decoder(version)
        got: list[Packet] = []
        for i in range(len(wire)):
            got += dec.feed(wire[i : i + 1])
        assert got == [packet]
        assert dec.buffered == 0


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_a_stream_of_packets_in_odd_chunks(version: int) -> None:
    pkts = packets(version)
    stream = b"".join(encode(p, version) for p in pkts)
    for chunk in (1, 3, 7, 64, len(stream)):
        dec = Decoder(version)
        got: list[Packet] = []
        for i in range(0, len(stream), chunk):
            got += dec.feed(stream[i : i + chunk])
        assert got == pkts


def test_server_decoder_learns_the_version_from_connect() -> None:
    dec = Decoder()
    stream = encode(Connect("c", MQTT_5), MQTT_5) + encode(Publish("t", b"x", 1, packet_id=1), MQTT_5)
    got = dec.feed(stream)
    assert dec.version == MQTT_5
    assert got[1] == Publish("t", b"x", 1, packet_id=1)


def test_known_bytes_from_the_spec() -> None:
    # 3.1.1 CONNACK accepted; PINGREQ; 3.1.1 PUBACK id 10; remaining-length examples from §2.2.3.
    assert encode(Connack(False, 0), MQTT_311) == b"\x20\x02\x00\x00"
    assert encode(Connack(False, 0), MQTT_5) == b"\x20\x03\x00\x00\x00"
    assert encode(Pingreq()) == b"\xc0\x00"
    assert encode(Puback(10)) == b"\x40\x02\x00\x0a"
    for value, raw in [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"),
                       (16384, b"\x80\x80\x01"), (2097151, b"\xff\xff\x7f"), (2097152, b"\x80\x80\x80\x01"),
                       (268435455, b"\xff\xff\xff\x7f")]:
        assert encode_varint(value) == raw
        assert decode_varint(raw, 0, len(raw)) == (value, len(raw))
    # A v5 PUBACK with success and no properties is the short 2-byte form; the reason byte alone is legal.
    assert Decoder(MQTT_5).feed(b"\x40\x03\x00\x01\x10") == [Puback(1, 0x10)]


def connect_bytes(name: bytes, level: int) -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, 0x02, 0, 60)) + b"\x00\x01c"
    return bytes((0x10, len(body))) + body


@pytest.mark.parametrize(
    ("raw", "error", "reason"),
    [
        (b"\x10\xff\xff\xff\xff\x01", MalformedPacket, 0x81),  # remaining length of 5 bytes
        (b"\x62\x02\x00\x01", ProtocolError, 0x82),  # PUBREL before CONNECT
        (b"G", ProtocolError, 0x82),  # "GET / HTTP/1.1": refused at its first byte
        (connect_bytes(b"MQTT", 6), UnsupportedProtocol, 0x84),
        (connect_bytes(b"MQTT", 3), UnsupportedProtocol, 0x84),
        (connect_bytes(b"HTTP", 4), MalformedPacket, 0x81),
        (b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00", MalformedPacket, 0x81),  # reserved CONNECT flag
    ],
)
def test_malformed_input_raises_with_reason(raw: bytes, error: type[Exception], reason: int) -> None:
    with pytest.raises(error) as info:
        Decoder().feed(raw)
    assert isinstance(info.value, ProtocolError)
    assert info.value.reason_code == reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x36\x05\x00\x01t\x00\x01", 0x81),  # QoS 3
        (b"\x38\x04\x00\x01tx", 0x81),  # DUP at QoS 0
        (b"\x32\x05\x00\x01t\x00\x00", 0x81),  # packet id 0
        (b"\x30\x05\x00\x02\xc3\x28x", 0x81),  # invalid UTF-8 topic
        (b"\x30\x04\x00\x01\x00x", 0x81),  # U+0000 in topic
        (b"\x40\x03\x00\x01\x00", 0x81),  # 3.1.1 PUBACK with trailing byte
        (b"\x80\x03\x00\x01\x00", 0x82),  # SUBSCRIBE with bad fixed-header flags -> malformed
        (b"\x82\x02\x00\x01", 0x82),  # SUBSCRIBE without filters
        (b"\x82\x06\x00\x01\x00\x01#\x03", 0x81),  # subscription QoS 3
        (b"\xf0\x00", 0x81),  # AUTH under 3.1.1
        (b"\x00\x00", 0x81),  # reserved packet type 0
        (b"\x47", 0x81),  # PUBACK with flags 7, refused before its body arrives
    ],
)
def test_malformed_after_connect(raw: bytes, reason: int) -> None:
    dec = Decoder(MQTT_311)
    with pytest.raises(ProtocolError) as info:
        dec.feed(raw)
    expected = 0x81 if raw[0] == 0x80 else reason
    assert info.value.reason_code == expected


def test_v5_property_rules() -> None:
    dec = Decoder(MQTT_5)
    # topic alias (0x23) is a PUBLISH property; in PUBACK it is a protocol error
    with pytest.raises(ProtocolError) as info:
        dec.feed(b"\x40\x07\x00\x01\x00\x03\x23\x00\x01")
    assert info.value.reason_code == 0x82
    # the same non-repeatable property twice
    with pytest.raises(ProtocolError) as info:
        Decoder(MQTT_5).feed(b"\x30\x0a\x00\x01t\x06\x23\x00\x01\x23\x00\x02")
    assert info.value.reason_code == 0x82
    # unknown property identifier
    with pytest.raises(MalformedPacket):
        Decoder(MQTT_5).feed(b"\x30\x06\x00\x01t\x02\x7f\x00")


def test_maximum_packet_size_is_checked_from_the_fixed_header() -> None:
    dec = Decoder(MQTT_311, max_packet_size=100)
    ok = encode(Publish("t", b"x" * 90), MQTT_311)
    assert len(dec.feed(ok)) == 1
    big = encode(Publish("t", b"x" * 200), MQTT_311)
    with pytest.raises(PacketTooLarge) as info:
        dec.feed(big[:4])  # only the header has arrived
    assert info.value.reason_code == 0x95


def test_topic_names_remembered_across_decoders_are_still_checked_and_bounded() -> None:
    # decoded topics are kept by their bytes (codec._TOPICS): a name seen before decodes to the same string,
    # a bad name is refused however many good ones came before, and the table stays bounded
    from ingest.mqtt import codec

    for i in range(codec._TOPICS_MAX + 10):
        (packet,) = Decoder(MQTT_311).feed(encode(Publish(f"t/{i}", b"x"), MQTT_311))
        assert isinstance(packet, Publish) and packet.topic == f"t/{i}"
        assert len(codec._TOPICS) <= codec._TOPICS_MAX
    first, second = Decoder(MQTT_5).feed(encode(Publish("ä/t", b"1"), MQTT_5) + encode(Publish("ä/t", b"2"), MQTT_5))
    assert isinstance(first, Publish) and isinstance(second, Publish) and first.topic == second.topic == "ä/t"
    for bad in (b"\x30\x05\x00\x02\xc3\x28x", b"\x30\x04\x00\x01\x00x"):  # invalid UTF-8, U+0000
        with pytest.raises(MalformedPacket):
            Decoder(MQTT_311).feed(bad)
        assert bad[4:-1] not in codec._TOPICS


def test_remaining_lengths_of_one_to_four_bytes_split_anywhere() -> None:
    payloads = [b"", b"x" * 100, b"y" * 200, b"z" * 20_000, b"w" * 2_100_000]  # lengths of 1, 1, 2, 3, 4 bytes
    wire = b"".join(encode(Publish("a/b", p, 1, packet_id=i + 1), MQTT_5) for i, p in enumerate(payloads))
    for step in (1, 2, 3, 7, 4096):
        dec = Decoder(MQTT_5, max_packet_size=4_000_000)
        head = 30_000 if step < 4096 else len(wire)  # in small steps through the first four headers, then the rest
        got: list[Packet] = []
        for at in range(0, head, step):
            got += dec.feed(wire[at:min(at + step, head)])
        got += dec.feed(wire[head:])
        assert [p.payload for p in got if isinstance(p, Publish)] == payloads
