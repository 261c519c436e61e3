"""Idle plain-TCP connections are served without a transport (``ingest/mqtt/parking.py``): what a client
does to a parked connection, and what the broker does to one, behaves as with a transport. Each test shows
that it ran on the parked path (``HubStats.connections_parked`` / ``unparks`` / ``parks``, the
connection's transport). Each runs on asyncio's own loop and on uvloop (``conftest.py``)."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import threading
import time
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Reason,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from ingest.mqtt.parking import BUSY_READS, ParkedSocket
from ingest.mqtt.session import MqttConnection
from sluice.front_metrics import mqtt_status
from tests.ingest.conftest import GatedLogStore, records
from tests.ingest.mqtt.conftest import MqttServer, RawClient, StartServer, run, wait_until


def connection_of(server: MqttServer, client_id: str) -> MqttConnection:
    found = [c for c in server.hub.connections if isinstance(c, MqttConnection) and c.client_id == client_id]
    assert len(found) == 1, [c.client_id for c in server.hub.connections]
    return found[0]


def reading(transport: Any) -> bool:
    """An asyncio or uvloop transport reads (``is_reading`` is not part of ``ByteTransport``)."""
    return bool(transport.is_reading())


def parked(server: MqttServer, client_id: str) -> bool:
    return type(connection_of(server, client_id).transport) is ParkedSocket


async def test_a_parked_subscriber_gets_deliveries(server: MqttServer) -> None:
    sub = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", str(server.port), "-i", "parked-sub", "-q", "1", "-C", "2", "-t", "cmd/#",
        stdout=asyncio.subprocess.PIPE)
    await wait_until(lambda: len(server.hub.tree) == 1, what="subscribed")
    assert parked(server, "parked-sub")
    assert mqtt_status(server.hub)["connections_parked"] == 1  # what GET /mqtt and /metrics show
    for text in ("open", "close"):
        code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-q", "1", "-t", "cmd/valve", "-m", text)
        assert code == 0, err
    out, _ = await asyncio.wait_for(sub.communicate(), 10)
    assert out.decode().split() == ["open", "close"]
    assert sub.returncode == 0
    stats = server.hub.stats
    assert stats.delivered == 2 and stats.unparks == 0  # written and acknowledged without a transport


async def test_a_parked_client_publishes_qos1_and_gets_its_pubacks(server: MqttServer) -> None:
    def publish() -> None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="parked-pub", protocol=paho.MQTTv5)
        client.connect("127.0.0.1", server.port)
        client.loop_start()
        try:
            for i in range(3):
                info = client.publish("plant/parked", b"m%d" % i, qos=1)
                info.wait_for_publish(timeout=10)
                assert info.is_published()
        finally:
            client.disconnect()
            client.loop_stop()

    await asyncio.to_thread(publish)
    assert [r.value for r in records(server.store, "mqtt")] == [b"m0", b"m1", b"m2"]
    stats = server.hub.stats
    assert stats.connections_total == 1 and stats.unparks == 0  # every PUBACK went out of the parked socket


async def test_keepalive_expiry_of_a_parked_client_publishes_its_will(server: MqttServer) -> None:
    watcher = await RawClient.open(server.port)
    await watcher.connect("will-watcher")
    watcher.send(Subscribe(1, (Subscription("wills/#", 1),)))
    await watcher.recv()  # SUBACK
    silent = await RawClient.open(server.port, MQTT_5)
    await silent.connect("silent", keepalive=1, will=Will("wills/silent", b"gone", 1))
    assert parked(server, "silent")
    # no PINGREQ: after 1.5 x keep alive the broker writes DISCONNECT 0x8D and closes
    assert await silent.recv(timeout=15) == Disconnect(Reason.KEEP_ALIVE_TIMEOUT,
                                                       Properties(reason_string="keepalive timeout"))
    assert await silent.read_until_closed() == b""
    will = await watcher.recv(timeout=15)
    assert isinstance(will, Publish) and (will.topic, will.payload) == ("wills/silent", b"gone")
    assert server.hub.stats.unparks == 0
    await watcher.close()


async def test_takeover_of_a_parked_session(server: MqttServer) -> None:
    first = await RawClient.open(server.port, MQTT_5)
    expiry = Properties(session_expiry_interval=600)
    await first.connect("taken", clean_start=False, properties=expiry)
    assert parked(server, "taken")
    second = await RawClient.open(server.port, MQTT_5)
    ack = await second.connect("taken", clean_start=False, properties=expiry)
    assert ack.session_present
    assert await first.recv() == Disconnect(Reason.SESSION_TAKEN_OVER, Properties(reason_string="session taken over"))
    assert await first.read_until_closed() == b""
    second.send(Publish("plant/after", b"still here", 1, packet_id=7))
    assert await second.recv() == Puback(7)
    assert server.hub.stats.unparks == 0
    await second.close()


async def test_a_busy_connection_gets_a_transport_and_is_parked_again_without_losing_a_byte(
        start_server: StartServer) -> None:
    server = await start_server(park_after_s=0.2)
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setblocking(False)
    decoder = Decoder(MQTT_311)

    async def recv() -> object:
        packets: list[object] = []
        while not packets:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
            assert data, "closed by the server"
            packets += decoder.feed(data)
        assert len(packets) == 1
        return packets[0]

    await loop.sock_sendall(sock, encode(Connect("busy", MQTT_311), MQTT_311))
    assert await recv() == Connack(False, 0)
    conn = connection_of(server, "busy")
    for _ in range(BUSY_READS + 1):  # a busy client: it gets a transport
        await loop.sock_sendall(sock, encode(Pingreq(), MQTT_311))
        assert await recv() == Pingresp()
    await wait_until(lambda: type(conn.transport) is not ParkedSocket and conn.transport is not None,
                     what="a transport")
    assert server.hub.stats.unparks == 1
    # The client sends while the connection has its transport; the sweep parks it before the transport has
    # read a byte of it (the loop has not run since): the bytes wait in the kernel and are read when parked.
    sock.send(encode(Publish("plant/busy", b"sent while parking", 1, packet_id=3), MQTT_311))
    conn.check_timeout(time.monotonic() + 1)
    assert type(conn.transport) is ParkedSocket and server.hub.stats.parks == 1
    assert await recv() == Puback(3)
    assert [r.value for r in records(server.store, "mqtt")] == [b"sent while parking"]
    await asyncio.sleep(0)  # the old transport's close has run: neither FIN nor RST reached the client
    with pytest.raises(BlockingIOError):
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    await loop.sock_sendall(sock, encode(Pingreq(), MQTT_311))
    assert await recv() == Pingresp()
    sock.close()


async def test_paho_keeps_its_connection_across_unpark_and_park(start_server: StartServer) -> None:
    server = await start_server(park_after_s=0)
    disconnected = threading.Event()

    def connect() -> paho.Client:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="paho-busy", protocol=paho.MQTTv5)
        client.on_disconnect = lambda *args: disconnected.set()
        props = PahoProperties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 60
        client.connect("127.0.0.1", server.port, properties=props)
        client.loop_start()
        return client

    def publish(client: paho.Client, payload: bytes) -> None:
        info = client.publish("plant/paho", payload, qos=1)
        info.wait_for_publish(timeout=10)
        assert info.is_published()

    client = await asyncio.to_thread(connect)
    try:
        await asyncio.to_thread(publish, client, b"b" * 16384)  # one large read: busy
        await wait_until(lambda: server.hub.stats.unparks == 1, what="a transport")
        await wait_until(lambda: server.hub.stats.parks == 1, what="parked again")
        assert parked(server, "paho-busy")
        await asyncio.to_thread(publish, client, b"after parking")
        assert [r.value for r in records(server.store, "mqtt")][-1] == b"after parking"
        assert not disconnected.is_set()
    finally:
        await asyncio.to_thread(client.disconnect)
        client.loop_stop()


async def test_a_write_that_does_not_fit_gives_the_subscriber_a_transport(server: MqttServer) -> None:
    """A parked subscriber that does not read: the socket's send buffer fills, the rest is written by a
    transport (which buffers it), and the subscriber gets every byte, in order."""
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # a small window: writes fill up fast
    reader.connect(("127.0.0.1", server.port))
    r, w = await asyncio.open_connection(sock=reader)
    slow = RawClient(r, w, MQTT_311)
    await slow.connect("slow-reader")
    slow.send(Subscribe(1, (Subscription("big/#", 1),)))
    await slow.recv()  # SUBACK
    assert parked(server, "slow-reader")
    publisher = await RawClient.open(server.port)
    await publisher.connect("big-publisher")
    payloads = [bytes([i]) * (400 * 1024) for i in range(20)]  # 8 MiB: more than the kernel buffers hold
    for i, payload in enumerate(payloads):
        publisher.send(Publish("big/x", payload, 1, packet_id=i + 1))
    await wait_until(lambda: not parked(server, "slow-reader"), timeout=20, what="the subscriber's transport")
    got = []
    for _ in payloads:
        packet = await slow.recv(timeout=10)
        assert isinstance(packet, Publish)
        got.append(packet.payload)
        assert packet.packet_id is not None
        slow.send(Puback(packet.packet_id))
    assert got == payloads
    await slow.close()
    await publisher.close()


async def test_reads_paused_by_backpressure_stay_paused_when_a_transport_takes_over(start_server: StartServer) -> None:
    """The SUBSCRIBE that brings 8 MiB of retained messages (more than the socket takes: a transport) comes
    in one read with a QoS 1 PUBLISH that a stalled disk keeps waiting (reads paused): the transport that
    takes over must keep reads paused until the append is done, then resume."""
    store = GatedLogStore()
    store.gate.set()
    server = await start_server(store=store, receive_maximum=1)
    publisher = await RawClient.open(server.port)
    await publisher.connect("retainer")
    payloads = [bytes([i]) * (400 * 1024) for i in range(20)]
    for i, payload in enumerate(payloads):
        publisher.send(Publish(f"big/{i:02d}", payload, 1, retain=True, packet_id=i + 1))
        assert await publisher.recv(timeout=10) == Puback(i + 1)
    store.gate.clear()  # the disk stalls
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    reader.connect(("127.0.0.1", server.port))
    r, w = await asyncio.open_connection(sock=reader)
    slow = RawClient(r, w, MQTT_311)
    await slow.connect("paused-reader")
    conn = connection_of(server, "paused-reader")
    assert type(conn.transport) is ParkedSocket
    slow.send_raw(encode(Publish("plant/wait", b"stalled", 1, packet_id=5), MQTT_311)
                  + encode(Subscribe(1, (Subscription("big/#", 0),)), MQTT_311))
    await wait_until(lambda: type(conn.transport) is not ParkedSocket, timeout=10, what="a transport")
    for _ in range(3):  # the loop turns after connection_made: uvloop started reading there
        await asyncio.sleep(0)
    transport = conn.transport
    assert conn.machine.paused and not reading(transport)
    store.gate.set()
    got: list[Packet] = []
    while len(got) < len(payloads) + 2:
        got.append(await slow.recv(timeout=10))
    assert got[0] == Suback(1, (0,))
    assert [p.payload for p in got if isinstance(p, Publish)] == payloads
    assert Puback(5) in got
    await wait_until(lambda: reading(conn.transport), what="reads resumed")
    await slow.close()
    await publisher.close()


async def test_parked_clients_are_told_when_the_server_shuts_down(server: MqttServer) -> None:
    v5 = await RawClient.open(server.port, MQTT_5)
    await v5.connect("parked-v5")
    v311 = await RawClient.open(server.port)
    await v311.connect("parked-v311")
    assert parked(server, "parked-v5") and parked(server, "parked-v311")
    await server.listener.stop()
    assert await v5.recv() == Disconnect(Reason.SERVER_SHUTTING_DOWN, Properties(reason_string="server shutting down"))
    assert await v5.read_until_closed() == b""
    assert await v311.read_until_closed() == b""  # 3.1.1 has no DISCONNECT from the server: the close
    assert server.hub.stats.connections_parked == 0 and not server.hub.connections


async def test_out_of_file_descriptors_pauses_accepting_counts_it_and_accepting_resumes(server: MqttServer) -> None:
    client = socket.create_connection(("127.0.0.1", server.port))  # in the listen queue: not accepted yet
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor number: the next accept's
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
    try:
        await wait_until(lambda: server.hub.stats.accept_errors == 1, what="accept failing with EMFILE")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    client.setblocking(False)
    r, w = await asyncio.open_connection(sock=client)
    raw = RawClient(r, w, MQTT_311)
    assert await raw.connect("after-emfile") == Connack(False, 0)  # accepted when accepting resumed (1 s)
    assert server.hub.stats.accept_errors == 1
    await raw.close()


async def test_a_publisher_whose_large_read_paused_reads_still_gets_its_transport(start_server: StartServer) -> None:
    """A busy publisher's read usually pauses reads (backpressure) at once: it gets its transport all the
    same (paused), and nothing is lost or reordered."""
    store = GatedLogStore()  # the disk stalls until the gate opens
    server = await start_server(store=store, receive_maximum=4)
    raw = await RawClient.open(server.port)
    await raw.connect("paused-publisher")
    conn = connection_of(server, "paused-publisher")
    assert type(conn.transport) is ParkedSocket
    payloads = [b"%03d" % i + b"x" * 1000 for i in range(20)]  # ~20 KiB in one write: one large read
    raw.send_raw(b"".join(encode(Publish("plant/fh", p, 1, packet_id=i + 1), MQTT_311) for i, p in enumerate(payloads)))
    await wait_until(lambda: conn.machine.paused and type(conn.transport) is not ParkedSocket and conn.transport
                     is not None, what="a paused transport")
    assert server.hub.stats.unparks == 1 and server.hub.stats.read_pauses == 1
    store.gate.set()
    assert [await raw.recv(timeout=10) for _ in payloads] == [Puback(i + 1) for i in range(len(payloads))]
    assert [r.value for r in records(server.store, "mqtt")] == payloads
    await raw.close()
