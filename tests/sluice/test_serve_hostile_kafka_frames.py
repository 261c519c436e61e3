"""One hostile Kafka frame must cost its sender the connection, never the broker process.

A real ``sluice serve`` subprocess (so an abort inside a native decoder shows as the process dying):
the DescribeConfigs v4 frame found by ``python -m bench.fuzz kafka`` (a compact array length of 2^32 - 3)
is answered by a close, and the broker then serves ApiVersions on a new connection.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from tests.broker.protocol.kafka.test_bounds import describe_configs_v4_with_lying_array
from tests.sluice_server import SluiceProcess


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_lying_compact_array_length_closes_the_connection_and_the_broker_lives(tmp_path: Path) -> None:
    server = SluiceProcess(tmp_path / "data", env={"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false"})
    server.start()
    try:
        host, port = server.endpoints["kafka"]["host"], server.endpoints["kafka"]["port"]
        frame = describe_configs_v4_with_lying_array()
        with socket.create_connection((host, port)) as sock:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            assert _closed(sock)
        assert server.proc is not None and server.proc.poll() is None, server.log.read_text()[-2000:]
        with socket.create_connection((host, port), timeout=10) as sock:  # ApiVersions v0
            sock.sendall(struct.pack(">ihhih", 14, 18, 0, 9, 4) + b"test")
            size = struct.unpack(">i", sock.recv(4))[0]
            assert size > 4
        assert "Traceback" not in server.log.read_text()
    finally:
        server.stop()
