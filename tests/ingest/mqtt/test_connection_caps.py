"""Connection storms: the MQTT front door caps open connections (in total and per client address), closes
the ones beyond at accept (as Mosquitto does at max_connections: no CONNACK), counts them and logs them
without flooding; a socket that never sends CONNECT is closed after the CONNECT timeout.
(TCP: tests/ingest/test_tcp_caps.py.)"""

from __future__ import annotations

import asyncio
import logging
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from sluice.config import Settings
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import RawClient, StartServer, run, wait_until


def paho_connect(port: int, client_id: str, source: str) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", port, bind_address=source)
    client.loop_start()
    return client


async def publish_from(port: str, source: str, version: str = "mqttv311") -> tuple[int, str]:
    code, _, err = await run("mosquitto_pub", "-p", port, "-A", source, "-V", version, "-q", "1",
                             "-t", "storm/t", "-m", source)
    return code, err


async def test_mqtt_caps_total_and_per_address(start_server: StartServer, caplog: pytest.LogCaptureFixture) -> None:
    server = await start_server(max_connections=3, max_connections_per_address=2)
    port = str(server.port)
    held = [await asyncio.to_thread(paho_connect, server.port, f"hold-{i}", "127.0.0.1") for i in range(2)]
    try:
        await wait_until(lambda: len(server.hub.connections) == 2, what="two connections")
        with caplog.at_level(logging.WARNING, logger="ingest.mqtt"):
            for version in ("mqttv311", "mqttv5"):  # a third from 127.0.0.1: closed before CONNACK
                code, err = await publish_from(port, "127.0.0.1", version)
                assert code != 0 and "connection was lost" in err.lower(), err
            code, err = await publish_from(port, "127.0.0.2")  # another address still gets in
            assert code == 0, err
            third = await asyncio.to_thread(paho_connect, server.port, "hold-3", "127.0.0.3")
            held.append(third)
            await wait_until(lambda: len(server.hub.connections) == 3, what="three connections")
            code, err = await publish_from(port, "127.0.0.4")  # the total is reached
            assert code != 0, err
        refusals = [r.getMessage() for r in caplog.records if "refused MQTT connection" in r.getMessage()]
        assert len(refusals) == 2, refusals  # one line per reason, not one per connection
        assert "max_connections_per_address = 2 reached" in refusals[0]
        assert "max_connections = 3 reached" in refusals[1]
        assert server.hub.admission.refused == {"max_connections_per_address": 2, "max_connections": 1}
        assert server.hub.stats.connections_total == 4  # the refused ones were never served
    finally:
        for client in held:
            await asyncio.to_thread(client.disconnect)
            client.loop_stop()
    await wait_until(lambda: server.hub.admission.open == 0, what="slots released")
    code, err = await publish_from(port, "127.0.0.1")
    assert code == 0, err
    assert sorted(r.value or b"" for r in records(server.store, "mqtt")) == [b"127.0.0.1", b"127.0.0.2"]


async def test_a_socket_without_connect_is_closed_after_the_connect_timeout(start_server: StartServer) -> None:
    assert Settings().mqtt.connect_timeout_s == 10.0
    server = await start_server(connect_timeout_s=1.0, max_connections=1)
    raw = await RawClient.open(server.port)
    started = time.monotonic()
    assert await raw.read_until_closed(timeout=10) == b""
    assert 0.9 <= time.monotonic() - started < 4.0  # the sweep runs once a second
    await wait_until(lambda: server.hub.admission.open == 0, what="slot released")
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-q", "1", "-t", "t", "-m", "m")
    assert code == 0, err
