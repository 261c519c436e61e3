"""MQTT 5 message properties end to end (ingest/mqtt/properties.py): they reach subscribers (live, queued,
retained, will), are stored as record headers, and messages expire (queue, retained store, remaining
interval on delivery). Real clients (mosquitto_pub/sub -V 5 -D, paho-mqtt v5) and raw packets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.protocol.records import RecordSpec
from broker.server.kafka import KafkaServer, KafkaServerConfig
from ingest.mqtt.packets import (
    MQTT_5,
    Connect,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from ingest.mqtt.properties import from_headers, to_headers
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import MqttServer, RawClient, StartServer, run, wait_until

FULL = Properties(
    payload_format_indicator=1, message_expiry_interval=100, content_type="text/plain", response_topic="reply/7",
    correlation_data=b"\x00\xffid", user_property=(("k", "v"), ("k", "v2"), ("source", "mine")),
)


def test_headers_round_trip_and_names() -> None:
    headers = to_headers(FULL)
    assert headers == (
        ("mqtt.payload_format_indicator", b"1"), ("mqtt.message_expiry_interval", b"100"),
        ("mqtt.content_type", b"text/plain"), ("mqtt.response_topic", b"reply/7"),
        ("mqtt.correlation_data", b"\x00\xffid"), ("k", b"v"), ("k", b"v2"), ("mqtt.user.source", b"mine"),
    )
    sluice_own = (("source", b"mqtt:default"), ("device", b"d"), ("mqtt_topic", b"t"))
    assert from_headers(sluice_own + headers) == (FULL, 0)
    # a record produced over Kafka: any UTF-8 header becomes a user property; one that cannot is counted
    assert from_headers((("trace", b"abc"), ("blob", b"\xff"), ("empty", None))) == (
        Properties(user_property=(("trace", "abc"), ("empty", ""))), 1)


async def test_mosquitto_clients_see_every_property_and_the_log_keeps_them(server: MqttServer) -> None:
    port = str(server.port)
    sub = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", port, "-V", "5", "-C", "1", "-q", "1", "-t", "props/#",
        "-F", "%t|%p|%C|%D|%E|%F|%P|%R", stdout=asyncio.subprocess.PIPE,
    )
    await wait_until(lambda: len(server.hub.tree) == 1, what="subscribed")
    code, _, err = await run(
        "mosquitto_pub", "-p", port, "-V", "5", "-q", "1", "-t", "props/a", "-m", "hello", "-i", "prop-pub",
        "-D", "publish", "content-type", "text/plain", "-D", "publish", "correlation-data", "req-42",
        "-D", "publish", "response-topic", "reply/a", "-D", "publish", "message-expiry-interval", "600",
        "-D", "publish", "payload-format-indicator", "1", "-D", "publish", "user-property", "site", "north",
    )
    assert code == 0, err
    out, _ = await asyncio.wait_for(sub.communicate(), 10)
    assert out.decode().strip() == "props/a|hello|text/plain|req-42|600|1|site:north|reply/a"
    (record,) = [r for r in records(server.store, "mqtt") if r.value == b"hello"]
    assert list(record.headers) == [
        ("source", b"mqtt:default"), ("device", b"prop-pub"), ("mqtt_topic", b"props/a"),
        ("mqtt.payload_format_indicator", b"1"), ("mqtt.message_expiry_interval", b"600"),
        ("mqtt.content_type", b"text/plain"), ("mqtt.response_topic", b"reply/a"),
        ("mqtt.correlation_data", b"req-42"), ("site", b"north"),
    ]


OnMessage = Callable[[paho.Client, Any, paho.MQTTMessage], None]


def _prop(msg: paho.MQTTMessage, name: str) -> Any:
    return getattr(msg.properties, name)


def _paho(port: int, client_id: str, on_message: OnMessage) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.on_message = on_message
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    return client


async def test_request_response_between_two_paho_v5_clients(server: MqttServer) -> None:
    """The responder answers on the request's Response Topic with its Correlation Data."""
    replies: list[tuple[str, bytes, bytes]] = []
    got_reply = threading.Event()

    def respond(client: paho.Client, _: object, msg: paho.MQTTMessage) -> None:
        props = PahoProperties(PacketTypes.PUBLISH)
        props.CorrelationData = _prop(msg, "CorrelationData")
        client.publish(_prop(msg, "ResponseTopic"), b"pong:" + msg.payload, qos=1, properties=props)

    def on_reply(client: paho.Client, _: object, msg: paho.MQTTMessage) -> None:
        replies.append((msg.topic, bytes(msg.payload), _prop(msg, "CorrelationData")))
        got_reply.set()

    responder = await asyncio.to_thread(_paho, server.port, "responder", respond)
    requester = await asyncio.to_thread(_paho, server.port, "requester", on_reply)
    try:
        responder.subscribe("service/echo", qos=1)
        requester.subscribe("replies/requester", qos=1)
        await wait_until(lambda: len(server.hub.tree) == 2, what="subscribed")
        props = PahoProperties(PacketTypes.PUBLISH)
        props.ResponseTopic = "replies/requester"
        props.CorrelationData = b"\x01call-1"
        requester.publish("service/echo", b"ping", qos=1, properties=props)
        assert await asyncio.to_thread(got_reply.wait, 10)
        assert replies == [("replies/requester", b"pong:ping", b"\x01call-1")]
    finally:
        for client in (responder, requester):
            client.disconnect()
            client.loop_stop()


