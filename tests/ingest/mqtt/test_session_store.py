"""The session journal (``session_store.py``) in process: what it holds while a session lives, that an
ended session leaves only tombstones, and a restore over the same log store (listener started again)."""

from __future__ import annotations

from broker.log.memory import MemoryLogStore
from ingest.mqtt.codec import encode
from ingest.mqtt.journal import Journal
from ingest.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
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
)
from ingest.mqtt.session_store import RETAINED_TOPIC, SESSIONS_TOPIC, SessionStore
from sluice.front_metrics import mqtt_status
from tests.ingest.mqtt.conftest import RawClient, StartServer, wait_until


def journal_keys(store: MemoryLogStore) -> set[bytes]:
    return set(Journal(store, SESSIONS_TOPIC).load())


async def subscribed_client(port: int, client_id: str, expiry: int = 3600) -> RawClient:
    client = await RawClient.open(port, MQTT_5)
    await client.connect(client_id, clean_start=False, properties=Properties(session_expiry_interval=expiry))
    client.send(Subscribe(1, (Subscription("j/#", 1),), Properties(subscription_identifier=(9,))))
    assert isinstance(await client.recv(), Suback)
    return client


async def publish_qos1(port: int, *payloads: bytes) -> None:
    pub = await RawClient.open(port, MQTT_5)
    await pub.connect("j-pub")
    for i, payload in enumerate(payloads, start=1):
        pub.send(Publish("j/t", payload, 1, False, False, i))
        assert await pub.recv() == Puback(i)
    await pub.close()


async def test_an_ended_session_leaves_nothing_in_the_journal(start_server: StartServer) -> None:
    store = MemoryLogStore()
    server = await start_server(store)
    sub = await subscribed_client(server.port, "j-sub")
    sub.send(Disconnect())
    await sub.close()
    await publish_qos1(server.port, b"one", b"two")
    keys = journal_keys(store)
    assert b"sj-sub" in keys and sum(k.startswith(b"m") and k.endswith(b"j-sub") for k in keys) == 2

    # A clean start ends the session: its record and both queued messages are tombstoned.
    again = await RawClient.open(server.port, MQTT_5)
    ack = await again.connect("j-sub", clean_start=True, properties=Properties(session_expiry_interval=3600))
    assert not ack.session_present
    assert not any(k.endswith(b"j-sub") and k != b"sj-sub" for k in journal_keys(store))
    # ... and a DISCONNECT that sets the Session Expiry Interval to 0 ends the new one.
    again.send(Disconnect(properties=Properties(session_expiry_interval=0)))
    await again.close()
    await wait_until(lambda: "j-sub" not in server.hub.sessions, what="session ended")
    assert not any(k.endswith(b"j-sub") for k in journal_keys(store))


async def test_acknowledged_messages_are_removed_and_a_restart_restores_the_rest(start_server: StartServer) -> None:
    store = MemoryLogStore()
    first = await start_server(store)
    sub = await subscribed_client(first.port, "j-r")
    await publish_qos1(first.port, b"a", b"b")
    a, b = await sub.recv(), await sub.recv()
    assert isinstance(a, Publish) and isinstance(b, Publish)
    assert a.properties.subscription_identifier == (9,)
    sub.send(Puback(a.packet_id or 0))  # "a" is done; "b" stays owed
    sub.send(Pingreq())
    assert isinstance(await sub.recv(), Pingresp)
    await sub.close()
    await wait_until(lambda: first.hub.sessions["j-r"].connection is None, what="client gone")
    assert sum(k.startswith(b"m") and k.endswith(b"j-r") for k in journal_keys(store)) == 1

    second = await start_server(store)  # a new hub over the same log: the restore
    assert isinstance(second.hub.store, SessionStore) and second.hub.store.restored.messages == 1
    back = await RawClient.open(second.port, MQTT_5)
    ack = await back.connect("j-r", clean_start=False, properties=Properties(session_expiry_interval=3600))
    assert ack.session_present
    again = await back.recv()
    assert isinstance(again, Publish) and again.payload == b"b" and again.packet_id == b.packet_id
    assert again.properties.subscription_identifier == (9,)
    back.send(Puback(again.packet_id or 0))
    await publish_qos1(second.port, b"c")  # the restored subscription routes new messages
    live = await back.recv()
    assert isinstance(live, Publish) and live.payload == b"c"
    await back.close()


async def test_the_internal_topics_are_compacted_and_hidden(start_server: StartServer) -> None:
    store = MemoryLogStore()
    server = await start_server(store)
    sub = await subscribed_client(server.port, "j-h")
    await sub.close()
    listed = {t.name for t in store.list_topics()}
    internal = {t.name: t for t in store.list_topics(include_internal=True)}
    assert SESSIONS_TOPIC not in listed and RETAINED_TOPIC not in listed
    assert internal[SESSIONS_TOPIC].internal
    assert internal[SESSIONS_TOPIC].config.cleanup_policy == "compact"
    status = mqtt_status(server.hub)
    assert status["journal_records"] >= 1 and status["journal_errors"] == 0  # on /mqtt and /metrics


