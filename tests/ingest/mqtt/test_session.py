"""Session rules at the byte level: acks only after the durable append, retries de-duplicated,
reads paused while appends are behind, topic aliases and Receive Maximum (MQTT 5)."""

from __future__ import annotations

import asyncio
import time

from ingest.mqtt.codec import encode
from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
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
)
from ingest.mqtt.session import READ_SIZE
from ingest.routing import SourceRef
from tests.ingest.conftest import SlowLogStore, records
from tests.ingest.mqtt.conftest import MqttServer, RawClient, StartServer, wait_until


async def test_puback_and_pubrec_only_after_the_durable_append(start_server: StartServer) -> None:
    store = SlowLogStore(0.3)
    server = await start_server(store=store)
    raw = await RawClient.open(server.port)
    await raw.connect("slow")
    loop = asyncio.get_running_loop()
    for qos, ack_type in ((1, Puback), (2, Pubrec)):
        appends_before = store.appends
        sent = loop.time()
        raw.send(Publish(f"t/{qos}", b"v", qos, packet_id=qos))
        ack = await raw.recv()
        assert isinstance(ack, ack_type) and ack.packet_id == qos
        # the append had started and its (slow) durability wait had finished before the ack left
        assert store.appends == appends_before + 1
        assert loop.time() - sent >= 0.3
    raw.send(Pubrel(2))
    assert await raw.recv() == Pubcomp(2)


async def test_qos1_and_qos2_retries_are_not_appended_twice(start_server: StartServer) -> None:
    server = await start_server(store=SlowLogStore(0.2))
    raw = await RawClient.open(server.port)
    await raw.connect("retry")
    # QoS 1: the same packet id again while the first is still being appended (unacknowledged)
    raw.send(Publish("d/1", b"once", 1, packet_id=5))
    raw.send(Publish("d/1", b"once", 1, dup=True, packet_id=5))
    assert await raw.recv() == Puback(5)
    # QoS 2: retried after PUBREC, before PUBREL -> PUBREC again, no second record
    raw.send(Publish("d/2", b"exactly", 2, packet_id=6))
    assert await raw.recv() == Pubrec(6)
    raw.send(Publish("d/2", b"exactly", 2, dup=True, packet_id=6))
    assert await raw.recv() == Pubrec(6)
    raw.send(Pubrel(6))
    assert await raw.recv() == Pubcomp(6)
    # after PUBCOMP the id is free: a new message with it is a new message
    raw.send(Publish("d/2", b"again", 2, packet_id=6))
    assert await raw.recv() == Pubrec(6)
    assert [r.value for r in records(server.store, "mqtt")] == [b"once", b"exactly", b"again"]
    assert server.hub.stats.duplicates == 2


async def test_qos2_state_survives_a_reconnect_of_a_persistent_session(server: MqttServer) -> None:
    raw = await RawClient.open(server.port)
    await raw.connect("keeper", clean_start=False)
    raw.send(Publish("k/1", b"m", 2, packet_id=9))
    assert await raw.recv() == Pubrec(9)
    await raw.close()
    raw = await RawClient.open(server.port)
    ack = await raw.connect("keeper", clean_start=False)
    assert ack.session_present
    raw.send(Publish("k/1", b"m", 2, dup=True, packet_id=9))  # the client never saw our PUBREC
    assert await raw.recv() == Pubrec(9)
    raw.send(Pubrel(9))
    assert await raw.recv() == Pubcomp(9)
    assert [r.value for r in records(server.store, "mqtt")] == [b"m"]


