"""An MQTT device whose payload no route can parse gets its PUBACK (QoS 1) / PUBCOMP (QoS 2): the payload
is a dead letter with its reason, and the device is never stuck retrying a message nobody can parse."""

from __future__ import annotations

import asyncio
import json

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import MqttServer, run
from tests.ingest.test_bad_input import DEEP


async def test_mqtt_json_route_acks_a_deeply_nested_publish(server: MqttServer) -> None:
    """mosquitto_pub and paho get their PUBACK / PUBCOMP; the payload is a dead letter, neighbours kept."""
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-V", "mqttv5", "-q", "1",
                             "-t", "sensors/deep/temperature", "-s", stdin=DEEP)
    assert code == 0, err

    def paho_publish() -> None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="deep-paho", protocol=paho.MQTTv311)
        client.connect("127.0.0.1", server.port)
        client.loop_start()
        try:
            infos = [
                client.publish("sensors/deep/temperature", json.dumps({"ts": 1_700_000_000_000}), qos=1),
                client.publish("sensors/deep/temperature", DEEP, qos=2),
                client.publish("sensors/deep/temperature", json.dumps({"ts": 1_700_000_001_000}), qos=1),
            ]
            for info in infos:
                info.wait_for_publish(10)
                assert info.is_published()
        finally:
            client.disconnect()
            client.loop_stop()

    await asyncio.to_thread(paho_publish)
    assert [r.timestamp for r in records(server.store, "temperatures")] == [1_700_000_000_000, 1_700_000_001_000]
    letters = records(server.store, "_dead_letters")
    assert [r.value for r in letters] == [DEEP, DEEP]
    assert all(b"nested too deeply" in (r.header("reason") or b"") for r in letters)
    assert server.hub.stats.append_errors == 0