async def test_a_clean_start_taking_over_a_live_connection_leaves_the_new_session_alone(
    start_server: StartServer,
) -> None:
    """A device that reboots and reconnects with clean start while its old TCP connection is still open: the
    old session ends, and the old connection's close (reported later) must neither journal the old session
    over the new one nor park it among the offline sessions."""
    store = MemoryLogStore()
    server = await start_server(store)
    old = await subscribed_client(server.port, "j-reboot")  # subscribed to j/# with id 9
    new = await RawClient.open(server.port, MQTT_5)
    # CONNECT and SUBSCRIBE in one write: the SUBSCRIBE is handled before the old connection's loss is.
    new.send_raw(encode(Connect("j-reboot", MQTT_5, clean_start=True,
                                properties=Properties(session_expiry_interval=3600)), MQTT_5)
                 + encode(Subscribe(1, (Subscription("fresh/#", 1),)), MQTT_5))
    assert isinstance(await new.recv(), Connack)
    assert isinstance(await new.recv(), Suback)
    await old.read_until_closed()  # DISCONNECT 0x8E, then closed
    await wait_until(lambda: len(server.hub.connections) == 1, what="old connection gone")
    new.send(Pingreq())
    assert isinstance(await new.recv(), Pingresp)
    assert "j-reboot" not in server.hub.offline
    assert list(server.hub.sessions["j-reboot"].subscriptions) == ["fresh/#"]
    await new.close()
    await wait_until(lambda: "j-reboot" in server.hub.offline, what="new session offline")

    second = await start_server(store)  # restore: the new session, not the old one
    assert list(second.hub.sessions["j-reboot"].subscriptions) == ["fresh/#"]


async def publish_mixed(port: int, topic: str, qos_list: tuple[int, ...]) -> None:
    """Publish ``m1``, ``m2`` ... at the given QoS, each fully acknowledged before the next."""
    pub = await RawClient.open(port, MQTT_5)
    await pub.connect("dup-pub")
    for i, qos in enumerate(qos_list, start=1):
        pub.send(Publish(topic, b"m%d" % i, qos, False, False, i))
        if qos == 1:
            assert await pub.recv() == Puback(i)
        else:
            assert await pub.recv() == Pubrec(i)
            pub.send(Pubrel(i))
            assert await pub.recv() == Pubcomp(i)
    await pub.close()


async def leave_two_sent_one_pumped(port: int, client_id: str) -> tuple[RawClient, list[bytes]]:
    """A persistent subscriber with Receive Maximum 2 gets m1 and m2 as they are published, acknowledges m1,
    so m3 goes out from its queue; m4 and m5 stay queued, never sent. Returns the client and the PUBLISH
    packets it got (exact bytes)."""
    sub = await RawClient.open(port, MQTT_5)
    await sub.connect(client_id, clean_start=True,
                      properties=Properties(session_expiry_interval=3600, receive_maximum=2))
    sub.send(Subscribe(1, (Subscription("dup/#", 2),)))
    assert (await sub.recv_bytes())[0] == 0x90  # SUBACK
    await publish_mixed(port, "dup/t", (1, 2, 1, 2, 1))
    first, second = await sub.recv_bytes(), await sub.recv_bytes()
    sub.writer.write(bytes((0x40, 2)) + first[9:11])  # PUBACK m1 (topic "dup/t": packet id at bytes 9-10)
    third = await sub.recv_bytes()
    return sub, [first, second, third]


async def reconnect_raw(port: int, client_id: str) -> RawClient:
    """Reconnect to a persistent session, reading the CONNACK with ``recv_bytes`` (session present)."""
    client = await RawClient.open(port, MQTT_5)
    client.send(Connect(client_id, MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=3600)))
    connack = await client.recv_bytes()
    assert connack[0] == 0x20 and connack[2] == 0x01 and connack[3] == 0  # session present, success
    return client


def publish_flags(packet: bytes) -> tuple[int, bytes]:
    """(the fixed header's first byte, the payload) of a PUBLISH with topic "dup/t" and no properties."""
    return packet[0], packet[12:]


async def test_a_restart_resends_what_was_sent_before_with_dup_set_and_the_rest_without(
    start_server: StartServer,
) -> None:
    """§4.4: messages sent before and not acknowledged go out again with DUP=1 after a restart; queued
    messages never sent go out with DUP=0 (3 = QoS 1 with DUP: 0x3A, QoS 2: 0x3C; without: 0x32, 0x34)."""
    store = MemoryLogStore()
    first = await start_server(store)
    sub, before = await leave_two_sent_one_pumped(first.port, "dup-r")
    assert [publish_flags(p) for p in before] == [(0x32, b"m1"), (0x34, b"m2"), (0x32, b"m3")]
    await sub.close()
    await wait_until(lambda: first.hub.sessions["dup-r"].connection is None, what="client gone")

    second = await start_server(store)  # a new hub over the same log: the restore
    back = await reconnect_raw(second.port, "dup-r")
    again = [await back.recv_bytes() for _ in range(4)]
    assert [publish_flags(p) for p in again] == [(0x3C, b"m2"), (0x3A, b"m3"), (0x34, b"m4"), (0x32, b"m5")]
    assert [p[9:11] for p in again[:2]] == [before[1][9:11], before[2][9:11]]  # the same packet ids
    await back.close()


async def test_an_ordinary_reconnect_resends_with_dup_set_only_what_was_sent(start_server: StartServer) -> None:
    server = await start_server(MemoryLogStore())
    sub, _ = await leave_two_sent_one_pumped(server.port, "dup-o")
    await sub.close()
    await wait_until(lambda: server.hub.sessions["dup-o"].connection is None, what="client gone")
    back = await reconnect_raw(server.port, "dup-o")
    again = [await back.recv_bytes() for _ in range(4)]
    assert [publish_flags(p) for p in again] == [(0x3C, b"m2"), (0x3A, b"m3"), (0x34, b"m4"), (0x32, b"m5")]
    await back.close()