async def test_queued_messages_keep_properties_expire_and_carry_the_remaining_interval(server: MqttServer) -> None:
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("away", clean_start=False, properties=Properties(session_expiry_interval=300))
    sub.send(Subscribe(1, (Subscription("q/#", 1),)))
    assert await sub.recv() == Suback(1, (1,))
    await sub.close()
    await wait_until(lambda: server.hub.sessions["away"].connection is None, what="offline")

    pub = await RawClient.open(server.port, MQTT_5)
    await pub.connect("pub")
    loop = asyncio.get_running_loop()
    sent = loop.time()
    pub.send(Publish("q/short", b"gone", 1, packet_id=1, properties=Properties(message_expiry_interval=1)))
    pub.send(Publish("q/long", b"kept", 1, packet_id=2, properties=FULL))
    assert [await pub.recv(), await pub.recv()] == [Puback(1), Puback(2)]
    await wait_until(lambda: server.hub.stats.messages_expired == 1, what="the short one expired")

    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("away", clean_start=False, properties=Properties(session_expiry_interval=300))
    got = await sub.recv()
    queued_s = loop.time() - sent  # at least as long as it waited in the queue (the 1 s expiry, then the sweep)
    assert isinstance(got, Publish) and (got.topic, got.payload) == ("q/long", b"kept")
    assert got.properties.message_expiry_interval is not None
    assert 100 - queued_s - 0.5 <= got.properties.message_expiry_interval < 100  # the remaining interval (rounded)
    assert got.properties == replace(FULL, message_expiry_interval=got.properties.message_expiry_interval)
    sub.send(Puback(got.packet_id or 0))
    await sub.close()
    await pub.close()


async def test_retained_messages_keep_properties_and_expire(server: MqttServer) -> None:
    pub = await RawClient.open(server.port, MQTT_5)
    await pub.connect("retainer")
    loop = asyncio.get_running_loop()
    sent = loop.time()
    pub.send(Publish("r/short", b"1", 1, retain=True, packet_id=1, properties=Properties(message_expiry_interval=1)))
    pub.send(Publish("r/long", b"2", 1, retain=True, packet_id=2,
                     properties=Properties(content_type="c", message_expiry_interval=50)))
    assert [await pub.recv(), await pub.recv()] == [Puback(1), Puback(2)]
    await wait_until(lambda: len(server.hub.retained) == 1, what="the short one expired from the retained store")
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("late")
    sub.send(Subscribe(1, (Subscription("r/#", 1),)))
    assert await sub.recv() == Suback(1, (1,))
    got = await sub.recv()
    retained_s = loop.time() - sent
    assert isinstance(got, Publish) and (got.topic, got.payload, got.retain) == ("r/long", b"2", True)
    assert got.properties.content_type == "c"
    assert got.properties.message_expiry_interval is not None
    assert 50 - retained_s - 0.5 <= got.properties.message_expiry_interval < 50  # the remaining interval (rounded)
    await sub.close()
    await pub.close()


async def test_will_properties_reach_subscribers(start_server: StartServer) -> None:
    server = await start_server()
    watcher = await RawClient.open(server.port, MQTT_5)
    await watcher.connect("watcher")
    watcher.send(Subscribe(1, (Subscription("wills/#", 1),)))
    assert await watcher.recv() == Suback(1, (1,))
    will_props = Properties(content_type="application/json", response_topic="wills/ack",
                            user_property=(("reason", "lost"),))
    dying = await RawClient.open(server.port, MQTT_5)
    await dying.connect("dying", will=Will("wills/dying", b"{}", 1, False, will_props))
    await dying.close()  # no DISCONNECT: the will is published
    got = await watcher.recv()
    assert isinstance(got, Publish) and got.topic == "wills/dying" and got.properties == will_props
    (record,) = [r for r in records(server.store, "mqtt") if r.value == b"{}"]
    assert ("mqtt.content_type", b"application/json") in record.headers
    assert ("mqtt.user.reason", b"lost") in record.headers
    await watcher.close()


