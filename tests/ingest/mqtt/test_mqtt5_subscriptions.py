"""MQTT 5 subscription features: Subscription Identifiers, No Local, Retain As Published, Retain Handling,
shared subscriptions ($share/<group>/<filter>), and server-to-client topic aliases. Real clients
(paho-mqtt v5, mosquitto_sub/pub -V 5) where the claim is about clients, raw packets for exact bytes."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ingest.mqtt.codec import encode_publish
from ingest.mqtt.packets import (
    MQTT_5,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from tests.ingest.mqtt.conftest import MqttServer, RawClient, run, wait_until


async def _subscriber(server: MqttServer, client_id: str, *subs: Subscription, sub_id: int = 0,
                      **connect: Any) -> RawClient:
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect(client_id, **connect)
    props = Properties(subscription_identifier=(sub_id,)) if sub_id else Properties()
    raw.send(Subscribe(1, subs, props))
    ack = await raw.recv()
    assert isinstance(ack, Suback) and all(code < 0x80 for code in ack.reason_codes), ack
    return raw


async def _publish(server: MqttServer, *messages: Publish, client_id: str = "pub") -> None:
    pub = await RawClient.open(server.port, MQTT_5)
    await pub.connect(client_id)
    for i, msg in enumerate(messages, start=1):
        pub.send(Publish(msg.topic, msg.payload, 1, msg.retain, False, i, msg.properties))
        assert await pub.recv() == Puback(i)
    await pub.close()


async def test_overlapping_subscriptions_give_one_delivery_with_every_identifier(server: MqttServer) -> None:
    raw = await _subscriber(server, "ids", Subscription("s/#", 1), sub_id=1)
    raw.send(Subscribe(2, (Subscription("s/+", 0),), Properties(subscription_identifier=(268_435_455,))))
    assert await raw.recv() == Suback(2, (0,))
    raw.send(Subscribe(3, (Subscription("other/#", 1),)))  # no identifier
    assert await raw.recv() == Suback(3, (1,))
    await _publish(server, Publish("s/a", b"both"), Publish("other/x", b"none"))
    got = await raw.recv()
    assert isinstance(got, Publish) and got.payload == b"both" and got.qos == 1  # the higher QoS of the two
    assert sorted(got.properties.subscription_identifier) == [1, 268_435_455]
    raw.send(Puback(got.packet_id or 0))
    got = await raw.recv()
    assert isinstance(got, Publish) and got.payload == b"none" and got.properties.subscription_identifier == ()
    await raw.close()


async def test_subscription_identifier_zero_is_a_protocol_error(server: MqttServer) -> None:
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("zero-id")
    raw.send_raw(b"\x82\x09\x00\x01\x02\x0b\x00" b"\x00\x01a\x00")  # SUBSCRIBE with Subscription Identifier 0
    data = await raw.read_until_closed()
    assert data[:1] == b"\xe0" and data[2] == 0x82


def _paho_v5(port: int, client_id: str) -> tuple[paho.Client, list[paho.MQTTMessage], threading.Event]:
    got: list[paho.MQTTMessage] = []
    arrived = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)

    def on_message(_c: paho.Client, _u: object, msg: paho.MQTTMessage) -> None:
        got.append(msg)
        arrived.set()

    client.on_message = on_message
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    return client, got, arrived


async def test_paho_v5_subscription_identifier_and_no_local(server: MqttServer) -> None:
    client, got, _ = await asyncio.to_thread(_paho_v5, server.port, "paho-opts")
    try:
        props = PahoProperties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = 42
        client.subscribe([("chat/#", SubscribeOptions(qos=1, noLocal=True))], properties=props)
        await wait_until(lambda: len(server.hub.tree) == 1, what="subscribed")
        client.publish("chat/room", b"from me", qos=1)  # No Local: not sent back to its publisher
        await _publish(server, Publish("chat/room", b"from someone else"))
        await wait_until(lambda: len(got) >= 1, what="message")
        assert [m.payload for m in got] == [b"from someone else"]
        props_in = got[0].properties
        assert props_in is not None and props_in.SubscriptionIdentifier == [42]  # type: ignore[attr-defined]
    finally:
        client.disconnect()
        client.loop_stop()


async def test_retain_as_published_and_retain_handling(server: MqttServer) -> None:
    await _publish(server, Publish("cfg/a", b"retained", retain=True))
    rap = await _subscriber(server, "rap", Subscription("live/#", 1, retain_as_published=True))
    plain = await _subscriber(server, "plain", Subscription("live/#", 1))
    await _publish(server, Publish("live/x", b"L", retain=True))
    got_rap, got_plain = await rap.recv(), await plain.recv()
    assert isinstance(got_rap, Publish) and got_rap.retain is True
    assert isinstance(got_plain, Publish) and got_plain.retain is False

    # Retain Handling 0: retained messages at every subscribe; 1: only when the subscription is new; 2: never.
    # A live marker published after each SUBSCRIBE shows what came before it.
    for handling, expect_first, expect_again in ((0, True, True), (1, True, False), (2, False, False)):
        raw = await RawClient.open(server.port, MQTT_5)
        await raw.connect(f"rh-{handling}")
        for pid, expected in ((1, expect_first), (2, expect_again)):
            raw.send(Subscribe(pid, (Subscription("cfg/#", 0, retain_handling=handling),)))
            assert await raw.recv() == Suback(pid, (0,))
            await _publish(server, Publish("cfg/marker", f"m{handling}{pid}".encode()), client_id="marker")
            first = await raw.recv()
            assert isinstance(first, Publish)
            if expected:
                assert (first.payload, first.retain) == (b"retained", True), (handling, pid)
                first = await raw.recv()
                assert isinstance(first, Publish)
            assert first.payload == f"m{handling}{pid}".encode(), (handling, pid)
        await raw.close()


async def test_shared_subscription_spreads_messages_over_members(server: MqttServer) -> None:
    a = await _subscriber(server, "member-a", Subscription("$share/workers/jobs/#", 1))
    b = await _subscriber(server, "member-b", Subscription("$share/workers/jobs/#", 0))  # QoS 0 member
    await _publish(server, *(Publish(f"jobs/{i}", str(i).encode()) for i in range(6)))
    seen: dict[str, list[tuple[bytes, int]]] = {"a": [], "b": []}
    for name, raw in (("a", a), ("b", b)):
        for _ in range(3):
            got = await raw.recv()
            assert isinstance(got, Publish)
            seen[name].append((got.payload, got.qos))
            if got.qos:
                raw.send(Puback(got.packet_id or 0))
    assert sorted(p for p, _ in seen["a"] + seen["b"]) == [str(i).encode() for i in range(6)]
    assert {q for _, q in seen["a"]} == {1} and {q for _, q in seen["b"]} == {0}  # each member's QoS


async def test_shared_subscription_with_mosquitto_sub_members(server: MqttServer) -> None:
    port = str(server.port)
    members = [
        await asyncio.create_subprocess_exec(
            "mosquitto_sub", "-p", port, "-V", "5", "-q", "1", "-C", "3", "-i", f"ms-member-{i}",
            "-t", "$share/grp/work/#", stdout=asyncio.subprocess.PIPE,
        )
        for i in range(2)
    ]
    await wait_until(lambda: len(server.hub.shared.get(("grp", "work/#"), _NoMembers()).members) == 2,
                     what="both members subscribed")
    code, _, err = await run("mosquitto_pub", "-p", port, "-V", "5", "-q", "1", "-t", "work/item", "-l",
                             stdin=b"".join(f"w{i}\n".encode() for i in range(6)))
    assert code == 0, err
    outputs = [(await asyncio.wait_for(m.communicate(), 10))[0].decode().split() for m in members]
    assert [len(o) for o in outputs] == [3, 3]
    assert sorted(outputs[0] + outputs[1]) == [f"w{i}" for i in range(6)]


class _NoMembers:
    members: dict[object, object] = {}


async def test_a_leaving_member_s_unacknowledged_messages_go_to_another_member(server: MqttServer) -> None:
    leaving = await _subscriber(server, "leaving", Subscription("$share/g/orders/#", 1))
    staying = await _subscriber(server, "staying", Subscription("$share/g/orders/#", 1))
    await _publish(server, Publish("orders/1", b"first"), Publish("orders/2", b"second"))
    held = await leaving.recv()  # the first message went to "leaving", which never acknowledges it
    assert isinstance(held, Publish) and held.payload == b"first"
    got = await staying.recv()
    assert isinstance(got, Publish) and got.payload == b"second"
    staying.send(Puback(got.packet_id or 0))
    await leaving.close()  # a clean session: it ends with the connection
    again = await staying.recv()
    assert isinstance(again, Publish) and again.payload == b"first" and again.qos == 1
    staying.send(Puback(again.packet_id or 0))
    await staying.close()


async def test_shared_subscriptions_get_no_retained_messages_and_refuse_no_local(server: MqttServer) -> None:
    await _publish(server, Publish("sr/a", b"kept", retain=True))
    raw = await _subscriber(server, "shared-retained", Subscription("$share/g/sr/#", 1))
    await _publish(server, Publish("sr/a", b"live"))
    got = await raw.recv()
    assert isinstance(got, Publish) and got.payload == b"live"  # not the retained one first
    raw.send(Subscribe(2, (Subscription("$share/g/x", 0, no_local=True),)))
    data = await raw.read_until_closed()
    assert data[:1] == b"\xe0" and data[2] == 0x82


async def test_server_topic_aliases_exact_bytes(server: MqttServer) -> None:
    raw = await _subscriber(server, "aliased", Subscription("al/#", 0),
                            properties=Properties(topic_alias_maximum=1))
    await _publish(server, Publish("al/one", b"1"), Publish("al/one", b"2"), Publish("al/two", b"3"))
    first = encode_publish(Publish("al/one", b"1", properties=Properties(topic_alias=1)), True)
    second = encode_publish(Publish("", b"2", properties=Properties(topic_alias=1)), True)
    third = encode_publish(Publish("al/two", b"3"), True)  # the client allows one alias: in use
    assert first == b"\x30\x0d\x00\x06al/one\x03\x23\x00\x011"
    assert second == b"\x30\x07\x00\x00\x03\x23\x00\x012"
    received = b""
    while len(received) < len(first + second + third):
        received += await asyncio.wait_for(raw.reader.read(1024), 5)
    assert received == first + second + third
    await raw.close()
