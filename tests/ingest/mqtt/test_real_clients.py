"""Real MQTT clients nobody here wrote (mosquitto_pub/sub from Debian, paho-mqtt) against the Sluice
MQTT front door: QoS 0/1/2 over 3.1.1 and 5.0 land in the right topic, key, partition and event time;
subscribers receive what devices publish; persistent sessions get their QoS 1 messages after a reconnect."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from tests.ingest.conftest import read_all, records
from tests.ingest.mqtt.conftest import MqttServer, run, wait_until

VERSIONS = {"mqttv311": paho.MQTTv311, "mqttv5": paho.MQTTv5}
BASE_TS = 1_700_000_000_000


def reading(device: str, i: int) -> bytes:
    return json.dumps({"device_id": device, "ts": BASE_TS + i * 1000, "celsius": 20 + i}).encode()


def has_temperatures(server: MqttServer, device: str, n: int) -> bool:
    """Exactly n of the device's readings are stored in topic "temperatures"."""
    return len([r for r in records(server.store, "temperatures") if r.key == device.encode()]) == n


def check_temperatures(server: MqttServer, device: str, n: int) -> None:
    """The device's n readings are in topic "temperatures", keyed by device, in the key's partition,
    with the event time taken from the payload."""
    by_partition = read_all(server.store, "temperatures")
    expected_partition = server.store.partition_for("temperatures", device.encode())
    mine = [r for r in by_partition.get(expected_partition, []) if r.key == device.encode()]
    assert [json.loads(r.value or b"")["celsius"] for r in mine] == [20 + i for i in range(n)]
    assert [r.timestamp for r in mine] == [BASE_TS + i * 1000 for i in range(n)]
    headers = dict(mine[0].headers)
    assert headers["source"] == b"mqtt:default"
    assert headers["mqtt_topic"] == f"sensors/{device}/temperature".encode()
    others = [r for p, recs in by_partition.items() if p != expected_partition
              for r in recs if r.key == device.encode()]
    assert others == []


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_mosquitto_pub_every_qos_and_version(server: MqttServer, version: str, qos: int) -> None:
    device = f"mp-{version}-q{qos}"
    lines = b"\n".join(reading(device, i) for i in range(5)) + b"\n"
    code, _, err = await run(
        "mosquitto_pub", "-h", "127.0.0.1", "-p", str(server.port), "-V", version, "-q", str(qos),
        "-i", device, "-t", f"sensors/{device}/temperature", "-l", stdin=lines,
    )
    assert code == 0, err
    if qos == 0:  # no acknowledgement to wait for: wait for the append
        await wait_until(lambda: len([r for r in records(server.store, "temperatures") if r.key == device.encode()])
                         == 5, what="QoS 0 records")
    check_temperatures(server, device, 5)
    device_header = dict(records(server.store, "temperatures")[0].headers)["device"]
    assert device_header == device.encode()  # the MQTT client id


def paho_publish(port: int, version: str, qos: int, device: str, n: int) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=device, protocol=VERSIONS[version])
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(f"sensors/{device}/temperature", reading(device, i), qos=qos) for i in range(n)]
        for info in infos:
            info.wait_for_publish(timeout=10)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_paho_every_qos(server: MqttServer, version: str) -> None:
    for qos in (0, 1, 2):
        device = f"paho-{version}-q{qos}"
        await asyncio.to_thread(paho_publish, server.port, version, qos, device, 4)
        await wait_until(functools.partial(has_temperatures, server, device, 4), what="records")
        check_temperatures(server, device, 4)


async def test_unrouted_topic_goes_to_default_mqtt_topic_keyed_by_topic(server: MqttServer) -> None:
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-q", "1", "-t", "plant/line1/state",
                             "-m", "running")
    assert code == 0, err
    recs = records(server.store, "mqtt")
    assert [(r.key, r.value) for r in recs] == [(b"plant/line1/state", b"running")]


