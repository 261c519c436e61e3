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
    Publish,
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
