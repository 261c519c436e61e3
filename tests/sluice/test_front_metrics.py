"""The front doors on ``/metrics``, ``/bridges``, ``/mqtt`` and in ``sluice sources``, with real traffic.

One real Sluice (``sluice serve`` subprocess, in-memory store) with an MQTT bridge to a real Mosquitto
started on a free port. kcat and confluent-kafka drive the Kafka front, paho the MQTT listener and the
bridge; ``/metrics`` is parsed with prometheus-client's own parser and must count exactly what was done.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as paho
import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from sluice.cli import app
from tests.ingest.mqtt.mosquitto import Mosquitto
from tests.sluice_server import SluiceProcess

BRIDGE = "site"
BRIDGE_CLIENT = f"bridge-{uuid.uuid4().hex[:6]}"
WIDE = {"COLUMNS": "200"}  # rich tables are not squeezed to 80 columns

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: SluiceProcess) -> Samples:
    resp = httpx.get(f"{server.http}/metrics", timeout=10)
    assert resp.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path_factory.mktemp("front-mosquitto"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mosquitto: Mosquitto) -> Iterator[SluiceProcess]:
    bridges = [{"name": BRIDGE, "host": "127.0.0.1", "port": mosquitto.port, "topics": ["plant/#"],
                "client_id": BRIDGE_CLIENT, "backoff_initial_s": 0.1, "backoff_max_s": 0.5}]
    data = Path(tmp_path_factory.mktemp("front-metrics")) / "data"
    proc = SluiceProcess(data, env={"SLUICE_MQTT__BRIDGES": json.dumps(bridges)}).start()
    yield proc
    proc.stop()


def kcat(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def paho_publish(port: int, topic: str, payloads: list[bytes], client_id: str, *, stay: bool = False) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = [client.publish(topic, p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(timeout=10)
        assert info.is_published()
    if not stay:
        client.disconnect()
        client.loop_stop()
    return client


def test_kafka_traffic_is_counted(server: SluiceProcess) -> None:
    topic = f"km-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    again = admin.create_topics([NewTopic(topic, 2, 1)])[topic]
    with pytest.raises(Exception) as failed:
        again.result(10)
    assert failed.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    lines = [f"k{i % 5}:reading {i}" for i in range(200)]
    kcat("-P", "-b", server.bootstrap, "-t", topic, "-K", ":", stdin="\n".join(lines) + "\n")
    got = kcat("-C", "-b", server.bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%s\n")
    assert sorted(got.splitlines()) == sorted(line.split(":", 1)[1] for line in lines)

    m = scrape(server)
    assert m[("sluice_kafka_produce_records_total", ())] == 200
    stored = sum(m[("sluice_partition_size_bytes", (("partition", str(p)), ("topic", topic)))] for p in (0, 1))
    assert m[("sluice_kafka_produce_bytes_total", ())] == stored > 0  # batches are stored as they came
    assert m[("sluice_kafka_fetch_bytes_total", ())] >= stored  # the consumer got every stored batch
    assert m[("sluice_kafka_requests_total", (("api", "create_topics"),))] == 2
    assert m[("sluice_kafka_requests_total", (("api", "produce"),))] >= 1
    assert m[("sluice_kafka_requests_total", (("api", "fetch"),))] >= 1
    assert m[("sluice_kafka_requests_total", (("api", "api_versions"),))] >= 3  # admin, producer, consumer
    assert m[("sluice_kafka_errors_total", (("code", "36"), ("error", "TOPIC_ALREADY_EXISTS")))] == 1
    assert m[("sluice_kafka_connections_accepted_total", (("listener", "default"),))] >= 3

    del admin  # closes its connections; kcat has exited
    wait_for(lambda: scrape(server)[("sluice_kafka_connections", (("listener", "default"),))] == 0,
             "Kafka connections to close")


def test_mqtt_listener_is_counted_and_shown(server: SluiceProcess) -> None:
    port = server.endpoints["mqtt"]["port"]
    payloads = [json.dumps({"device_id": "m1", "t": i}).encode() for i in range(25)]
    before = scrape(server)
    client = paho_publish(port, "sensors/m1/temperature", payloads, "metrics-m1", stay=True)
    try:
        m = scrape(server)
        assert m[("sluice_mqtt_connections", ())] == 1
        assert m[("sluice_mqtt_messages_in_total", ())] - before[("sluice_mqtt_messages_in_total", ())] == 25
        grown = m[("sluice_mqtt_bytes_in_total", ())] - before[("sluice_mqtt_bytes_in_total", ())]
        assert grown == sum(len(p) for p in payloads)
        status = httpx.get(f"{server.http}/mqtt").json()
        assert status["connections"] == 1 and status["endpoint"] == server.address("mqtt")
        assert status["messages_in"] == m[("sluice_mqtt_messages_in_total", ())]
    finally:
        client.disconnect()
        client.loop_stop()
    wait_for(lambda: scrape(server)[("sluice_mqtt_connections", ())] == 0, "the MQTT connection to close")
    assert httpx.get(f"{server.http}/mqtt").json()["connections"] == 0


def test_bridge_status_metrics_and_sources(server: SluiceProcess, mosquitto: Mosquitto) -> None:
    def bridge() -> dict[str, Any]:
        resp = httpx.get(f"{server.http}/bridges/{BRIDGE}")
        assert resp.status_code == 200
        return dict(resp.json())

    # "connected" is set at the CONNACK, before the bridge's SUBSCRIBE: a message published to Mosquitto
    # before the subscription is in place is not queued for the bridge (a fresh session)
    wait_for(lambda: mosquitto.subscribed(BRIDGE_CLIENT, "plant/#"), "the bridge to subscribe")
    payloads = [f"state {i}".encode() for i in range(12)]
    paho_publish(mosquitto.port, "plant/line1/state", payloads, "plant-device")
    status = wait_for(lambda: (b := bridge())["acked"] == 12 and b, "the bridge to move and ack 12 messages")
    assert status["messages"] == 12 and status["bytes"] == sum(len(p) for p in payloads)
    assert status["broker"] == f"127.0.0.1:{mosquitto.port}" and status["topics"] == ["plant/#"]
    assert 0 <= status["last_message_age_s"] < 30
    assert [b["name"] for b in httpx.get(f"{server.http}/bridges").json()] == [BRIDGE]

    labels = (("bridge", BRIDGE), ("broker", status["broker"]))
    m = scrape(server)
    assert m[("sluice_bridge_connected", labels)] == 1
    assert m[("sluice_bridge_messages_total", labels)] == 12
    assert m[("sluice_bridge_acked_total", labels)] == 12
    assert 0 <= m[("sluice_bridge_last_message_age_seconds", labels)] < 30

    result = CliRunner().invoke(app, ["sources", "--interval", "0", "--http", server.http], env=WIDE)
    assert result.exit_code == 0, result.stderr
    assert "MQTT bridges" in result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith(f"│ {BRIDGE} ")]
    assert [c.strip() for c in line.split("│")[1:5]] == [BRIDGE, status["broker"], "yes", "12"]
    assert f"MQTT listener {server.address('mqtt')}" in result.stdout
    result = CliRunner().invoke(app, ["sources", "--json", "--interval", "0", "--http", server.http])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    (bridge_row,) = [r for r in rows if r["type"] == "bridge"]
    assert bridge_row["name"] == BRIDGE and bridge_row["messages"] == 12 and bridge_row["connected"] is True
    assert [r["type"] for r in rows].count("mqtt_listener") == 1
    assert any(r["type"] == "source" and r["source"] == f"bridge:{BRIDGE}" and r["messages"] == 12 for r in rows)

    mosquitto.stop()  # the external broker goes away: the bridge says so, with the error
    try:
        down = wait_for(lambda: (b := bridge())["connected"] is False and b["last_error"] and b,
                        "the bridge to report the lost broker")
        assert down["messages"] == 12
        assert scrape(server)[("sluice_bridge_connected", labels)] == 0
        result = CliRunner().invoke(app, ["sources", "--interval", "0", "--http", server.http], env=WIDE)
        assert result.exit_code == 0
        (line,) = [x for x in result.stdout.splitlines() if x.startswith(f"│ {BRIDGE} ")]
        assert [c.strip() for c in line.split("│")[1:5]] == [BRIDGE, status["broker"], "no", "12"], result.stdout
        assert "Connection refused" in line
    finally:
        mosquitto.start()
    wait_for(lambda: bridge()["connected"], "the bridge to reconnect")
    assert bridge()["connects"] >= 2


def test_unknown_bridge_is_a_problem(server: SluiceProcess) -> None:
    resp = httpx.get(f"{server.http}/bridges/nope")
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["type"].endswith("unknown-bridge") and "GET /bridges" in resp.json()["detail"]
