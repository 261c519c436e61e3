"""Durable sessions and retained messages across ``kill -9`` of a real ``sluice serve`` (segment store,
default flush): persistent subscribers get every message acknowledged to its publisher after the restart,
QoS 2 exactly once (also when the kill falls between PUBREC and PUBREL), retained messages and their
deletion survive, expired messages and sessions do not come back. Clients: paho-mqtt, mosquitto_pub/sub
(3.1.1 and -V 5), and raw packets where the claim is about exact packets and packet ids."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.ingest.mqtt.conftest import RawClient, run
from tests.ingest.mqtt.test_durability import start_sluice

pytestmark = pytest.mark.slow


class Sluice:
    """One data directory, started, killed with SIGKILL and started again."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    async def start(self) -> Sluice:
        self.proc, self.port = await asyncio.to_thread(start_sluice, self.data)
        return self

    async def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait, 10)
        assert self.proc.returncode == -signal.SIGKILL

    async def restart_after_kill9(self) -> None:
        await self.kill9()
        await self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
async def sluice(tmp_path: Path) -> AsyncIterator[Sluice]:
    data = tmp_path / "data"
    data.mkdir()
    server = await Sluice(data).start()
    yield server
    server.stop()


def paho_session(port: int, client_id: str, version: int, subscribe: tuple[str, int] | None = None,
                 sub_id: int = 0) -> tuple[bool, list[paho.MQTTMessage], paho.Client]:
    """Connect a persistent paho session (3.1.1 clean session 0, 5.0 expiry 3600 s), optionally subscribe
    and wait for the SUBACK; returns (session present, messages received so far, the client)."""
    v5 = version == MQTT_5
    if v5:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    else:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311,
                             clean_session=False)
    got: list[paho.MQTTMessage] = []
    connected = threading.Event()
    subscribed = threading.Event()
    present: list[bool] = []

    def on_connect(c: paho.Client, u: object, flags: paho.ConnectFlags, rc: object, p: object) -> None:
        present.append(flags.session_present)
        connected.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_message = lambda c, u, m: got.append(m)
    if v5:
        props = PahoProperties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        client.connect("127.0.0.1", port, clean_start=False, properties=props)
    else:
        client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    if subscribe is not None:
        if v5:
            sub_props = None
            if sub_id:
                sub_props = PahoProperties(PacketTypes.SUBSCRIBE)
                sub_props.SubscriptionIdentifier = sub_id
            client.subscribe(subscribe[0], options=SubscribeOptions(qos=subscribe[1]), properties=sub_props)
        else:
            client.subscribe(subscribe[0], qos=subscribe[1])
        assert subscribed.wait(10)
    return present[0], got, client