# ---------------------------------------------------------------------------------------------- will delay
async def _watch(server: MqttServer, client_id: str) -> RawClient:
    watcher = await RawClient.open(server.port, MQTT_5)
    await watcher.connect(client_id)
    watcher.send(Subscribe(1, (Subscription("wills/#", 1),)))
    assert await watcher.recv() == Suback(1, (1,))
    return watcher


async def _connect_with_will(server: MqttServer, client_id: str, delay: int, session_expiry: int,
                             clean_start: bool = True) -> RawClient:
    client = await RawClient.open(server.port, MQTT_5)
    will = Will(f"wills/{client_id}", b"gone", 1, False, Properties(will_delay_interval=delay, content_type="t"))
    await client.connect(client_id, clean_start=clean_start, will=will,
                         properties=Properties(session_expiry_interval=session_expiry))
    return client


async def test_will_delay_is_cut_short_by_the_session_expiring(server: MqttServer) -> None:
    watcher = await _watch(server, "w-watch-1")
    dying = await _connect_with_will(server, "short-session", delay=600, session_expiry=1)
    await dying.close()
    await wait_until(lambda: "short-session" in server.hub.delayed_wills, what="will delayed")
    got = await watcher.recv(timeout=15)  # at the session's end (1 s, the sweep is once a second), not after 600 s
    assert isinstance(got, Publish) and got.topic == "wills/short-session" and got.properties.content_type == "t"
    assert got.properties.will_delay_interval is None  # not a PUBLISH property
    # The will and the session end fall due together; the sweep may take the will a turn before the session.
    await wait_until(lambda: "short-session" not in server.hub.sessions, what="session ended")


async def test_will_delay_passes_then_the_will_is_published(server: MqttServer) -> None:
    watcher = await _watch(server, "w-watch-2")
    dying = await _connect_with_will(server, "late-will", delay=1, session_expiry=300)
    await dying.close()
    await wait_until(lambda: "late-will" in server.hub.delayed_wills, what="will delayed")
    assert server.hub.stats.wills_published == 0
    got = await watcher.recv(timeout=15)  # after the 1 s delay; the deadline is for a loaded machine
    assert isinstance(got, Publish) and got.topic == "wills/late-will"
    assert server.hub.stats.wills_published == 1


async def test_will_is_cancelled_when_the_client_reconnects_in_time(server: MqttServer) -> None:
    dying = await _connect_with_will(server, "comes-back", delay=60, session_expiry=300)
    await dying.close()
    await wait_until(lambda: "comes-back" in server.hub.delayed_wills, what="will delayed")
    back = await RawClient.open(server.port, MQTT_5)
    ack = await back.connect("comes-back", clean_start=False, properties=Properties(session_expiry_interval=300))
    assert ack.session_present
    assert "comes-back" not in server.hub.delayed_wills and server.hub.stats.wills_published == 0
    await back.close()


async def test_a_clean_start_ends_the_old_session_and_sends_its_delayed_will(server: MqttServer) -> None:
    watcher = await _watch(server, "w-watch-3")
    dying = await _connect_with_will(server, "restarts", delay=60, session_expiry=300)
    await dying.close()
    await wait_until(lambda: "restarts" in server.hub.delayed_wills, what="will delayed")
    fresh = await RawClient.open(server.port, MQTT_5)
    ack = await fresh.connect("restarts", clean_start=True)
    assert not ack.session_present
    got = await watcher.recv(timeout=5)
    assert isinstance(got, Publish) and got.topic == "wills/restarts"
    await fresh.close()


# ---------------------------------------------------------------------------------------------- keep alive
async def test_server_keep_alive_caps_the_client_keep_alive(start_server: StartServer) -> None:
    server = await start_server(max_keepalive_s=100)
    for asked, told in ((0, 100), (101, 100), (65535, 100), (100, None), (30, None)):
        raw = await RawClient.open(server.port, MQTT_5)
        ack = await raw.connect(f"ka-{asked}", keepalive=asked)
        assert ack.properties.server_keep_alive == told, asked
        (conn,) = [c for c in server.hub.connections if c.client_id == f"ka-{asked}"]
        assert conn.keepalive == (told or asked)
        await raw.close()


