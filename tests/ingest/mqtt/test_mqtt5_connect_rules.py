"""MQTT 5 CONNECT/DISCONNECT rules Mosquitto and the spec agree on, byte for byte (raw clients) and with
paho-mqtt v5: enhanced authentication is refused (CONNACK 0x8C; an AUTH packet is a protocol error), a
Receive Maximum or Maximum Packet Size of 0 is a protocol error, nothing larger than the client's Maximum
Packet Size is sent (a DISCONNECT drops its Reason String; a CONNACK that cannot fit is not sent), a
Session Expiry Interval set at DISCONNECT after 0 at CONNECT is a protocol error (the will goes out),
Request Problem Information 0 leaves no Reason String outside DISCONNECT, Request Response Information
gets no Response Information."""

from __future__ import annotations

import asyncio
import threading

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode

from ingest.mqtt.codec import encode
from ingest.mqtt.packets import (
    MQTT_5,
    Auth,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    Subscription,
)
from tests.ingest.mqtt.conftest import MqttServer, RawClient, run

# Sluice's CONNACK (success, no session) with its default advertisement: 24 bytes.
CONNACK_LEN = 24


async def exchange(port: int, connect: Connect, *after: Packet | bytes, answers: int = 1) -> list[bytes]:
    """Send CONNECT (and ``after``), return every packet the server writes until it closes or goes quiet.
    The first ``answers`` packets are awaited up to 10 s each (a loaded machine may take more than the 1 s
    of quiet that ends the exchange); anything after them has that 1 s."""
    client = await RawClient.open(port, MQTT_5)
    client.send(connect)
    for packet in after:
        client.send_raw(packet if isinstance(packet, bytes) else encode(packet, MQTT_5))
    out: list[bytes] = []
    try:
        while True:
            out.append(await client.recv_bytes(timeout=10.0 if len(out) < answers else 1.0))
    except (ConnectionError, TimeoutError):
        pass
    await client.close()
    return out


async def test_an_authentication_method_is_refused_with_0x8c(server: MqttServer) -> None:
    got = await exchange(server.port, Connect("auth-m", MQTT_5, properties=Properties(authentication_method="SCRAM")))
    assert got == [b"\x20\x03\x00\x8c\x00"]  # as Mosquitto 2.0: Bad authentication method, then closed

    def paho_connect() -> int:
        done = threading.Event()
        codes: list[int] = []
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="auth-paho", protocol=paho.MQTTv5)

        def on_connect(c: paho.Client, u: object, f: paho.ConnectFlags, rc: ReasonCode, p: object) -> None:
            codes.append(rc.value)
            done.set()

        client.on_connect = on_connect
        props = PahoProperties(PacketTypes.CONNECT)
        props.AuthenticationMethod = "SCRAM-SHA-256"
        client.connect("127.0.0.1", server.port, properties=props)
        client.loop_start()
        try:
            assert done.wait(10)
        finally:
            client.loop_stop()
        return codes[0]

    assert await asyncio.to_thread(paho_connect) == 0x8C


async def test_an_auth_packet_is_a_protocol_error(server: MqttServer) -> None:
    got = await exchange(server.port, Connect("auth-p", MQTT_5), Auth(0x19, Properties(authentication_method="X")),
                         answers=2)
    assert got[0][:4] == b"\x20\x16\x00\x00"  # connected ...
    assert got[1][0] == 0xE0 and got[1][2] == 0x82 and len(got) == 2  # ... DISCONNECT 0x82, closed


async def test_a_zero_receive_maximum_or_maximum_packet_size_is_a_protocol_error(server: MqttServer) -> None:
    for props in (Properties(receive_maximum=0), Properties(maximum_packet_size=0)):
        assert await exchange(server.port, Connect("zero", MQTT_5, properties=props), Pingreq()) == [
            b"\x20\x03\x00\x82\x00"]  # CONNACK 0x82, closed (Mosquitto closes without a CONNACK)


async def test_nothing_larger_than_the_clients_maximum_packet_size_is_sent(server: MqttServer) -> None:
    # The CONNACK does not fit: not sent, closed (as Mosquitto does).
    small = Connect("tiny", MQTT_5, properties=Properties(maximum_packet_size=CONNACK_LEN - 1))
    assert await exchange(server.port, small, Pingreq(), answers=0) == []
    # It fits, then a malformed packet: the DISCONNECT 0x81 leaves out its Reason String (§3.14.2.2.3).
    fits = Connect("fits", MQTT_5, properties=Properties(maximum_packet_size=CONNACK_LEN + 2))
    got = await exchange(server.port, fits, Pingreq(), b"\x30\x03\x00\x01+", answers=3)
    assert len(got[0]) == CONNACK_LEN and got[1:] == [b"\xd0\x00", b"\xe0\x01\x81"]
    # Without a limit the same DISCONNECT says why.
    got = await exchange(server.port, Connect("unlimited", MQTT_5), b"\x30\x03\x00\x01+", answers=2)
    assert got[1][:3] == bytes((0xE0, len(got[1]) - 2, 0x81)) and b"\x1f" in got[1][3:5]