async def test_reads_pause_while_appends_are_behind_and_nothing_is_lost(start_server: StartServer) -> None:
    server = await start_server(store=SlowLogStore(0.05), receive_maximum=8)
    raw = await RawClient.open(server.port)
    await raw.connect("firehose")
    n = 300
    payload = b"p" * 996

    async def blast() -> None:
        for start in range(0, n, 5):  # many small writes, so the server sees many reads
            raw.send_raw(b"".join(encode(Publish("fh/x", b"%04d" % i + payload, 1, packet_id=i + 1))
                                  for i in range(start, start + 5)))
            await raw.writer.drain()

    sender = asyncio.create_task(blast())
    acked: list[int] = []
    while len(acked) < n:
        ack = await raw.recv(timeout=10)
        assert isinstance(ack, Puback)
        acked.append(ack.packet_id)
    await sender
    assert acked == list(range(1, n + 1))  # in order (§4.6)
    stats = server.hub.stats
    assert stats.read_pauses >= 1
    health = server.runtime.registries["ingest_health"].source(SourceRef("mqtt", "default"))
    assert health.pauses >= 1 and health.paused_s > 0 and health.paused_count == 0
    assert health.messages == n and health.connections == 1
    # reads stop at the limit; what one read (at most READ_SIZE bytes) already held can exceed it
    assert stats.max_queued <= 8 + READ_SIZE // 1000 + 1
    assert [r.value for r in records(server.store, "mqtt")] == [b"%04d" % i + payload for i in range(n)]


async def test_topic_aliases(server: MqttServer) -> None:
    raw = await RawClient.open(server.port, MQTT_5)
    ack = await raw.connect("aliaser")
    assert ack.properties.topic_alias_maximum == 32
    raw.send(Publish("sensors/a1/temperature", b'{"ts": 5}', 1, packet_id=1, properties=Properties(topic_alias=3)))
    raw.send(Publish("", b'{"ts": 6}', 1, packet_id=2, properties=Properties(topic_alias=3)))
    assert await raw.recv() == Puback(1)
    assert await raw.recv() == Puback(2)
    recs = records(server.store, "temperatures")
    assert [(r.key, r.timestamp) for r in recs] == [(b"a1", 5), (b"a1", 6)]
    raw.send(Publish("", b"x", 0, properties=Properties(topic_alias=4)))  # never set
    data = await raw.read_until_closed()
    assert data[0] == 0xE0 and data[2] == 0x82
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("aliaser2")
    raw.send(Publish("t", b"x", 0, properties=Properties(topic_alias=33)))  # above the maximum
    data = await raw.read_until_closed()
    assert data[0] == 0xE0 and data[2] == 0x94


async def test_receive_maximum_exceeded(start_server: StartServer) -> None:
    server = await start_server(store=SlowLogStore(0.5), receive_maximum=4)
    raw = await RawClient.open(server.port, MQTT_5)
    ack = await raw.connect("greedy")
    assert ack.properties.receive_maximum == 4
    raw.send_raw(b"".join(encode(Publish("g", b"x", 1, packet_id=i), MQTT_5) for i in range(1, 7)))
    data = await raw.read_until_closed()
    assert b"\xe0" in data and data[data.index(b"\xe0") + 2] == 0x93


async def test_subscribe_unsubscribe_and_invalid_filters(server: MqttServer) -> None:
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("subber")
    raw.send(Subscribe(1, (Subscription("a/+/c", 1), Subscription("$share/g/x", 0), Subscription("$share/g", 0),
                           Subscription("$share//x", 0))))
    assert await raw.recv() == Suback(1, (1, 0, 0x8F, 0x8F))  # no group or no filter after it: 0x8F
    pub = await RawClient.open(server.port, MQTT_311)
    await pub.connect("pubber")
    pub.send(Publish("a/b/c", b"hello", 1, packet_id=1))
    assert await pub.recv() == Puback(1)
    got = await raw.recv()
    assert isinstance(got, Publish) and (got.topic, got.payload, got.qos) == ("a/b/c", b"hello", 1)
    assert got.packet_id is not None
    raw.send(Puback(got.packet_id))
    raw.send(Unsubscribe(2, ("a/+/c", "nope", "$share/g/x")))
    assert await raw.recv() == Unsuback(2, (0, 0x11, 0))
    await wait_until(lambda: len(server.hub.tree) == 0, what="unsubscribed")


