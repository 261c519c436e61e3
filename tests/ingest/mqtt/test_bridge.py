"""The MQTT bridge against a real Mosquitto started by the test: messages from paho arrive in Sluice;
reconnects with backoff; Sluice killed (SIGKILL) and restarted mid-stream loses nothing (at least once)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore
from ingest.bridge import MqttBridge
from sluice.components.mqtt import mqtt_bridges
from sluice.config import load_settings
from sluice.runtime import Component, Runtime
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import MqttServer
from tests.ingest.mqtt.mosquitto import Mosquitto
from tests.ingest.mqtt.test_durability import start_sluice


def publish(port: int, topic: str, payloads: list[bytes], pace_s: float = 0.0, client_id: str = "plant-pub") -> None:
    """paho publishes QoS 1 to Mosquitto and waits for every PUBACK."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.max_inflight_messages_set(50)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = []
        for i, payload in enumerate(payloads):
            infos.append(client.publish(topic, payload, qos=1))
            if pace_s and i % 10 == 9:
                time.sleep(pace_s)
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def stored_count(data: Path) -> int:
    """Records in topic ``mqtt`` of the running ``sluice serve`` (its HTTP API; 0 until it answers)."""
    try:
        port = json.loads((data / "endpoints.json").read_text())["http"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/topics/mqtt", timeout=5) as reply:
            detail = json.load(reply)
    except (OSError, KeyError, ValueError):
        return 0  # not listening yet, or the bridge has not created the topic yet
    return sum(p["high_watermark"] - p["log_start_offset"] for p in detail["partitions"])


async def wait_for(predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_bridge_moves_messages_reports_status_and_reconnects(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    settings = load_settings(data_dir=tmp_path, mqtt={"port": 0, "bridges": [
        {"name": "site1", "host": "127.0.0.1", "port": broker.port, "topics": ["plant/#"],
         "client_id": "sluice-it", "backoff_initial_s": 0.1, "backoff_max_s": 0.4}]})
    store = MemoryLogStore(default_config=settings.storage.topic_defaults())
    runtime = Runtime(settings, store)
    component = mqtt_bridges(runtime)
    assert component is not None
    bridge: MqttBridge = runtime.registries["bridges"]["site1"]
    await component.start()
    try:
        await wait_for(lambda: broker.subscribed("sluice-it", "plant/#"), what="bridge subscription")
        await asyncio.to_thread(publish, broker.port, "plant/line1/temp", [b"m%d" % i for i in range(50)])
        await wait_for(lambda: len(records(store, "mqtt")) == 50, what="bridged records")
        recs = records(store, "mqtt")
        assert [r.value for r in recs] == [b"m%d" % i for i in range(50)]
        assert recs[0].key == b"plant/line1/temp"
        assert dict(recs[0].headers)["source"] == b"bridge:site1"
        # the status counts a batch once its write returned (records become readable a little earlier)
        await wait_for(lambda: bridge.status()["acked"] == 50, what="acked count")
        status = bridge.status()
        assert status["connected"] and status["messages"] == 50
        assert status["last_message_at"] is not None and status["connects"] == 1

        # The broker goes away: the bridge reports it and retries with backoff.
        broker.stop()
        await wait_for(lambda: not bridge.status()["connected"] and bridge.status()["last_error"], what="disconnect")
        await asyncio.sleep(0.8)  # a few backoff rounds against a closed port
        assert not bridge.status()["connected"]
        broker.start()  # same port, same persistence
        await wait_for(lambda: bridge.status()["connected"], what="reconnect")
        assert bridge.status()["connects"] == 2
        await asyncio.to_thread(publish, broker.port, "plant/line2/temp", [b"n%d" % i for i in range(10)])
        expected = {b"m%d" % i for i in range(50)} | {b"n%d" % i for i in range(10)}
        await wait_for(lambda: {r.value for r in records(store, "mqtt")} == expected,
                       what=f"records after reconnect: {bridge.status()}")
    finally:
        await component.stop()
        broker.stop()


@pytest.mark.slow
async def _start_bridge(tmp_path: Path, port: int, **bridge: Any) -> tuple[MqttBridge, MemoryLogStore, Component]:
    settings = load_settings(data_dir=tmp_path, mqtt={"port": 0, "bridges": [
        {"name": "site2", "host": "127.0.0.1", "port": port, **bridge}]})
    store = MemoryLogStore(default_config=settings.storage.topic_defaults())
    runtime = Runtime(settings, store)
    component = mqtt_bridges(runtime)
    assert component is not None
    await component.start()
    return runtime.registries["bridges"]["site2"], store, component


async def test_the_bridge_is_connected_once_its_subscription_is_granted(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    bridge, store, component = await _start_bridge(tmp_path, broker.port, topics=["plant/#"], client_id="sluice-sub")
    try:
        await asyncio.wait_for(bridge.connected.wait(), 15)
        # Reported after the SUBACK, so Mosquitto has taken the SUBSCRIBE (and logged it): a message published
        # from now on is routed to the bridge's new session.
        assert broker.subscribed("sluice-sub", "plant/#"), broker.log[-2000:]
        assert bridge.status()["subscriptions_refused"] == 0
        await asyncio.to_thread(publish, broker.port, "plant/line3/temp", [b"first"], 0.0, "plant-pub-3")
        await wait_for(lambda: [r.value for r in records(store, "mqtt")] == [b"first"], what="the first message")
    finally:
        await component.stop()
        broker.stop()


async def test_a_filter_the_broker_refuses_is_logged_counted_and_the_others_flow(
    tmp_path: Path, server: MqttServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The remote broker here is Sluice's own MQTT listener: it refuses a shared subscription without a filter
    # (MQTT 5 SUBACK 0x8F); Mosquitto 2.0 grants every filter and applies its ACL at delivery instead.
    bridge, store, component = await _start_bridge(
        tmp_path, server.port, topics=["plant/#", "$share/g"], client_id="sluice-refused", protocol=5)
    try:
        await asyncio.wait_for(bridge.connected.wait(), 15)
        status = bridge.status()
        assert status["subscriptions_refused"] == 1
        assert status["last_error"] == "subscription refused: $share/g (0x8F)"
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
            "bridge subscription refused by the broker"]
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="plant-pub-4")
        client.connect("127.0.0.1", server.port)
        client.loop_start()
        try:
            client.publish("plant/line4/temp", b"granted", qos=1).wait_for_publish(10)
        finally:
            client.disconnect()
            client.loop_stop()
        await wait_for(lambda: b"granted" in [r.value for r in records(store, "mqtt")], what="the granted message")
    finally:
        await component.stop()


async def test_sluice_killed_mid_stream_loses_nothing(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    data = tmp_path / "data"
    data.mkdir()
    bridges = [{"name": "plant", "host": "127.0.0.1", "port": broker.port, "topics": ["plant/#"],
                "client_id": "sluice-crash", "backoff_initial_s": 0.1, "backoff_max_s": 0.5}]
    os.environ["SLUICE_MQTT__BRIDGES"] = json.dumps(bridges)
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = (await asyncio.to_thread(start_sluice, data))[0]
        await wait_for(lambda: broker.subscribed("sluice-crash", "plant/#"), what="bridge subscription")
        # 1. a live stream; Sluice is killed in the middle of it
        live = [b"live-%05d" % i for i in range(1500)]
        sender = threading.Thread(target=publish, args=(broker.port, "plant/m1/power", live, 0.004))
        sender.start()
        await asyncio.sleep(0.4)
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        await asyncio.to_thread(sender.join, 60)
        # 2. more arrives while Sluice is down: the broker queues it in our persistent session; Sluice
        #    comes back to a flood of queued messages and is killed again in the middle of it
        backlog = [b"queued-%05d-" % i + b"x" * 80 for i in range(8000)]
        await asyncio.to_thread(publish, broker.port, "plant/m2/power", backlog, 0.0, "plant-pub-2")
        proc = (await asyncio.to_thread(start_sluice, data))[0]
        await wait_for(lambda: "sluice-crash" in broker.log.rsplit("New client connected", 1)[-1],
                       what="bridge reconnect")
        await asyncio.sleep(0.15)
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        proc = (await asyncio.to_thread(start_sluice, data))[0]

        # Everything Mosquitto accepted must reach the log. Wait until the topic holds at least as many
        # records as were sent (the bridge catches up at its own pace: on a loaded machine that takes
        # a while), then stop Sluice cleanly and read its log; if something is still missing, start it
        # again (the broker still holds the rest for us).
        expected = set(live) | set(backlog)
        deadline = time.monotonic() + 180  # a deadline for a loaded machine, not a wait
        while True:
            while await asyncio.to_thread(stored_count, data) < len(expected) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
            store = SegmentLogStore(data / "logs")
            await store.start()
            stored = [r.value for r in records(store, "mqtt")]
            await store.close()
            missing = expected - set(stored)
            if not missing:
                break
            assert time.monotonic() < deadline, f"{len(missing)} messages never arrived, e.g. {sorted(missing)[:3]}"
            proc = (await asyncio.to_thread(start_sluice, data))[0]
        assert len(stored) >= len(expected)  # at least once (redeliveries after a kill are allowed)
    finally:
        os.environ.pop("SLUICE_MQTT__BRIDGES", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