def close(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


def paho_publish(port: int, topic: str, payloads: list[bytes], qos: int) -> None:
    """Publish and wait until every message is acknowledged (PUBACK / PUBCOMP)."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{topic}", protocol=paho.MQTTv311)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = [client.publish(topic, p, qos=qos) for p in payloads]
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published()
    close(client)


async def test_qos1_acknowledged_messages_reach_a_311_persistent_subscriber_after_kill9(sluice: Sluice) -> None:
    present, _, sub = await asyncio.to_thread(paho_session, sluice.port, "dur-311", MQTT_311, ("dur/#", 1))
    assert not present
    close(sub)
    payloads = [b"m%04d" % i for i in range(300)]
    await asyncio.to_thread(paho_publish, sluice.port, "dur/a", payloads, 1)
    for i in range(3):  # mosquitto_pub exits 0 only after its PUBACK
        code, _, err = await run("mosquitto_pub", "-p", str(sluice.port), "-V", "mqttv311", "-q", "1",
                                 "-t", "dur/b", "-m", f"cli{i}")
        assert code == 0, err
    await sluice.restart_after_kill9()
    code, out, err = await run("mosquitto_sub", "-p", str(sluice.port), "-V", "mqttv311", "-c", "-i", "dur-311",
                               "-q", "1", "-t", "dur/#", "-C", "303", "-W", "20", "-F", "%t %p")
    assert code == 0, err
    lines = out.splitlines()
    assert lines == [f"dur/a {p.decode()}" for p in payloads] + [f"dur/b cli{i}" for i in range(3)]

    # mosquitto_sub -C exits on the 303rd message without waiting for its last PUBACKs to be written:
    # those (at most its 20 in flight) are owed again, once, before anything newer.
    present, got, sub = await asyncio.to_thread(paho_session, sluice.port, "dur-311", MQTT_311)
    assert present
    await asyncio.to_thread(paho_publish, sluice.port, "dur/d", [b"drained"], 1)
    await wait_for(lambda: any(m.payload == b"drained" for m in got))
    close(sub)
    redelivered = [m.payload.decode() for m in got[:-1]]
    tail = [line.split(" ")[1] for line in lines[-20:]]
    assert redelivered == tail[len(tail) - len(redelivered):]

    # The subscription itself survived (no SUBSCRIBE after the restart): a message published after a
    # second kill -9 reaches the session, and nothing acknowledged is delivered again.
    await sluice.restart_after_kill9()
    await asyncio.to_thread(paho_publish, sluice.port, "dur/c", [b"after"], 1)
    await sluice.restart_after_kill9()
    present, got, sub = await asyncio.to_thread(paho_session, sluice.port, "dur-311", MQTT_311)
    assert present
    await wait_for(lambda: bool(got))
    await asyncio.to_thread(paho_publish, sluice.port, "dur/d", [b"end"], 1)
    await wait_for(lambda: any(m.payload == b"end" for m in got))
    close(sub)
    assert [(m.topic, m.payload) for m in got] == [("dur/c", b"after"), ("dur/d", b"end")]


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_mqtt5_session_with_properties_and_subscription_id_survives_kill9(sluice: Sluice) -> None:
    present, _, sub = await asyncio.to_thread(paho_session, sluice.port, "dur-5", MQTT_5, ("v5/#", 2), 42)
    close(sub)
    port = str(sluice.port)
    published = time.monotonic()
    code, _, err = await run("mosquitto_pub", "-p", port, "-V", "5", "-q", "1", "-t", "v5/expiring", "-m", "gone",
                             "-D", "publish", "message-expiry-interval", "1")
    assert code == 0, err
    code, _, err = await run("mosquitto_pub", "-p", port, "-V", "5", "-q", "2", "-t", "v5/kept", "-m", "hello",
                             "-D", "publish", "user-property", "k", "v", "-D", "publish", "content-type", "text/plain",
                             "-D", "publish", "message-expiry-interval", "3600")
    assert code == 0, err
    await sluice.kill9()
    while time.monotonic() - published < 1.5:  # the first message's expiry passes while the server is down
        await asyncio.sleep(0.05)
    await sluice.start()
    # Queue order is kept: had the expired message come back, it would be the first one printed.
    code, out, err = await run("mosquitto_sub", "-p", str(sluice.port), "-V", "5", "-c", "-i", "dur-5",
                               "-x", "3600", "-q", "2", "-t", "v5/#", "-C", "1", "-W", "10",
                               "-F", "%t %p %q qos, ids %S, %C, %P, expiry %E")
    assert code == 0, err
    topic, payload, rest = out.strip().split(" ", 2)
    assert (topic, payload) == ("v5/kept", "hello")
    assert rest.startswith("2 qos, ids 42, text/plain, k:v, expiry ")
    assert 3500 < int(rest.rsplit(" ", 1)[1]) <= 3600  # the remaining interval


async def test_qos2_from_a_publisher_is_stored_and_delivered_once_when_killed_between_pubrec_and_pubrel(
    sluice: Sluice,
) -> None:
    _, _, sub = await asyncio.to_thread(paho_session, sluice.port, "q2-sub", MQTT_311, ("q2/#", 2))
    close(sub)
    pub = await RawClient.open(sluice.port)
    await pub.connect("q2-pub", clean_start=False)
    pub.send(Publish("q2/t", b"once", 2, False, False, 7))
    assert await pub.recv() == Pubrec(7)
    await pub.close()
    await sluice.restart_after_kill9()  # between the PUBREC and the PUBREL

    pub = await RawClient.open(sluice.port)
    ack = await pub.connect("q2-pub", clean_start=False)
    assert ack.session_present
    pub.send(Publish("q2/t", b"once", 2, False, True, 7))  # the publisher did not see the PUBREC: it resends
    assert await pub.recv() == Pubrec(7)  # answered, not stored a second time
    pub.send(Pubrel(7))
    assert await pub.recv() == Pubcomp(7)
    pub.send(Publish("q2/t", b"end", 2, False, False, 8))
    assert await pub.recv() == Pubrec(8)
    pub.send(Pubrel(8))
    assert await pub.recv() == Pubcomp(8)
    await pub.close()
    await sluice.restart_after_kill9()
    code, out, err = await run("mosquitto_sub", "-p", str(sluice.port), "-V", "mqttv311", "-c", "-i", "q2-sub",
                               "-q", "2", "-t", "q2/#", "-C", "2", "-W", "10")
    assert code == 0, err
    assert out.splitlines() == ["once", "end"]


async def test_qos2_to_a_subscriber_keeps_its_packet_id_and_owes_only_pubrel_after_kill9(sluice: Sluice) -> None:
    sub = await RawClient.open(sluice.port, MQTT_5)
    await sub.connect("q2-out", clean_start=True, properties=Properties(session_expiry_interval=3600))
    sub.send(Subscribe(1, (Subscription("o/#", 2),)))
    assert isinstance(await sub.recv(), Suback)
    sub.send(Disconnect())
    await sub.close()
    for i in (1, 2):
        code, _, err = await run("mosquitto_pub", "-p", str(sluice.port), "-V", "5", "-q", "2", "-t", f"o/{i}",
                                 "-m", f"m{i}")
        assert code == 0, err
    sub = await RawClient.open(sluice.port, MQTT_5)
    assert (await sub.connect("q2-out", clean_start=False,
                              properties=Properties(session_expiry_interval=3600))).session_present
    first, second = await sub.recv(), await sub.recv()
    assert isinstance(first, Publish) and isinstance(second, Publish)
    assert (first.payload, second.payload) == (b"m1", b"m2")
    assert first.packet_id and second.packet_id
    sub.send(Pubrec(first.packet_id))
    assert await sub.recv() == Pubrel(first.packet_id)  # sent once "released" is durable
    await sub.close()
    await sluice.restart_after_kill9()  # the client holds m2 unreleased, has released m1

    sub = await RawClient.open(sluice.port, MQTT_5)
    assert (await sub.connect("q2-out", clean_start=False,
                              properties=Properties(session_expiry_interval=3600))).session_present
    resent = [await sub.recv(), await sub.recv()]
    assert resent[0] == Pubrel(first.packet_id)  # m1 is not sent again: only its PUBREL
    again = resent[1]
    assert isinstance(again, Publish) and again.payload == b"m2"
    assert again.packet_id == second.packet_id  # the same id: the client knows it has it
    sub.send(Pubcomp(first.packet_id))
    sub.send(Pubrec(second.packet_id))
    assert await sub.recv() == Pubrel(second.packet_id)
    sub.send(Pubcomp(second.packet_id))
    sub.send(Pingreq())
    assert isinstance(await sub.recv(), Pingresp)
    await sub.close()


async def test_retained_messages_and_their_deletion_survive_kill9_and_expired_ones_do_not(sluice: Sluice) -> None:
    port = str(sluice.port)
    for args in (["-t", "ret/a", "-m", "A"], ["-t", "ret/b", "-m", "B"], ["-t", "ret/b", "-n"],
                 ["-V", "5", "-t", "ret/c", "-m", "C", "-D", "publish", "message-expiry-interval", "1"],
                 ["-V", "5", "-t", "ret/d", "-m", "D", "-D", "publish", "message-expiry-interval", "3600"]):
        code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-r", *args)
        assert code == 0, err
    published = time.monotonic()
    await sluice.kill9()
    while time.monotonic() - published < 1.5:  # ret/c expires while the server is down
        await asyncio.sleep(0.05)
    await sluice.start()
    code, out, err = await run("mosquitto_sub", "-p", str(sluice.port), "-V", "5", "-t", "ret/#", "-C", "2",
                               "-W", "10", "-F", "%t %p %r %E")
    assert code == 0, err
    assert sorted(out.splitlines())[0] == "ret/a A 1 "
    topic, payload, flag, expiry = sorted(out.splitlines())[1].split(" ")
    assert (topic, payload, flag) == ("ret/d", "D", "1") and 3500 < int(expiry) <= 3600
    # Exactly those two: everything retained is sent before the answer to a PINGREQ that follows SUBSCRIBE.
    raw = await RawClient.open(sluice.port)
    await raw.connect("ret-check", clean_start=True)
    raw.send(Subscribe(1, (Subscription("ret/#", 0),)))
    raw.send(Pingreq())
    got = []
    while not isinstance(packet := await raw.recv(), Pingresp):
        got.append(packet)
    await raw.close()
    assert isinstance(got[0], Suback)
    assert sorted((p.topic, p.payload) for p in got[1:] if isinstance(p, Publish)) == [("ret/a", b"A"), ("ret/d", b"D")]
    assert len(got) == 3


async def test_an_expired_session_is_gone_after_kill9(sluice: Sluice) -> None:
    sub = await RawClient.open(sluice.port, MQTT_5)
    await sub.connect("short", clean_start=True, properties=Properties(session_expiry_interval=1))
    sub.send(Subscribe(1, (Subscription("short/#", 1),)))
    assert isinstance(await sub.recv(), Suback)
    sub.send(Disconnect())
    await sub.close()
    left = time.monotonic()
    code, _, err = await run("mosquitto_pub", "-p", str(sluice.port), "-q", "1", "-t", "short/x", "-m", "late")
    assert code == 0, err
    await sluice.kill9()
    while time.monotonic() - left < 1.5:  # the session expires while the server is down
        await asyncio.sleep(0.05)
    await sluice.start()
    sub = await RawClient.open(sluice.port, MQTT_5)
    ack = await sub.connect("short", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert not ack.session_present
    sub.send(Pingreq())
    assert isinstance(await sub.recv(), Pingresp)  # and no message of the old session
    await sub.close()


async def test_messages_sent_before_a_kill9_go_out_again_with_dup_set_and_never_sent_ones_without(
    sluice: Sluice,
) -> None:
    """§4.4 across kill -9, exact bytes: m1 and m2 are sent as they arrive (Receive Maximum 2), m1 is
    acknowledged so m3 goes out from the queue, m4 and m5 wait unsent. After the restart m2 and m3 come
    again with DUP=1 and their packet ids (0x3C QoS 2, 0x3A QoS 1), m4 and m5 with DUP=0 (0x34, 0x32)."""
    sub = await RawClient.open(sluice.port, MQTT_5)
    await sub.connect("dup-k", clean_start=True, properties=Properties(session_expiry_interval=3600, receive_maximum=2))
    sub.send(Subscribe(1, (Subscription("dup/#", 2),)))
    assert isinstance(await sub.recv(), Suback)
    for i, qos in enumerate((1, 2, 1, 2, 1), start=1):
        code, _, err = await run("mosquitto_pub", "-p", str(sluice.port), "-V", "5", "-q", str(qos), "-t", "dup/t",
                                 "-m", f"m{i}")
        assert code == 0, err
    first, second = await sub.recv_bytes(), await sub.recv_bytes()
    sub.send_raw(bytes((0x40, 2)) + first[9:11])  # PUBACK m1 (topic "dup/t": the packet id is bytes 9-10)
    third = await sub.recv_bytes()
    assert [(p[0], p[12:]) for p in (first, second, third)] == [(0x32, b"m1"), (0x34, b"m2"), (0x32, b"m3")]
    sub.send(Pingreq())  # the PUBACK is handled (and m3's mark journaled) before the PINGRESP
    assert (await sub.recv_bytes())[0] == 0xD0
    await sub.close()
    await sluice.restart_after_kill9()

    back = await RawClient.open(sluice.port, MQTT_5)
    back.send(Connect("dup-k", MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=3600)))
    connack = await back.recv_bytes()
    assert connack[:4] == bytes((0x20, connack[1], 0x01, 0x00))  # session present
    again = [await back.recv_bytes() for _ in range(4)]
    assert [(p[0], p[12:]) for p in again] == [(0x3C, b"m2"), (0x3A, b"m3"), (0x34, b"m4"), (0x32, b"m5")]
    assert [p[9:11] for p in again[:2]] == [second[9:11], third[9:11]]
    await back.close()


async def mqtt_status(sluice: Sluice) -> dict[str, Any]:
    """GET /mqtt of the running server (its HTTP API is announced after the MQTT listener)."""
    await wait_for(lambda: "http" in json.loads((sluice.data / "endpoints.json").read_text()), 20)
    http = json.loads((sluice.data / "endpoints.json").read_text())["http"]
    url = f"http://127.0.0.1:{http['port']}/mqtt"

    def get() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=10) as response:
            return cast(dict[str, Any], json.load(response))

    return await asyncio.to_thread(get)


async def wait_status(sluice: Sluice, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while not predicate(status := await mqtt_status(sluice)):
        assert time.monotonic() < deadline, f"timed out; /mqtt says {status}"
        await asyncio.sleep(0.05)
    return status


LATE_S = 5  # w-late's Will Delay Interval: pending at the kill even on a loaded machine


async def test_wills_pending_or_of_open_connections_are_published_after_kill9_unless_the_client_returns(
    sluice: Sluice,
) -> None:
    """§3.1.2.5 / §3.1.3.2.2 across kill -9 (as Mosquitto 2.1's persistence; 2.0 loses them): w-late left
    without DISCONNECT, its Will Delay Interval (LATE_S, 5 s) pending; w-back left the same way with 600 s; at the
    kill mosquitto_sub (clean session, a will) and w-open (persistent, Will Delay 2 s) are connected. After
    the restart: mosquitto_sub's will goes out at once, w-open's 2 s later, w-late's when its delay has
    passed (with its properties), and w-back's is cancelled when its client reconnects to its session."""
    port = str(sluice.port)
    _, _, sub = await asyncio.to_thread(paho_session, sluice.port, "w-sub", MQTT_5, ("will/#", 1))
    close(sub)
    watcher = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", port, "-V", "5", "-i", "w-cli", "-t", "nothing/#", "--will-topic", "will/w-cli",
        "--will-payload", "cli gone", "--will-qos", "1", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        def will(client_id: str, delay: int) -> Will:
            props = Properties(will_delay_interval=delay, content_type="text/plain", user_property=(("k", "v"),))
            return Will(f"will/{client_id}", client_id.encode(), 1, False, props)

        clients = {}
        for client_id, delay, expiry in (("w-late", LATE_S, 60), ("w-back", 600, 3600), ("w-open", 2, 60)):
            clients[client_id] = raw = await RawClient.open(sluice.port, MQTT_5)
            await raw.connect(client_id, clean_start=True, will=will(client_id, delay),
                              properties=Properties(session_expiry_interval=expiry))
        # w-late leaves last, just before the kill: its will must still be pending then (at load 16 closing
        # w-back and polling /mqtt took more than the 3 s it had, and the will went out before the kill)
        await clients["w-back"].close()
        await clients["w-late"].close()
        left = time.monotonic()
        await wait_status(sluice, lambda s: s["wills_pending"] == 2 and s["connections"] == 2)
        killed = time.monotonic()
        await sluice.restart_after_kill9()
        await clients["w-open"].close()

        present, got, sub = await asyncio.to_thread(paho_session, sluice.port, "w-sub", MQTT_5)
        assert present
        status = await mqtt_status(sluice)
        assert status["wills_pending"] >= 1  # w-back's at least
        back = await RawClient.open(sluice.port, MQTT_5)
        assert (await back.connect("w-back", clean_start=False,
                                   properties=Properties(session_expiry_interval=3600))).session_present
        await wait_for(lambda: {m.topic for m in got} >= {"will/w-cli", "will/w-late", "will/w-open"}, 20)
        close(sub)
        status = await wait_status(sluice, lambda s: s["wills_pending"] == 0)
        assert status["wills_published"] == 3
        assert sorted(m.topic for m in got) == ["will/w-cli", "will/w-late", "will/w-open"]
        when = {m.topic: m for m in got}  # paho stamps each message with time.monotonic() as it arrives
        late = when["will/w-late"]
        assert late.timestamp >= left + LATE_S and late.payload == b"w-late"
        assert late.properties is not None
        names = ("ContentType", "UserProperty")  # set by paho only when received: not declared attributes
        assert tuple(getattr(late.properties, name) for name in names) == ("text/plain", [("k", "v")])
        assert when["will/w-open"].timestamp >= killed + 2
        assert when["will/w-cli"].payload == b"cli gone"
        await back.close()
    finally:
        if watcher.returncode is None:
            watcher.kill()
        await watcher.wait()
