"""``sluice serve`` with ``security.auth = "required"`` asks TCP line senders for a first AUTH line (checked
against the data directory's user store); refusals show in ``sluice_auth_failures_total{front_door="tcp"}``."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from broker.security import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType, UserStore
from tests.sluice_server import SluiceProcess


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def test_tcp_listener_of_sluice_serve_requires_auth(tmp_path: Path) -> None:
    data = tmp_path / "data"
    UserStore(data).add("meter", "s3cret")
    UserStore(data).add("stranger", "pw")
    # meter may write where TCP lines go (the sensor route, or the tcp catch-all); stranger has no ACL
    AclStore(data).add([AclBinding(ResourceType.TOPIC, t, PatternType.LITERAL, "User:meter", "*", Operation.WRITE,
                                   Permission.ALLOW) for t in ("sensors", "tcp")])
    server = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required", "SLUICE_TCP__ACK": "true",
                                       "SLUICE_SECURITY__OPEN_METRICS": "true"}).start()
    try:
        port = server.endpoints["tcp"]["port"]
        reading = b'{"sensor": "s1", "ts": 1700000000000, "temp": 20}\n'
        assert exchange(port, reading) == b"FATAL authentication failed\n"
        assert exchange(port, b"AUTH meter wrong\n") == b"FATAL authentication failed\n"
        good = exchange(port, b"AUTH meter s3cret\n" + reading).decode().splitlines()
        assert good[0] == "ACK 1" and good[-1] == "ACK 2", good
        assert any(line.startswith("OK sensors ") for line in good), good
        assert exchange(port, b"AUTH stranger pw\n" + reading) == b"FATAL not authorized\n"  # nothing stored
        with urllib.request.urlopen(f"{server.http}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        assert 'sluice_auth_failures_total{front_door="tcp"} 2.0' in metrics
        assert 'sluice_auth_logins_total{front_door="tcp"} 2.0' in metrics  # meter and stranger logged in
        assert 'sluice_authorization_denied_total{front_door="tcp"} 1.0' in metrics  # stranger may not write
        assert "tcp login failed" in server.log.read_text()
    finally:
        server.stop()