async def test_a_filter_breaking_the_syntax_makes_the_subscribe_malformed(server: MqttServer) -> None:
    # As Mosquitto 2.0 (its broker test 13-malformed-subscribe-v5, "Bad topic"): DISCONNECT 0x81, 3.1.1 closed,
    # and no filter of the packet is subscribed, not even a valid one before the bad one. Before: SUBACK 0x8F
    # / 0x80 for the bad filter and the others subscribed.
    for version, bad in ((MQTT_5, "a/#/c"), (MQTT_5, "$share/g/a/+b"), (MQTT_5, "$share/g+/x"), (MQTT_5, ""),
                         (MQTT_311, "#/a")):
        raw = await RawClient.open(server.port, version)
        await raw.connect("malformed", clean_start=False,
                          **({"properties": Properties(session_expiry_interval=60)} if version == MQTT_5 else {}))
        raw.send(Subscribe(1, (Subscription("ok/x", 1), Subscription(bad, 0))))
        data = await raw.read_until_closed()
        if version == MQTT_5:
            assert data[:1] == b"\xe0" and data[2] == 0x81, (bad, data)  # DISCONNECT, Malformed Packet
        else:
            assert data == b"", (bad, data)
        assert len(server.hub.tree) == 0, bad
    assert "malformed" in server.hub.sessions  # the persistent session stays, without subscriptions


async def test_a_filter_breaking_the_syntax_makes_the_unsubscribe_malformed(server: MqttServer) -> None:
    # Mosquitto 2.0 answers DISCONNECT 0x81 (3.1.1: closes) here too; before: UNSUBACK 0x11 / UNSUBACK.
    for version, bad in ((MQTT_5, "a/#/c"), (MQTT_311, "")):
        raw = await RawClient.open(server.port, version)
        await raw.connect("unsubber", clean_start=False,
                          **({"properties": Properties(session_expiry_interval=60)} if version == MQTT_5 else {}))
        raw.send(Subscribe(1, (Subscription("ok/x", 1),)))
        assert isinstance(await raw.recv(), Suback)
        raw.send(Unsubscribe(2, ("ok/x", bad)))
        data = await raw.read_until_closed()
        if version == MQTT_5:
            assert data[:1] == b"\xe0" and data[2] == 0x81, (bad, data)
        else:
            assert data == b"", (bad, data)
        assert len(server.hub.tree) == 1, bad  # nothing of the packet was applied


async def test_time_paused_by_backpressure_does_not_count_against_keepalive(start_server: StartServer) -> None:
    server = await start_server(store=SlowLogStore(2.5), receive_maximum=1)
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("patient", keepalive=1)
    raw.send(Publish("p/1", b"x", 1, packet_id=1))
    await wait_until(lambda: server.hub.stats.read_pauses == 1, what="reads paused")
    raw.send(Pingreq())  # waits in the socket while reads are paused, longer than 1.5 x keepalive
    assert await raw.recv(timeout=5) == Puback(1)
    assert await raw.recv(timeout=2) == Pingresp()


async def test_mqtt5_session_expiry_interval(server: MqttServer) -> None:
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("brief", clean_start=False, properties=Properties(session_expiry_interval=60))
    raw.send(Subscribe(1, (Subscription("cmd/brief", 1),)))
    assert await raw.recv() == Suback(1, (1,))
    await raw.close()
    await wait_until(lambda: server.hub.sessions["brief"].connection is None, what="disconnect")
    server.hub.sweep(time.monotonic() + 30)  # not yet expired
    assert "brief" in server.hub.sessions
    server.hub.sweep(time.monotonic() + 61)  # expired: subscriptions go with it
    assert "brief" not in server.hub.sessions and len(server.hub.tree) == 0
    raw = await RawClient.open(server.port, MQTT_5)
    assert not (await raw.connect("brief", clean_start=False)).session_present
    # expiry 0 (the 5.0 default): the session ends with the connection even without clean start
    await raw.close()
    await wait_until(lambda: "brief" not in server.hub.sessions, what="session dropped")