async def test_server_keep_alive_exact_connack_bytes(start_server: StartServer) -> None:
    server = await start_server(max_keepalive_s=10, receive_maximum=20, topic_alias_maximum=10,
                                max_packet_bytes=1000)
    raw = await RawClient.open(server.port, MQTT_5)
    raw.send(Connect("exact", MQTT_5, keepalive=60))
    data = await asyncio.wait_for(raw.reader.read(200), 5)
    # CONNACK: flags 0, reason 0, then properties in identifier order: Server Keep Alive 10 (0x13),
    # Receive Maximum 20 (0x21), Topic Alias Maximum 10 (0x22), Retain Available (0x25), Maximum Packet
    # Size (0x27), Wildcard / Subscription Identifier / Shared Subscription Available (0x28, 0x29, 0x2A).
    props = (b"\x13\x00\x0a" b"\x21\x00\x14" b"\x22\x00\x0a" b"\x25\x01" b"\x27\x00\x00\x03\xe8"
             b"\x28\x01" b"\x29\x01" b"\x2a\x01")
    assert data == b"\x20" + bytes([3 + len(props)]) + b"\x00\x00" + bytes([len(props)]) + props
    await raw.close()


# ---------------------------------------------------------------------------------------------- from the log
async def test_a_record_written_by_others_reaches_mqtt_subscribers_with_its_properties(
    start_server: StartServer,
) -> None:
    server = await start_server(deliver_from_topics=["commands", "mqtt"])  # "mqtt": where MQTT publishes go
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("device-7")
    sub.send(Subscribe(1, (Subscription("cmd/#", 1),), Properties(subscription_identifier=(9,))))
    assert await sub.recv() == Suback(1, (1,))
    headers = (("mqtt_topic", b"cmd/7"), ("mqtt.content_type", b"application/json"),
               ("mqtt.response_topic", b"replies/7"), ("mqtt.correlation_data", b"\x00c1"),
               ("mqtt.message_expiry_interval", b"120"), ("trace-id", b"t-1"))
    await server.store.append_records("commands", [RecordSpec(b"no topic", b"k")])  # skipped, counted
    await server.store.append_records("commands", [RecordSpec(b'{"open": true}', b"k", headers)])
    got = await sub.recv()
    assert isinstance(got, Publish) and (got.topic, got.payload, got.qos) == ("cmd/7", b'{"open": true}', 1)
    assert got.properties == Properties(
        content_type="application/json", response_topic="replies/7", correlation_data=b"\x00c1",
        message_expiry_interval=120, subscription_identifier=(9,), user_property=(("trace-id", "t-1"),))
    assert server.hub.stats.log_records_skipped == 1 and server.hub.stats.log_records_delivered == 1
    # what MQTT clients publish into a followed topic is not delivered twice
    pub = await RawClient.open(server.port, MQTT_5)
    await pub.connect("pub")
    pub.send(Publish("cmd/8", b"once", 1, packet_id=1))
    assert await pub.recv() == Puback(1)
    got = await sub.recv()
    assert isinstance(got, Publish) and got.payload == b"once"
    sub.send(Puback(got.packet_id or 0))
    await server.store.append_records("commands", [RecordSpec(b"last", b"k", (("mqtt_topic", b"cmd/9"),))])
    got = await sub.recv()
    assert isinstance(got, Publish) and got.payload == b"last"  # not a second "once" before it


