"""MQTT over TLS and over WebSockets against a real ``sluice serve``, with real clients: mosquitto_pub/sub
(--cafile, -u/-P), paho-mqtt (TLS, and its websockets transport with MQTT 3.1.1 and 5.0), a session taken
across transports, and the WebSocket handshake and frame rules (bad subprotocol, text frame)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect as ws_connect

from broker.security import UserStore
from sluice.dev_certs import DevCertificates
from tests.sluice_server import SluiceProcess
from tests.tls_certs import client_context, make_certs, tls_env

PASSWORD = "device secret"
mosquitto = pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto clients not installed")

PORTS = {"SLUICE_MQTT__TLS_PORT": "0", "SLUICE_MQTT__WS_PORT": "0", "SLUICE_MQTT__WSS_PORT": "0",
         "SLUICE_MQTT__WEBSOCKETS": "true"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_certs(tmp_path_factory.mktemp("mqtt-tls") / "tls", clients=("sensor-9",))


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    """Auth off; plain, TLS, ws and wss doors."""
    proc = SluiceProcess(tmp_path_factory.mktemp("mqtt-open") / "data", env={**tls_env(certs), **PORTS})
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("mqtt-auth") / "data"
    UserStore(data).add("dev", PASSWORD)
    proc = SluiceProcess(data, env={**tls_env(certs, client_ca=True), **PORTS, "SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["dev", "sensor-9"]'})  # ACLs: test_mqtt_acl
    proc.start()
    yield proc
    proc.stop()


def port(server: SluiceProcess, door: str) -> int:
    return int(server.endpoints[door]["port"])


class Paho:
    """A paho-mqtt client (callback API 2) whose events the test waits on."""

    def __init__(self, client_id: str, *, transport: str = "tcp", version: paho.MQTTProtocolVersion = paho.MQTTv311,
                 clean_session: bool | None = None) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, transport=transport,  # type: ignore[arg-type]
                                  protocol=version, clean_session=clean_session)
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.subscribed = threading.Event()
        self.received: list[tuple[str, bytes]] = []
        self.got_message = threading.Event()
        self.connack: dict[str, Any] = {}
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *args: self.disconnected.set()
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.on_message = self._on_message

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.connack = {"session_present": flags.session_present, "reason": reason}
        self.connected.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.received.append((message.topic, message.payload))
        self.got_message.set()

    def connect(self, port: int, **kwargs: Any) -> Paho:
        self.client.connect("localhost", port, keepalive=30, **kwargs)
        self.client.loop_start()
        assert self.connected.wait(15), "no CONNACK"
        return self

    def subscribe(self, topic: str, qos: int = 1) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic, qos)
        assert self.subscribed.wait(15), "no SUBACK"

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.parametrize("version", [paho.MQTTv311, paho.MQTTv5])
def test_paho_websockets_publish_reaches_a_tcp_subscriber_and_back(open_server: SluiceProcess,
                                                                   version: paho.MQTTProtocolVersion) -> None:
    ws = Paho(f"ws-{version}", transport="websockets", version=version)
    ws.client.ws_set_options(path="/mqtt")
    ws.connect(port(open_server, "mqtt-ws"))
    tcp = Paho(f"tcp-{version}").connect(port(open_server, "mqtt"))
    try:
        assert ws.connack["reason"] == 0
        tcp.subscribe(f"ws/{version}/#")
        ws.subscribe(f"tcp/{version}/#")
        ws.client.publish(f"ws/{version}/up", b"from a browser", qos=1).wait_for_publish(15)
        assert tcp.got_message.wait(15) and tcp.received == [(f"ws/{version}/up", b"from a browser")]
        tcp.client.publish(f"tcp/{version}/down", b"to a browser", qos=1).wait_for_publish(15)
        assert ws.got_message.wait(15) and ws.received == [(f"tcp/{version}/down", b"to a browser")]
    finally:
        ws.stop()
        tcp.stop()


def test_paho_secure_websockets(open_server: SluiceProcess, certs: DevCertificates) -> None:
    client = Paho("wss-client", transport="websockets", version=paho.MQTTv5)
    client.client.tls_set(ca_certs=str(certs.ca))
    client.connect(port(open_server, "mqtt-wss"))
    try:
        client.subscribe("wss/echo")
        client.client.publish("wss/echo", b"secure", qos=1).wait_for_publish(15)
        assert client.got_message.wait(15) and client.received == [("wss/echo", b"secure")]
    finally:
        client.stop()


def test_session_taken_over_from_tcp_to_websockets(open_server: SluiceProcess) -> None:
    tcp = Paho("roamer", clean_session=False)  # a 3.1.1 persistent session
    tcp.client.reconnect_delay_set(60, 120)  # no reconnect fight with the new owner
    tcp.connect(port(open_server, "mqtt"))
    tcp.subscribe("roam/#")
    ws = Paho("roamer", transport="websockets", clean_session=False)
    ws.connect(port(open_server, "mqtt-ws"))
    try:
        assert tcp.disconnected.wait(15), "the TCP connection was not taken over"
        assert ws.connack["session_present"] is True
        publisher = Paho("roam-publisher").connect(port(open_server, "mqtt"))
        publisher.client.publish("roam/1", b"follows the session", qos=1).wait_for_publish(15)
        publisher.stop()
        assert ws.got_message.wait(15) and ws.received == [("roam/1", b"follows the session")]
    finally:
        tcp.client.loop_stop()
        ws.stop()


def _upgrade(port: int, protocol_header: str | None) -> bytes:
    request = ("GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    if protocol_header is not None:
        request += f"Sec-WebSocket-Protocol: {protocol_header}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall((request + "\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def test_websocket_subprotocol_rules(open_server: SluiceProcess) -> None:
    ws_port = port(open_server, "mqtt-ws")
    refused = _upgrade(ws_port, "chat, superchat")
    assert refused.startswith(b"HTTP/1.1 400 "), refused
    accepted = _upgrade(ws_port, "chat, mqtt")
    assert accepted.startswith(b"HTTP/1.1 101 ") and b"Sec-WebSocket-Protocol: mqtt\r\n" in accepted
    old_client = _upgrade(ws_port, "mqttv3.1")
    assert b"Sec-WebSocket-Protocol: mqttv3.1\r\n" in old_client
    none_offered = _upgrade(ws_port, None)
    assert none_offered.startswith(b"HTTP/1.1 101 ") and b"Sec-WebSocket-Protocol" not in none_offered
    with pytest.raises(InvalidStatus) as status:
        ws_connect(f"ws://127.0.0.1:{ws_port}/mqtt", subprotocols=["chat"], open_timeout=10)  # type: ignore[list-item]
    assert status.value.response.status_code == 400


def _read_to_close(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


def test_frames_sent_with_the_upgrade_wait_for_its_answer(open_server: SluiceProcess) -> None:
    """Bytes after the request head are frames of the connection the answer opens: a refused upgrade gets its
    400 (the frames never parsed; before, a bad frame there failed the handshake first and the 400 then hit
    the library's assertion, a traceback in the broker log), an accepted one its 101 and then the frames'
    verdict (a reserved opcode: close 1002)."""
    ws_port = port(open_server, "mqtt-ws")
    bad_frame = b"\x8e\x80\x00\x00\x00\x00"  # opcode 0xE (reserved), masked, empty
    refused = (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Protocol: chat\r\n\r\n")
    accepted = refused.replace(b"Protocol: chat", b"Protocol: mqtt")
    for request, status in ((refused, b"HTTP/1.1 400 "), (accepted, b"HTTP/1.1 101 ")):
        with socket.create_connection(("127.0.0.1", ws_port), timeout=10) as sock:
            sock.sendall(request + bad_frame)
            answer = _read_to_close(sock)
        assert answer.startswith(status), answer
        if status == b"HTTP/1.1 101 ":
            frame = answer.split(b"\r\n\r\n", 1)[1]
            assert frame[0] == 0x88 and frame[2:4] == (1002).to_bytes(2, "big"), frame  # close 1002 + its reason
    client = Paho("after-pipelined", transport="websockets").connect(ws_port)
    client.stop()
    log = open_server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def websocket_counters(server: SluiceProcess, certs: DevCertificates) -> dict[str, float]:
    url = f"https://localhost:{port(server, 'http')}/metrics"
    with urllib.request.urlopen(url, context=client_context(certs), timeout=15) as answer:
        text = answer.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("sluice_mqtt_websocket_")}


def test_text_frame_closes_with_1003_and_the_door_keeps_serving(open_server: SluiceProcess,
                                                                certs: DevCertificates) -> None:
    before = websocket_counters(open_server, certs)
    ws_port = port(open_server, "mqtt-ws")
    with ws_connect(f"ws://127.0.0.1:{ws_port}/mqtt", subprotocols=["mqtt"], open_timeout=10) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "mqtt"
        ws.send("CONNECT as text")
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003
    with socket.create_connection(("127.0.0.1", ws_port), timeout=10) as sock:  # not a WebSocket request at all
        sock.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
    client = Paho("after-text", transport="websockets").connect(ws_port)
    client.stop()
    after = websocket_counters(open_server, certs)
    text, refused = "sluice_mqtt_websocket_text_frames_total", "sluice_mqtt_websocket_handshake_refusals_total"
    assert after[text] == before[text] + 1
    assert after[refused] == before[refused] + 1  # the raw MQTT CONNECT sent where an HTTP upgrade belongs
    log = open_server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


@mosquitto
def test_mosquitto_over_tls_with_cafile(open_server: SluiceProcess, certs: DevCertificates) -> None:
    tls_port = str(port(open_server, "mqtt-tls"))
    sub = subprocess.Popen(["mosquitto_sub", "-h", "localhost", "-p", tls_port, "--cafile", str(certs.ca),
                            "-t", "tls/#", "-C", "1", "-W", "30", "-q", "1"], stdout=subprocess.PIPE)
    try:
        # retained: the subscriber gets it whether it subscribed before or after the publish
        subprocess.run(["mosquitto_pub", "-h", "localhost", "-p", tls_port, "--cafile", str(certs.ca), "-t", "tls/x",
                        "-m", "secured", "-q", "1", "-r"], check=True, timeout=30)
        out, _ = sub.communicate(timeout=40)
        assert out == b"secured\n"
    finally:
        sub.kill()
    wrong_ca = subprocess.run(["mosquitto_pub", "-h", "localhost", "-p", tls_port, "--capath", "/nonexistent",
                               "--cafile", "/etc/ssl/certs/ca-certificates.crt", "-t", "tls/x", "-m", "x"],
                              capture_output=True, timeout=30)
    assert wrong_ca.returncode != 0  # our dev CA is not in the system store


@mosquitto
@pytest.mark.parametrize(("credentials", "refusal"), [
    (["-u", "dev", "-P", PASSWORD], None),
    (["-u", "dev", "-P", "wrong"], b"bad user name or password"),
    ([], b"not authori"),
])
def test_mosquitto_over_tls_with_passwords(auth_server: SluiceProcess, certs: DevCertificates,
                                           credentials: list[str], refusal: bytes | None) -> None:
    done = subprocess.run(["mosquitto_pub", "-h", "localhost", "-p", str(port(auth_server, "mqtt-tls")),
                           "--cafile", str(certs.ca), *credentials, "-t", "sensors/tls-1", "-m", '{"v": 1}',
                           "-q", "1"], capture_output=True, timeout=30)
    if refusal is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and refusal in done.stderr.lower(), done.stderr


def test_paho_tls_with_password(auth_server: SluiceProcess, certs: DevCertificates) -> None:
    client = Paho("paho-tls", version=paho.MQTTv5)
    client.client.tls_set(ca_certs=str(certs.ca))
    client.client.username_pw_set("dev", PASSWORD)
    client.connect(port(auth_server, "mqtt-tls"))
    try:
        assert client.connack["reason"] == 0
        client.subscribe("paho/tls")
        client.client.publish("paho/tls", b"hello", qos=1).wait_for_publish(15)
        assert client.got_message.wait(15)
    finally:
        client.stop()


@mosquitto
def test_client_certificate_logs_in_as_its_common_name(auth_server: SluiceProcess, certs: DevCertificates) -> None:
    """Mosquitto's use_identity_as_username: a verified certificate is the login; the CONNECT's user name and
    password are not checked (auth = required, no password given, or a wrong one)."""
    cert = ["--cert", str(certs.directory / "sensor-9.pem"), "--key", str(certs.directory / "sensor-9-key.pem")]
    for extra in ([], ["-u", "someone", "-P", "wrong"]):
        done = subprocess.run(["mosquitto_pub", "-h", "localhost", "-p", str(port(auth_server, "mqtt-tls")),
                               "--cafile", str(certs.ca), *cert, *extra, "-t", "sensors/sensor-9", "-m", '{"v": 9}',
                               "-q", "1"], capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
    # the same certificate over secure WebSockets (paho): the TLS layer under the WebSocket carries it
    client = Paho("sensor-9-wss", transport="websockets", version=paho.MQTTv5)
    client.client.tls_set(ca_certs=str(certs.ca), certfile=str(certs.directory / "sensor-9.pem"),
                          keyfile=str(certs.directory / "sensor-9-key.pem"))
    client.connect(port(auth_server, "mqtt-wss"))
    try:
        assert client.connack["reason"] == 0
    finally:
        client.stop()
    # without a certificate and without a password, auth = required still refuses
    refused = Paho("no-cert-wss", transport="websockets", version=paho.MQTTv5)
    refused.client.tls_set(ca_certs=str(certs.ca))
    refused.connect(port(auth_server, "mqtt-wss"))
    try:
        assert refused.connack["reason"] == 0x87  # Not authorized
    finally:
        refused.client.loop_stop()
