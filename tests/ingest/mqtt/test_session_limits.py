"""Bounded MQTT state: offline sessions expire (5.0 Session Expiry Interval, capped; 3.1.1 clean session = 0
after ``session_expiry_s``), and each session's queue is bounded in messages and bytes (what does not fit
is dropped, counted, and logged once)."""

from __future__ import annotations

import asyncio
import logging
import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from ingest.mqtt.packets import MQTT_5, MQTT_311, Disconnect, Properties
from tests.ingest.mqtt.conftest import RawClient, StartServer, run, wait_until


async def test_311_persistent_session_expires_after_session_expiry_s(start_server: StartServer) -> None:
    """Before: a 3.1.1 clean-session=0 session was kept for ever, whoever had left it."""
    server = await start_server(session_expiry_s=1)
    code, _, err = await run("mosquitto_sub", "-p", str(server.port), "-c", "-i", "gone-311", "-q", "1",
                             "-t", "a/#", "-E")
    assert code == 0, err
    # mosquitto_sub has exited; the server may take its DISCONNECT a turn later (a KeyError: not kept)
    await wait_until(lambda: server.hub.sessions["gone-311"].connection is None, what="the client away")
    # kept while the client is away... (1 s, then the once-a-second sweep: 15 s is for a loaded machine)
    await wait_until(lambda: "gone-311" not in server.hub.sessions, timeout=15, what="session expiry")
    assert server.hub.stats.sessions_expired == 1 and len(server.hub.tree) == 0  # ...and then gone
    raw = await RawClient.open(server.port, MQTT_311)
    assert (await raw.connect("gone-311", clean_start=False)).session_present is False
    await raw.close()


def paho_v5_connack_expiry(port: int, client_id: str, requested: int) -> int | None:
    """Connect with Clean Start 0 and ``requested`` Session Expiry; the CONNACK's Session Expiry Interval."""
    got: list[int | None] = []
    done = threading.Event()

    def on_connect(client: paho.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        got.append(getattr(props, "SessionExpiryInterval", None))
        done.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.on_connect = on_connect
    props = PahoProperties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = requested
    client.connect("127.0.0.1", port, clean_start=False, properties=props)
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0]


async def test_5_session_expiry_is_honoured_and_capped(start_server: StartServer) -> None:
    """A 5.0 client asking for "never" (0xFFFFFFFF) gets the maximum, and is told so in the CONNACK."""
    server = await start_server(max_session_expiry_s=1)
    assert await asyncio.to_thread(paho_v5_connack_expiry, server.port, "forever-5", 0xFFFFFFFF) == 1
    await wait_until(lambda: "forever-5" not in server.hub.sessions, timeout=15, what="capped session expiry")
    # a request within the maximum is granted as asked (no Session Expiry Interval in the CONNACK)
    server = await start_server(max_session_expiry_s=3600)
    raw = await RawClient.open(server.port, MQTT_5)
    ack = await raw.connect("brief-5", clean_start=False, properties=Properties(session_expiry_interval=1))
    assert ack.properties.session_expiry_interval is None
    raw.send(Disconnect())
    await raw.read_until_closed()
    assert server.hub.sessions["brief-5"].expiry_s == 1
    await wait_until(lambda: "brief-5" not in server.hub.sessions, timeout=15, what="session expiry")
    # DISCONNECT may change the interval, within the maximum too
    raw = await RawClient.open(server.port, MQTT_5)
    await raw.connect("longer-5", clean_start=False, properties=Properties(session_expiry_interval=1))
    raw.send(Disconnect(properties=Properties(session_expiry_interval=0xFFFFFFFF)))
    await raw.read_until_closed()
    assert server.hub.sessions["longer-5"].expiry_s == 3600