async def test_a_session_expiry_set_at_disconnect_after_zero_is_a_protocol_error_and_the_will_goes_out(
    server: MqttServer,
) -> None:
    """§3.14.2.2.2, as Mosquitto: DISCONNECT 0x82, the DISCONNECT does not count (the will is published) and
    no session is kept. The client is paho v5; the will is seen by mosquitto_sub -V 5."""
    watcher = asyncio.create_task(run("mosquitto_sub", "-p", str(server.port), "-V", "5", "-t", "expiry/will",
                                      "-C", "1", "-W", "10"))
    while not server.hub.tree.match("expiry/will"):
        await asyncio.sleep(0.01)

    def paho_disconnect() -> None:
        done = threading.Event()
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="expiry-0", protocol=paho.MQTTv5)
        client.will_set("expiry/will", b"gone", qos=1)

        def on_disconnect(c: paho.Client, u: object, f: paho.DisconnectFlags, rc: ReasonCode, p: object) -> None:
            done.set()

        client.on_disconnect = on_disconnect
        client.connect("127.0.0.1", server.port)  # no Session Expiry Interval: 0
        client.loop_start()
        try:
            props = PahoProperties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = 3600
            client.disconnect(properties=props)
            assert done.wait(10)
        finally:
            client.loop_stop()

    await asyncio.to_thread(paho_disconnect)  # (paho reports its own DISCONNECT as a success: the bytes are below)
    code, out, err = await watcher
    assert code == 0, err
    assert out == "gone\n"
    again = await RawClient.open(server.port, MQTT_5)
    ack = await again.connect("expiry-0", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert not ack.session_present  # the session ended with the connection: its expiry stayed 0
    await again.close()
    raw = await exchange(server.port, Connect("expiry-raw", MQTT_5),
                         Disconnect(0, Properties(session_expiry_interval=5)), answers=2)
    assert raw[1][0] == 0xE0 and raw[1][2] == 0x82


async def test_request_problem_and_response_information(server: MqttServer) -> None:
    # Request Problem Information 0: no Reason String on a PUBCOMP (only PUBLISH, CONNACK, DISCONNECT may).
    got = await exchange(server.port, Connect("rpi", MQTT_5, properties=Properties(request_problem_information=0)),
                         Pubrel(77), answers=2)
    assert got[1] == b"\x70\x03\x00\x4d\x92"  # PUBCOMP 0x92 (packet id not found), no properties
    # Request Response Information 1: the CONNACK carries no Response Information (0x1A), as Mosquitto's.
    got = await exchange(server.port, Connect("rri", MQTT_5, properties=Properties(request_response_information=1)))
    plain = await exchange(server.port, Connect("plain", MQTT_5))
    assert got[0] == plain[0] and b"\x1a" not in got[0]


async def test_subscribe_is_unaffected_by_a_large_enough_maximum_packet_size(server: MqttServer) -> None:
    got = await exchange(server.port, Connect("sub-size", MQTT_5, properties=Properties(maximum_packet_size=64)),
                         Subscribe(1, (Subscription("a/#", 1),)), answers=2)
    assert got[1] == b"\x90\x04\x00\x01\x00\x01"


async def test_a_publish_too_large_for_the_client_counts_as_sent(server: MqttServer) -> None:
    """§3.1.2.11.4: discarded "as if it had completed sending": a QoS 1 one leaves the client's Receive
    Maximum window (it held the only slot for ever before: nothing more reached the client; Mosquitto 2.0
    does the same), and a topic alias it would have introduced comes with the next one."""
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("small-sub", properties=Properties(maximum_packet_size=60, receive_maximum=1,
                                                          topic_alias_maximum=4))
    sub.send(Subscribe(1, (Subscription("size/#", 1),)))
    assert (await sub.recv_bytes())[0] == 0x90
    pub = await RawClient.open(server.port, MQTT_5)
    await pub.connect("size-pub")
    for pid, payload in enumerate((b"x" * 100, b"small"), start=1):
        pub.send(Publish("size/t", payload, 1, False, False, pid))
        assert await pub.recv() == Puback(pid)
    got = await sub.recv_bytes()
    # PUBLISH QoS 1, topic "size/t" in full with Topic Alias 1 (0x23 0x0001), packet id 2, "small"
    assert got == b"\x32\x13\x00\x06size/t\x00\x02\x03\x23\x00\x01small"
    assert server.hub.stats.dropped_deliveries == 1
    await sub.close()
    await pub.close()