async def test_kcat_sees_the_properties_and_its_records_reach_mqtt_with_them(start_server: StartServer) -> None:
    """A Kafka client (kcat, librdkafka) reads the properties as headers, and produces a record whose
    headers an MQTT 5 subscriber (mosquitto_sub -V 5) receives as properties."""
    server = await start_server(deliver_from_topics=["commands"])
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    kafka = KafkaServer(server.store, coordinator, KafkaServerConfig(port=0, advertised_host="127.0.0.1"))
    await kafka.start()
    bootstrap = f"127.0.0.1:{kafka.port}"
    try:
        code, _, err = await run(
            "mosquitto_pub", "-p", str(server.port), "-V", "5", "-q", "1", "-t", "devices/x", "-m", "v",
            "-D", "publish", "content-type", "text/plain", "-D", "publish", "user-property", "site", "north",
        )
        assert code == 0, err
        code, out, err = await run("kcat", "-b", bootstrap, "-C", "-t", "mqtt", "-o", "beginning", "-e", "-q",
                                   "-f", "%h\\n")
        assert code == 0, err
        assert out.strip().endswith("mqtt_topic=devices/x,mqtt.content_type=text/plain,site=north"), out

        sub = await asyncio.create_subprocess_exec(
            "mosquitto_sub", "-p", str(server.port), "-V", "5", "-q", "1", "-C", "1", "-t", "cmd/#",
            "-F", "%t|%p|%C|%R|%P", stdout=asyncio.subprocess.PIPE,
        )
        await wait_until(lambda: len(server.hub.tree) == 1, what="subscribed")
        code, _, err = await run(
            "kcat", "-b", bootstrap, "-P", "-t", "commands", "-H", "mqtt_topic=cmd/7",
            "-H", "mqtt.content_type=application/json", "-H", "mqtt.response_topic=replies/7",
            "-H", "trace=abc", stdin=b'{"open":1}\n',
        )
        assert code == 0, err
        out_sub, _ = await asyncio.wait_for(sub.communicate(), 15)
        assert out_sub.decode().strip() == 'cmd/7|{"open":1}|application/json|replies/7|trace:abc'
    finally:
        await kafka.stop()
        await coordinator.stop()


def test_headers_too_long_for_mqtt_are_skipped() -> None:
    long = b"x" * 65_536
    assert from_headers((("big", long), ("mqtt.correlation_data", long), ("ok", b"1"))) == (
        Properties(user_property=(("ok", "1"),)), 2)


def test_an_expiry_header_of_non_ascii_digits_is_skipped() -> None:
    """"²" and "١" are digits to str.isdigit but not to int(): the header is one of ours with a value not
    valid for it (skipped and counted), not a ValueError."""
    for value in ("\u00b2".encode(), "\u0661\u0662".encode(), b"12\xc2\xb2"):
        assert from_headers((("mqtt.message_expiry_interval", value), ("ok", b"1"))) == (
            Properties(user_property=(("ok", "1"),)), 1)


async def test_a_record_with_a_hostile_expiry_header_is_delivered_once_and_the_next_one_too(
    start_server: StartServer,
) -> None:
    """Before: from_headers raised on "²", the log follower logged a traceback and retried the same
    offset every second: the record and every later one never reached subscribers."""
    server = await start_server(deliver_from_topics=["commands"])
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("device-8")
    sub.send(Subscribe(1, (Subscription("cmd/#", 1),)))
    assert await sub.recv() == Suback(1, (1,))
    hostile = (("mqtt_topic", b"cmd/1"), ("mqtt.message_expiry_interval", "\u00b2".encode()))
    await server.store.append_records("commands", [RecordSpec(b"first", b"k", hostile)])
    await server.store.append_records("commands", [RecordSpec(b"second", b"k", (("mqtt_topic", b"cmd/2"),))])
    got = [await sub.recv(), await sub.recv()]
    assert [(p.topic, p.payload, p.properties.message_expiry_interval) for p in got if isinstance(p, Publish)] == [
        ("cmd/1", b"first", None), ("cmd/2", b"second", None)]
    assert server.hub.stats.log_headers_skipped == 1 and server.hub.stats.log_records_delivered == 2


async def test_a_record_whose_delivery_fails_is_skipped_and_later_records_still_arrive(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule 4 of from_log: a failure nobody foresaw (injected here into the header conversion) costs
    that record only; before, the follower retried the same offset every second and nothing after it
    ever reached a subscriber."""
    import ingest.mqtt.from_log as from_log

    real = from_log.from_headers

    def failing(headers: Any) -> Any:
        if any(name == "poison" for name, _ in headers):
            raise RuntimeError("injected")
        return real(headers)

    monkeypatch.setattr(from_log, "from_headers", failing)
    server = await start_server(deliver_from_topics=["commands"])
    sub = await RawClient.open(server.port, MQTT_5)
    await sub.connect("device-8")
    sub.send(Subscribe(1, (Subscription("cmd/#", 0),)))
    assert await sub.recv() == Suback(1, (0,))
    await server.store.append_records("commands", [
        RecordSpec(b"bad", b"k", (("mqtt_topic", b"cmd/1"), ("poison", b"1"))),
        RecordSpec(b"good", b"k", (("mqtt_topic", b"cmd/1"),))])
    got = await sub.recv()
    assert isinstance(got, Publish) and got.payload == b"good"
    assert server.hub.stats.log_records_skipped == 1 and server.hub.stats.log_records_delivered == 1
