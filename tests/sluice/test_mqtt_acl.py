"""ACLs on the MQTT front door against a real ``sluice serve``: a device topic is judged by the log topic the
ingest routes lead it to (by default ``sensors/<id>`` -> ``sensors``, anything else -> ``mqtt``). Real clients
(mosquitto_pub/sub 5 and 3.1.1, paho) get Mosquitto's answers: PUBACK/PUBREC 0x87 (5.0) or a silent drop
(3.1.1), SUBACK 0x87 (5.0) / 0x80 (3.1.1) per filter, CONNACK 0x87 for a refused will topic."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker.security import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType, UserStore
from tests.sluice_server import SluiceProcess


def allow(principal: str, operation: Operation, topic: str) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, PatternType.LITERAL, principal, "*", operation, Permission.ALLOW)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("mqtt-acl") / "data"
    users = UserStore(data)
    for name in ("alice", "admin"):
        users.add(name, "pw")
    # alice may write and read the sensors topic only; "mqtt" (the catch-all) is not hers
    AclStore(data).add([allow("User:alice", op, "sensors") for op in (Operation.WRITE, Operation.READ)])
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["admin"]'}).start()
    yield proc
    proc.stop()


def mosquitto(server: SluiceProcess, tool: str, version: str, *args: str) -> subprocess.CompletedProcess[str]:
    port = str(server.endpoints["mqtt"]["port"])
    return subprocess.run([tool, "-p", port, "-V", version, "-u", "alice", "-P", "pw", *args],
                          capture_output=True, text=True, timeout=30, check=False)


def stored(server: SluiceProcess, topic: str) -> list[Any]:
    """Every record of ``topic`` (all partitions), read as a super user; [] when the topic does not exist."""
    with httpx.Client(base_url=server.http, auth=("admin", "pw")) as client:
        described = client.get(f"/topics/{topic}")
        if described.status_code == 404:
            return []
        return [record for part in described.json()["partitions"]
                for record in client.get(f"/topics/{topic}/records",
                                         params={"partition": part["partition"]}).json()["records"]]


def test_mosquitto_pub_allowed_refused_v5_and_dropped_v311(server: SluiceProcess) -> None:
    reading = '{"temp": 1, "ts": 1700000000000}'
    ok = mosquitto(server, "mosquitto_pub", "mqttv5", "-q", "1", "-t", "sensors/7", "-m", reading)
    assert ok.returncode == 0, ok.stderr
    for qos in ("1", "2"):  # PUBACK / PUBREC 0x87
        refused = mosquitto(server, "mosquitto_pub", "mqttv5", "-q", qos, "-t", "other/7", "-m", "x")
        assert "not authorized" in (refused.stdout + refused.stderr).lower(), refused
    # 3.1.1 has no negative PUBACK: acknowledged and dropped, as Mosquitto does
    dropped = mosquitto(server, "mosquitto_pub", "mqttv311", "-q", "1", "-t", "other/8", "-m", "y")
    assert dropped.returncode == 0, dropped.stderr
    assert [r["value"] for r in stored(server, "sensors")] == [{"temp": 1, "ts": 1700000000000}]
    assert stored(server, "mqtt") == []  # neither refused message was stored


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_mosquitto_sub_refused_filter(server: SluiceProcess, version: str) -> None:
    refused = mosquitto(server, "mosquitto_sub", version, "-t", "other/#", "-C", "1", "-W", "5")
    assert "All subscription requests were denied." in refused.stderr, refused
    granted = mosquitto(server, "mosquitto_sub", version, "-t", "sensors/+", "-C", "1", "-W", "1")
    assert "denied" not in granted.stderr and "Timed out" in granted.stderr, granted  # subscribed, nothing came


def paho_client(server: SluiceProcess, protocol: paho.MQTTProtocolVersion, **will: Any) -> tuple[paho.Client, int]:
    connected = threading.Event()
    codes: list[int] = []

    def on_connect(client: paho.Client, userdata: object, flags: object, reason: Any, props: object) -> None:
        codes.append(int(getattr(reason, "value", reason)))
        connected.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
    client.username_pw_set("alice", "pw")
    if will:
        client.will_set(**will)
    client.on_connect = on_connect
    client.connect("127.0.0.1", server.endpoints["mqtt"]["port"])
    client.loop_start()
    assert connected.wait(10), "no CONNACK"
    return client, codes[0]


@pytest.mark.parametrize(("protocol", "refused_code"), [(paho.MQTTv5, 0x87), (paho.MQTTv311, 0x80)])
def test_paho_suback_per_filter(server: SluiceProcess, protocol: paho.MQTTProtocolVersion, refused_code: int) -> None:
    client, code = paho_client(server, protocol)
    granted: list[list[int]] = []
    done = threading.Event()

    def on_subscribe(client: paho.Client, userdata: object, mid: int, reasons: Any, props: object) -> None:
        granted.append([int(r.value) for r in reasons])
        done.set()

    client.on_subscribe = on_subscribe
    try:
        assert code == 0
        client.subscribe([("sensors/+", 1), ("other/#", 1), ("$share/g/sensors/+", 0)])
        assert done.wait(10), "no SUBACK"
    finally:
        client.disconnect()
        client.loop_stop()
    assert granted == [[1, refused_code, 0]]


def test_paho_v5_puback_0x87_in_order(server: SluiceProcess) -> None:
    client, code = paho_client(server, paho.MQTTv5)
    acks: dict[int, int] = {}
    all_acked = threading.Event()

    def on_publish(client: paho.Client, userdata: object, mid: int, reason: Any, props: object) -> None:
        acks[mid] = int(reason.value)
        if len(acks) == 3:
            all_acked.set()

    client.on_publish = on_publish
    try:
        assert code == 0
        mids = [client.publish(topic, b'{"temp": 2, "ts": 1700000000000}', qos=qos).mid
                for topic, qos in (("sensors/1", 1), ("other/1", 1), ("sensors/2", 1))]
        assert all_acked.wait(10), acks
    finally:
        client.disconnect()
        client.loop_stop()
    assert [acks[m] for m in mids] == [0, 0x87, 0]


def test_refused_will_topic_refuses_the_connect(server: SluiceProcess) -> None:
    client, code = paho_client(server, paho.MQTTv5, topic="other/will", payload=b"gone")
    client.disconnect()
    client.loop_stop()
    assert code == 0x87
    allowed, code = paho_client(server, paho.MQTTv5, topic="sensors/will", payload=b"{}")
    allowed.disconnect()
    allowed.loop_stop()
    assert code == 0


def test_denials_are_counted(server: SluiceProcess) -> None:
    mosquitto(server, "mosquitto_pub", "mqttv5", "-q", "1", "-t", "other/9", "-m", "z")
    with httpx.Client(base_url=server.http, auth=("admin", "pw")) as client:
        text = client.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith('sluice_authorization_denied_total{front_door="mqtt"}'))
    assert float(line.split()[-1]) >= 1
