"""Wills in the session journal (``session_store.py`` rule 8), in process: journaled while their connection
is open, forgotten once discarded or published, and a will pending its Will Delay Interval survives a crash
of the hub: published when due after the restore, cancelled when its client comes back in time. The
``kill -9`` tests against a real ``sluice serve`` are in ``test_durable_sessions.py``."""

from __future__ import annotations

import asyncio
import time

from broker.log.memory import MemoryLogStore
from ingest.mqtt.packets import (
    MQTT_5,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.ingest.mqtt.conftest import RawClient, StartServer, wait_until
from tests.ingest.mqtt.test_session_store import journal_keys

WILL_PROPS = Properties(content_type="text/plain", user_property=(("k", "v"),))


async def will_client(port: int, client_id: str, delay: int | None, expiry: int = 60) -> RawClient:
    client = await RawClient.open(port, MQTT_5)
    props = WILL_PROPS if delay is None else Properties(
        will_delay_interval=delay, content_type="text/plain", user_property=(("k", "v"),))
    ack = await client.connect(client_id, clean_start=False, properties=Properties(session_expiry_interval=expiry),
                               will=Will(f"will/{client_id}", client_id.encode(), 1, False, props))
    assert ack.reason_code == 0
    return client


async def test_a_will_is_journaled_while_its_connection_is_open_and_forgotten_once_discarded_or_published(
    start_server: StartServer,
) -> None:
    store = MemoryLogStore()
    server = await start_server(store)
    polite = await will_client(server.port, "w-polite", None, expiry=0)
    await wait_until(lambda: b"ww-polite" in journal_keys(store), what="will journaled at CONNECT")
    polite.send(Disconnect())  # reason 0x00: the will is deleted (§3.1.2.5)
    await polite.close()
    await wait_until(lambda: b"ww-polite" not in journal_keys(store), what="discarded will tombstoned")

    rude = await will_client(server.port, "w-rude", None, expiry=0)
    await wait_until(lambda: b"ww-rude" in journal_keys(store), what="will journaled at CONNECT")
    await rude.close()  # no DISCONNECT: the will is published, then forgotten
    await wait_until(lambda: server.hub.stats.wills_published == 1, what="will published")
    await wait_until(lambda: b"ww-rude" not in journal_keys(store), what="published will tombstoned")


async def test_a_pending_will_survives_a_crash_and_goes_out_when_due_unless_its_client_returns(
    start_server: StartServer,
) -> None:
    store = MemoryLogStore()
    first = await start_server(store)
    sub = await RawClient.open(first.port, MQTT_5)
    await sub.connect("w-sub", clean_start=True, properties=Properties(session_expiry_interval=3600))
    sub.send(Subscribe(1, (Subscription("will/#", 1),)))
    assert isinstance(await sub.recv(), Suback)
    await sub.close()
    late = await will_client(first.port, "w-late", 2)
    back = await will_client(first.port, "w-back", 1)  # due before w-late; its client returns in time
    await late.close()  # no DISCONNECT: the wills are pending
    closed = time.monotonic()
    await back.close()
    await wait_until(lambda: {"w-late", "w-back"} <= first.hub.delayed_wills.keys(), what="wills pending")
    assert first.listener._sweeper is not None
    first.listener._sweeper.cancel()  # the crash: the first hub's timers die with it

    second = await start_server(store)  # restore from the same log
    assert second.hub.delayed_wills.keys() == {"w-late", "w-back"}
    # w-back's will is due (1 s after it left) by the second hub's first sweep, 1 s after the restart: hold
    # the sweeper until its client is back, or a loaded machine that takes that long to reconnect fails here
    assert second.listener._sweeper is not None
    second.listener._sweeper.cancel()
    again = await RawClient.open(second.port, MQTT_5)
    assert (await again.connect("w-back", clean_start=False,
                                properties=Properties(session_expiry_interval=60))).session_present
    second.listener._sweeper = asyncio.create_task(second.listener._sweep())
    assert "w-back" not in second.hub.delayed_wills  # cancelled ...
    await wait_until(lambda: b"ww-back" not in journal_keys(store), what="cancelled will tombstoned")
    sub = await RawClient.open(second.port, MQTT_5)
    assert (await sub.connect("w-sub", clean_start=False,
                              properties=Properties(session_expiry_interval=3600))).session_present
    will = await sub.recv(timeout=10)
    arrived = time.monotonic()
    assert isinstance(will, Publish)
    assert (will.topic, will.payload, will.qos) == ("will/w-late", b"w-late", 1)
    assert (will.properties.content_type, will.properties.user_property) == ("text/plain", (("k", "v"),))
    assert will.properties.will_delay_interval is None
    assert arrived >= closed + 2  # not before its delay, counted from before the crash
    sub.send(Puback(will.packet_id or 0))
    assert second.hub.stats.wills_published == 1  # ... and w-back's, due earlier, never went out
    await again.close()
    await sub.close()