async def test_subscriber_receives_what_devices_publish_with_wildcards_and_retained(server: MqttServer) -> None:
    port = str(server.port)
    # a retained command published before anyone subscribes
    code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-r", "-t", "cmd/dev7/setpoint", "-m", "21.5")
    assert code == 0, err
    for version in ("mqttv311", "mqttv5"):
        sub = await asyncio.create_subprocess_exec(
            "mosquitto_sub", "-p", port, "-V", version, "-q", "1", "-v", "-C", "4",
            "-t", "cmd/+/setpoint", "-t", "sensors/#", stdout=asyncio.subprocess.PIPE,
        )
        assert sub.stdout is not None
        first = await asyncio.wait_for(sub.stdout.readline(), 10)  # the retained message, so it is subscribed
        assert first.decode().strip() == "cmd/dev7/setpoint 21.5"
        await asyncio.to_thread(paho_publish, server.port, "mqttv5", 1, f"sub-{version}", 2)
        code, _, err = await run("mosquitto_pub", "-p", port, "-q", "0", "-t", "cmd/dev9/setpoint", "-m", "19")
        assert code == 0, err
        rest, _ = await asyncio.wait_for(sub.communicate(), 10)
        lines = rest.decode().strip().splitlines()
        assert sorted(lines) == sorted([
            f"sensors/sub-{version}/temperature {reading(f'sub-{version}', 0).decode()}",
            f"sensors/sub-{version}/temperature {reading(f'sub-{version}', 1).decode()}",
            "cmd/dev9/setpoint 19",
        ])
        assert sub.returncode == 0


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes | bytearray, int]] = []  # paho types payloads so
        self.connected = threading.Event()
        self.session_present: bool | None = None

    def on_connect(self, client: paho.Client, userdata: object, flags: paho.ConnectFlags, rc: object,
                   props: object = None) -> None:
        self.session_present = flags.session_present
        self.connected.set()

    def on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        self.messages.append((msg.topic, msg.payload, msg.qos))


def persistent_client(port: int, version: str, client_id: str, collector: Collector) -> paho.Client:
    if version == "mqttv5":
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        props = PahoProperties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        client.on_connect = collector.on_connect
        client.on_message = collector.on_message
        client.connect("127.0.0.1", port, clean_start=False, properties=props)
    else:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311,
                             clean_session=False)
        client.on_connect = collector.on_connect
        client.on_message = collector.on_message
        client.connect("127.0.0.1", port)
    client.loop_start()
    assert collector.connected.wait(10)
    return client


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_persistent_session_gets_its_qos1_messages_after_reconnect(server: MqttServer, version: str) -> None:
    client_id = f"valve-{version}"
    first = Collector()
    client = await asyncio.to_thread(persistent_client, server.port, version, client_id, first)
    result, _mid = client.subscribe(f"cmd/{client_id}/#", qos=1)
    assert result == paho.MQTT_ERR_SUCCESS
    await wait_until(lambda: len(server.hub.tree) == 1, what="subscription")
    await asyncio.to_thread(client.disconnect)
    client.loop_stop()
    await wait_until(lambda: server.hub.sessions[client_id].connection is None, what="disconnect")

    # While the device is away, commands are published at QoS 1.
    lines = b"".join(f"open {i}\n".encode() for i in range(3))
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-q", "1", "-t", f"cmd/{client_id}/valve",
                             "-l", stdin=lines)
    assert code == 0, err

    second = Collector()
    client = await asyncio.to_thread(persistent_client, server.port, version, client_id, second)
    try:
        assert second.session_present is True
        await wait_until(lambda: len(second.messages) == 3, what="queued messages")
        assert second.messages == [(f"cmd/{client_id}/valve", f"open {i}".encode(), 1) for i in range(3)]
    finally:
        await asyncio.to_thread(client.disconnect)
        client.loop_stop()


async def test_mosquitto_sub_clean_session_off_with_client_id(server: MqttServer) -> None:
    """mosquitto_sub -c (persistent session, 3.1.1): messages published while it is away arrive next time."""
    port = str(server.port)
    code, _, err = await run("mosquitto_sub", "-p", port, "-c", "-i", "ms-1", "-q", "1", "-t", "alerts/#", "-E")
    assert code == 0, err  # -E: exit once subscribed
    code, _, err = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "alerts/fire", "-m", "drill")
    assert code == 0, err
    start = time.monotonic()
    code, out, err = await run("mosquitto_sub", "-p", port, "-c", "-i", "ms-1", "-q", "1", "-t", "alerts/#",
                               "-C", "1", "-v")
    assert code == 0, err
    assert out.strip() == "alerts/fire drill"
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_qos2_delivery_to_a_subscriber_completes_the_handshake(server: MqttServer, version: str) -> None:
    port = str(server.port)
    sub = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", port, "-V", version, "-q", "2", "-i", f"q2-{version}", "-C", "3", "-t", "orders/#",
        stdout=asyncio.subprocess.PIPE,
    )
    await wait_until(lambda: f"q2-{version}" in server.hub.sessions and len(server.hub.tree) == 1, what="subscribed")
    code, _, err = await run("mosquitto_pub", "-p", port, "-V", version, "-q", "2", "-t", "orders/1", "-l",
                             stdin=b"a\nb\nc\n")
    assert code == 0, err
    out, _ = await asyncio.wait_for(sub.communicate(), 10)
    assert out.decode().split() == ["a", "b", "c"]
    assert sub.returncode == 0
