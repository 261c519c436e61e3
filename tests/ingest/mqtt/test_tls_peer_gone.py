"""A TLS client that ends its side while deliveries are still coming (a real ``sluice serve``, real sockets).

uvloop's TLS layer, once the peer's EOF or close_notify started its shutdown, drops every later write and, from
the fifth on, logs ``WARNING asyncio: SSL connection is closed`` for each; the MQTT connection is only told
(``connection_lost``) when that shutdown is over, and the app transport's ``is_closing()`` stays false until
then. The adapter reads the TCP state before it writes (``ingest/mqtt/tls_peer.py``) and stops writing once the
client's end of stream is there, so the log stays clean.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sluice.dev_certs import DevCertificates
from tests.sluice_server import SluiceProcess
from tests.tls_certs import client_context, make_certs, tls_env

# MQTT 5 (its Receive Maximum, 65535, lets every QoS 1 delivery go out at once; 3.1.1 clients get 20)
CONNECT = b"\x10\x13\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x06gone-1"
SUBSCRIBE = b"\x82\x0c\x00\x01\x00\x00\x06gone/#\x01"  # QoS 1


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_certs(tmp_path_factory.mktemp("tls-gone") / "tls")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    proc = SluiceProcess(tmp_path_factory.mktemp("tls-gone") / "data",
                         env={**tls_env(certs), "SLUICE_MQTT__TLS_PORT": "0"})
    proc.start()
    yield proc
    proc.stop()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def _read_packet(sock: socket.socket) -> bytes:
    first = _read_exactly(sock, 1)
    length, mult, head = 0, 1, first
    while True:
        byte = _read_exactly(sock, 1)
        head += byte
        length += (byte[0] & 0x7F) * mult
        mult *= 128
        if not byte[0] & 0x80:
            return head + _read_exactly(sock, length)


def _publish_qos1(topic: bytes, pid: int, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + pid.to_bytes(2, "big") + payload
    size, length = len(body), b""
    while True:
        byte, size = size % 128, size // 128
        length += bytes((byte | (0x80 if size else 0),))
        if not size:
            return b"\x32" + length + body


def test_no_writes_after_the_tls_peer_ended_its_side(server: SluiceProcess, certs: DevCertificates) -> None:
    host, port = server.endpoints["mqtt-tls"]["host"], int(server.endpoints["mqtt-tls"]["port"])
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # no autotuning: the broker holds what is unread
    raw.settimeout(15)
    raw.connect((host, port))
    subscriber = client_context(certs).wrap_socket(raw, server_hostname="localhost")
    subscriber.sendall(CONNECT)
    connack = _read_packet(subscriber)
    assert connack[0] == 0x20 and connack[3] == 0, connack  # CONNACK, reason Success
    subscriber.sendall(SUBSCRIBE)
    assert _read_packet(subscriber)[-1:] == b"\x01"  # SUBACK: granted QoS 1
    publisher = socket.create_connection((server.endpoints["mqtt"]["host"], int(server.endpoints["mqtt"]["port"])),
                                         timeout=15)
    try:
        publisher.sendall(b"\x10\x12\x00\x04MQTT\x04\x02\x00\x3c\x00\x06gone-p")
        assert _read_exactly(publisher, 4) == b"\x20\x02\x00\x00"
        # deliveries the subscriber never reads: more than the socket buffers hold stays in the broker
        big = 16
        publisher.sendall(b"".join(_publish_qos1(b"gone/x", pid, b"d" * 1000_000) for pid in range(1, big + 1)))
        assert _read_exactly(publisher, 4 * big)[-4:] == b"\x40\x02" + big.to_bytes(2, "big")
        subscriber.shutdown(socket.SHUT_WR)  # the client's side ends (no close_notify), and it reads no more
        # rounds of small deliveries, each PUBACKed (its delivery handed on by then), until the broker has seen
        # the end of stream (its TLS layer drops writes from then on: before the fix, a warning from the fifth)
        pid = big
        for _ in range(20):
            publisher.sendall(b"".join(_publish_qos1(b"gone/y", pid + i, b"s") for i in range(1, 11)))
            pid += 10
            assert _read_exactly(publisher, 40)[-4:] == b"\x40\x02" + pid.to_bytes(2, "big")
            if "SSL connection is closed" in server.log.read_text():
                break
    finally:
        publisher.close()
        subscriber.close()
    log = server.log.read_text()
    assert "SSL connection is closed" not in log, log[-2000:]