@pytest.mark.parametrize("bound", ["messages", "bytes"])
async def test_offline_queue_is_bounded_and_drops_are_counted_and_logged_once(
    start_server: StartServer, caplog: pytest.LogCaptureFixture, bound: str
) -> None:
    limits = {"max_queued_messages": 5} if bound == "messages" else {"max_queued_bytes": 5 * 1000 + 999}
    server = await start_server(**limits)
    port = str(server.port)
    code, _, err = await run("mosquitto_sub", "-p", port, "-c", "-i", "away", "-q", "1", "-t", "cmd/#", "-E")
    assert code == 0, err
    lines = b"".join(b"%03d" % i + b"." * 997 + b"\n" for i in range(20))  # 1,000-byte payloads
    with caplog.at_level(logging.WARNING, logger="ingest.mqtt"):
        code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "cmd/away", "-l", stdin=lines)
        assert code == 0, err
    session = server.hub.sessions["away"]
    assert session.queue is not None and len(session.queue) == 5 and session.queued_bytes == 5000
    assert server.hub.stats.queue_drops == 15
    full = [r for r in caplog.records if "session queue full" in r.getMessage()]
    assert len(full) == 1  # once for the whole overflow, not once per dropped message
    # the client gets what was queued first (new messages were the ones dropped, as in Mosquitto)
    code, out, err = await run("mosquitto_sub", "-p", port, "-c", "-i", "away", "-q", "1", "-t", "cmd/#", "-C", "5")
    assert code == 0, err
    assert [line[:3] for line in out.split()] == ["000", "001", "002", "003", "004"]
    assert session.queued_bytes == 0 and not session.dropping  # drained: the next overflow is logged again


async def test_all_session_queues_together_are_bounded(start_server: StartServer) -> None:
    """Before: only each queue was bounded, so N invented client ids could hold N × max_queued_bytes."""
    server = await start_server(max_queued_bytes=10_000, max_queued_bytes_total=6_000)
    port = str(server.port)
    for client_id in ("away-1", "away-2"):
        code, _, err = await run("mosquitto_sub", "-p", port, "-c", "-i", client_id, "-q", "1", "-t", "cmd/#", "-E")
        assert code == 0, err
    lines = b"".join(b"%03d" % i + b"." * 997 + b"\n" for i in range(5))  # 5 × 1,000-byte payloads
    code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "cmd/all", "-l", stdin=lines)
    assert code == 0, err
    first, second = server.hub.sessions["away-1"], server.hub.sessions["away-2"]
    assert first.queued_bytes + second.queued_bytes == server.hub.queue_budget.used == 6_000
    assert server.hub.stats.queue_drops == 4  # 10 deliveries, 6 fit in the total
    # a session that ends (its client comes back with a clean session) gives its bytes back
    code, _, err = await run("mosquitto_sub", "-p", port, "-i", "away-1", "-t", "other", "-E")
    assert code == 0, err
    await wait_until(lambda: "away-1" not in server.hub.sessions, timeout=5, what="the clean session to end")
    assert server.hub.queue_budget.used == second.queued_bytes > 0


async def test_offline_sessions_are_capped_and_the_one_away_longest_goes(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every offline session was kept for its whole expiry (a day), however many client ids came."""
    server = await start_server(max_offline_sessions=2)
    port = str(server.port)
    with caplog.at_level(logging.WARNING, logger="ingest.mqtt"):
        for client_id in ("first", "second", "third", "fourth"):
            code, _, err = await run("mosquitto_sub", "-p", port, "-c", "-i", client_id, "-q", "1", "-t", "a/#", "-E")
            assert code == 0, err
        # the last mosquitto_sub has exited; the server may take its DISCONNECT (and the eviction) a turn later
        await wait_until(lambda: sorted(server.hub.sessions) == ["fourth", "third"], what="two offline sessions kept")
    assert server.hub.stats.sessions_evicted == 2
    assert len(server.hub.tree) == 2  # the evicted sessions took their subscriptions with them
    assert len([r for r in caplog.records if "max_offline_sessions" in r.getMessage()]) == 1
    # a client that comes back in time finds its session; the evicted one does not
    raw = await RawClient.open(server.port, MQTT_311)
    assert (await raw.connect("third", clean_start=False)).session_present is True
    await raw.close()
    raw = await RawClient.open(server.port, MQTT_311)
    assert (await raw.connect("first", clean_start=False)).session_present is False
    await raw.close()
