"""Clients that break the rules get the right CONNACK/DISCONNECT reason, and nobody else notices."""

from __future__ import annotations

import asyncio
import logging
import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from ingest.mqtt.packets import MQTT_5, MQTT_311, Connack, Disconnect, Puback, Publish, Will
from tests.ingest.conftest import records
from tests.ingest.mqtt.conftest import MqttServer, RawClient, StartServer, run, wait_until


class Bystander:
    """A well-behaved paho device that keeps publishing at QoS 1 while others misbehave."""

    def __init__(self, port: int) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bystander", protocol=paho.MQTTv5)
        self.disconnects = 0
        self.client.on_disconnect = lambda *a: setattr(self, "disconnects", self.disconnects + 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.sent = 0

    def publish(self) -> None:
        info = self.client.publish("sensors/bystander/temperature", b'{"ts": 1, "v": %d}' % self.sent, qos=1)
        info.wait_for_publish(10)
        assert info.is_published()
        self.sent += 1

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def test_garbage_oversize_and_wrong_level_leave_others_unaffected(start_server: StartServer) -> None:
    server = await start_server(max_packet_bytes=4096)
    port = str(server.port)
    bystander = await asyncio.to_thread(Bystander, server.port)
    try:
        await asyncio.to_thread(bystander.publish)

        # 1. garbage before CONNECT: the socket is closed without an answer (§4.8 / 3.1.4-1)
        raw = await RawClient.open(server.port)
        raw.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await raw.read_until_closed() == b""
        await asyncio.to_thread(bystander.publish)

        # 2. garbage after CONNECT (5.0): DISCONNECT 0x81 malformed packet, then close
        raw = await RawClient.open(server.port, MQTT_5)
        assert (await raw.connect("junk")).reason_code == 0
        raw.send_raw(b"\x00\x00")
        data = await raw.read_until_closed()
        assert data[0] == 0xE0 and data[2] == 0x81
        await asyncio.to_thread(bystander.publish)

        # 3. an oversized PUBLISH (5.0): DISCONNECT 0x95, detected from the fixed header alone
        raw = await RawClient.open(server.port, MQTT_5)
        ack = await raw.connect("big")
        assert ack.properties.maximum_packet_size == 4096
        raw.send_raw(b"\x30\xff\xff\x03")  # PUBLISH announcing 65535 bytes
        data = await raw.read_until_closed()
        assert data[0] == 0xE0 and data[2] == 0x95
        # ...and under 3.1.1 the socket is closed (3.1.1 has no server DISCONNECT)
        raw = await RawClient.open(server.port, MQTT_311)
        await raw.connect("big311")
        raw.send(Publish("sensors/big/temperature", b"x" * 5000, 1, packet_id=1))
        assert await raw.read_until_closed() == b""
        await asyncio.to_thread(bystander.publish)
        # mosquitto_pub 3.1.1 with an oversized message: connection lost, no acknowledgement
        code, _, _ = await run("mosquitto_pub", "-p", port, "-q", "1", "-t", "big", "-m", "y" * 5000)
        assert code != 0

        # 4. wrong protocol level: MQTT 3.1 (level 3) gets the 3.1.1-format CONNACK 0x01
        code, _, err = await run("mosquitto_pub", "-p", port, "-V", "mqttv31", "-t", "t", "-m", "m")
        assert code != 0
        assert "unacceptable protocol version" in err.lower()
        raw = await RawClient.open(server.port)
        raw.send_raw(b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01c")  # level 7
        assert await raw.read_until_closed() == b"\x20\x03\x00\x84\x00"  # 5.0-format CONNACK 0x84
        await asyncio.to_thread(bystander.publish)

        assert bystander.disconnects == 0
        stored = [r for r in records(server.store, "temperatures") if r.key == b"bystander"]
        assert len(stored) == bystander.sent == 5
        assert server.hub.stats.protocol_errors >= 3
    finally:
        await asyncio.to_thread(bystander.close)


async def test_mqtt5_client_refused_when_only_311_is_enabled(start_server: StartServer) -> None:
    server = await start_server(protocol_versions=[4])
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-V", "mqttv5", "-t", "t", "-m", "m")
    assert code != 0
    assert "unsupported protocol version" in err.lower()
    code, _, err = await run("mosquitto_pub", "-p", str(server.port), "-V", "mqttv311", "-q", "1", "-t", "t", "-m", "m")
    assert code == 0, err


async def test_authentication_hook(start_server: StartServer) -> None:
    server = await start_server(allow_anonymous=False, users={"meter": "s3cret"})
    port = str(server.port)
    code, _, err = await run("mosquitto_pub", "-p", port, "-t", "t", "-m", "m")
    assert code != 0 and "not authorised" in err.lower()
    code, _, err = await run("mosquitto_pub", "-p", port, "-u", "meter", "-P", "wrong", "-t", "t", "-m", "m")
    assert code != 0 and "bad user name or password" in err.lower()
    code, _, err = await run("mosquitto_pub", "-p", port, "-V", "mqttv5", "-u", "meter", "-P", "wrong",
                             "-t", "t", "-m", "m")
    assert code != 0
    raw = await RawClient.open(server.port, MQTT_5)
    assert (await raw.connect("x", username="meter", password=b"nope")).reason_code == 0x86
    code, _, err = await run("mosquitto_pub", "-p", port, "-u", "meter", "-P", "s3cret", "-q", "1",
                             "-t", "t", "-m", "m")
    assert code == 0, err
    assert [r.value for r in records(server.store, "mqtt")] == [b"m"]


def paho_connack(port: int, protocol: paho.MQTTProtocolVersion, username: str | None, password: str | None) -> int:
    """CONNACK reason paho reports for one login attempt (3.1.1 codes as paho maps them to 5.0 values)."""
    got: list[int] = []
    done = threading.Event()

    def on_connect(client: paho.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        got.append(int(getattr(reason, "value", 0)))
        done.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="locked-out", protocol=protocol)
    if username is not None:
        client.username_pw_set(username, password)
    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK"
    finally:
        client.loop_stop()
        client.disconnect()
    return got[0]


async def test_no_users_and_no_anonymous_means_nobody_gets_in(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    """allow_anonymous = false with no users used to let any username in; now every login is refused."""
    with caplog.at_level(logging.WARNING, logger="ingest.mqtt"):
        server = await start_server(allow_anonymous=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("every client is refused" in w and "no users are configured" in w for w in warnings), warnings
    port = str(server.port)
    for version in ("mqttv311", "mqttv5"):
        for creds in ([], ["-u", "anyone", "-P", "anything"]):
            code, _, err = await run("mosquitto_pub", "-p", port, "-V", version, *creds, "-q", "1",
                                     "-t", "t", "-m", "m")
            assert code != 0, (version, creds)
            expected = "not authori" if version == "mqttv311" or not creds else "bad user name or password"
            assert expected in err.lower(), (version, creds, err)
    # the exact codes: 3.1.1 0x05 either way; 5.0 0x86 for credentials, 0x87 without
    raw = await RawClient.open(server.port, MQTT_311)
    assert (await raw.connect("x", username="anyone", password=b"pw")).reason_code == 0x05
    raw = await RawClient.open(server.port, MQTT_5)
    assert (await raw.connect("x", username="anyone", password=b"pw")).reason_code == 0x86
    raw = await RawClient.open(server.port, MQTT_5)
    assert (await raw.connect("x")).reason_code == 0x87
    assert await asyncio.to_thread(paho_connack, server.port, paho.MQTTv311, "anyone", "pw") == 0x87  # paho: 5
    assert await asyncio.to_thread(paho_connack, server.port, paho.MQTTv5, "anyone", "pw") == 0x86
    assert not server.store.has_topic("mqtt") and not server.hub.sessions
    assert server.hub.stats.refused_logins == 9


async def test_keepalive_expiry_disconnects_with_0x8d_and_publishes_the_will(server: MqttServer) -> None:
    got: list[bytes | bytearray] = []  # paho's MQTTMessage.payload type
    ready = threading.Event()
    watcher = paho.Client(CallbackAPIVersion.VERSION2, client_id="watcher")
    watcher.on_message = lambda c, u, m: got.append(m.payload)
    watcher.on_subscribe = lambda *a: ready.set()
    watcher.connect("127.0.0.1", server.port)
    watcher.subscribe("status/#", qos=1)
    watcher.loop_start()
    try:
        assert await asyncio.to_thread(ready.wait, 10)
        raw = await RawClient.open(server.port, MQTT_5)
        await raw.connect("sleepy", keepalive=1, will=Will("status/sleepy", b"offline", 1))
        started = asyncio.get_running_loop().time()
        data = await raw.read_until_closed(timeout=10)  # silence: no PINGREQ
        assert data[0] == 0xE0 and data[2] == 0x8D
        assert 1.5 <= asyncio.get_running_loop().time() - started < 4
        await wait_until(lambda: got == [b"offline"], what="will delivered")
        assert [r.value for r in records(server.store, "mqtt")] == [b"offline"]  # and appended
    finally:
        watcher.disconnect()
        watcher.loop_stop()


async def test_will_only_on_abnormal_disconnect(server: MqttServer) -> None:
    raw = await RawClient.open(server.port)
    await raw.connect("polite", will=Will("status/polite", b"gone"))
    raw.send(Disconnect())
    await raw.read_until_closed()
    raw = await RawClient.open(server.port)
    await raw.connect("rude", will=Will("status/rude", b"gone"))
    await raw.close()  # socket dropped without DISCONNECT
    await wait_until(lambda: len(records(server.store, "mqtt")) == 1, what="will appended")
    assert [(r.key, r.value) for r in records(server.store, "mqtt")] == [(b"status/rude", b"gone")]


async def test_second_connection_takes_the_session_over(server: MqttServer) -> None:
    first = await RawClient.open(server.port, MQTT_5)
    await first.connect("twin")
    second = await RawClient.open(server.port, MQTT_5)
    ack = await second.connect("twin", clean_start=False)
    assert isinstance(ack, Connack)
    data = await first.read_until_closed()
    assert data[0] == 0xE0 and data[2] == 0x8E
    second.send(Publish("t/twin", b"x", 1, packet_id=3))
    assert await second.recv() == Puback(3)
