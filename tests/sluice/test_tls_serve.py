"""``sluice serve`` with ``security.tls_cert``/``tls_key``: HTTPS (curl), the TCP line listener over TLS,
clear start-up errors for bad files, SIGHUP reloading the certificate without dropping connections, and
hostile bytes on every TLS port leaving no traceback."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from sluice.dev_certs import DevCertificates
from tests.sluice_server import SluiceProcess
from tests.tls_certs import client_context, make_certs, tls_env

pytestmark = pytest.mark.slow  # several sluice serve processes (start-up errors, SIGHUP reload)

curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_certs(tmp_path_factory.mktemp("serve-tls") / "tls", clients=("gateway-1",))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    live = tmp_path_factory.mktemp("live")
    shutil.copy(certs.cert, live / "server.pem")  # the reload test replaces these
    shutil.copy(certs.key, live / "server-key.pem")
    env = {"SLUICE_SECURITY__TLS_CERT": str(live / "server.pem"),
           "SLUICE_SECURITY__TLS_KEY": str(live / "server-key.pem"),
           "SLUICE_TCP__ACK": "true", "SLUICE_MQTT__TLS_PORT": "0", "SLUICE_MQTT__WEBSOCKETS": "true",
           "SLUICE_MQTT__WS_PORT": "0", "SLUICE_MQTT__WSS_PORT": "0"}
    proc = SluiceProcess(tmp_path_factory.mktemp("serve") / "data", env=env)
    proc.start()
    yield proc
    proc.stop()


def port(server: SluiceProcess, name: str) -> int:
    return int(server.endpoints[name]["port"])


@curl
def test_curl_over_https(server: SluiceProcess, certs: DevCertificates) -> None:
    answer = subprocess.run(["curl", "-sS", "--cacert", str(certs.ca), "-w", "\n%{http_code}",
                             f"https://localhost:{port(server, 'http')}/topics"], capture_output=True, text=True,
                            timeout=30)
    assert answer.returncode == 0, answer.stderr
    body, status = answer.stdout.rsplit("\n", 1)
    assert status == "200" and isinstance(json.loads(body), list)
    plain = subprocess.run(["curl", "-sS", f"http://localhost:{port(server, 'http')}/topics"], capture_output=True,
                           timeout=30)
    assert plain.returncode != 0  # no plaintext HTTP on the HTTPS port


def test_tcp_lines_over_tls_are_acknowledged(server: SluiceProcess, certs: DevCertificates) -> None:
    with socket.create_connection(("127.0.0.1", port(server, "tcp")), timeout=15) as raw, \
            client_context(certs).wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b'{"sensor": "t-1", "ts": 1700000000000, "v": 1}\n{"sensor": "t-1", "v": 2}\n')
        answer = b""
        while b"ACK 2\n" not in answer:
            chunk = tls.recv(4096)
            assert chunk, f"closed before the ack: {answer!r}"
            answer += chunk
    assert b"OK sensors 0 " in answer


def test_hostile_bytes_on_tls_ports_leave_no_traceback(server: SluiceProcess, certs: DevCertificates) -> None:
    for name in ("http", "tcp", "mqtt-tls", "mqtt-wss", "mqtt-ws", "kafka"):
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00" + bytes(512), bytes(range(256))):
            with socket.create_connection(("127.0.0.1", port(server, name)), timeout=15) as sock:
                sock.sendall(junk)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(4096):
                    pass
        # a client that gives up in the middle of its handshake
        context = client_context(certs)
        with socket.create_connection(("127.0.0.1", port(server, name)), timeout=15) as sock:
            outgoing = ssl.MemoryBIO()
            tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
            with pytest.raises(ssl.SSLWantReadError):
                tls.do_handshake()
            sock.sendall(outgoing.read()[:40])  # half a ClientHello, then gone
    test_tcp_lines_over_tls_are_acknowledged(server, certs)  # still serving
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def _serial(port: int, context: ssl.SSLContext) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def test_sighup_reloads_the_certificate_and_keeps_connections(server: SluiceProcess, certs: DevCertificates,
                                                              tmp_path: Path) -> None:
    fresh = make_certs(tmp_path / "fresh")
    trust_both = client_context(certs)
    trust_both.load_verify_locations(cafile=str(fresh.ca))
    tcp_port = port(server, "tcp")
    before = _serial(tcp_port, trust_both)
    with socket.create_connection(("127.0.0.1", tcp_port), timeout=15) as raw, \
            client_context(certs).wrap_socket(raw, server_hostname="localhost") as kept:
        kept.sendall(b'{"sensor": "r-1", "v": 1}\n')
        assert b"ACK 1\n" in kept.recv(4096)
        live = Path(server.env["SLUICE_SECURITY__TLS_CERT"]).parent
        shutil.copy(fresh.cert, live / "server.pem")
        shutil.copy(fresh.key, live / "server-key.pem")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        expected = x509.load_pem_x509_certificate(fresh.cert.read_bytes()).serial_number
        deadline = time.monotonic() + 20
        while (after := _serial(tcp_port, trust_both)) != expected:  # the signal is handled asynchronously
            assert after == before and time.monotonic() < deadline, "the new certificate was not served"
        kept.sendall(b'{"sensor": "r-1", "v": 2}\n')  # the connection from before the reload goes on
        assert b"ACK 2\n" in kept.recv(4096)
    assert "TLS certificate reloaded" in server.log.read_text()


def _serve_fails(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(tmp_path / "data")],
        env={"PATH": "/usr/bin:/bin", "SLUICE_STORAGE__BACKEND": "memory", "SLUICE_KAFKA__PORT": "0",
             "SLUICE_MQTT__PORT": "0", "SLUICE_MQTT__TLS_PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0",
             "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **env},
        capture_output=True, text=True, timeout=60)


def test_start_up_errors_name_the_file(tmp_path: Path, certs: DevCertificates) -> None:
    other = make_certs(tmp_path / "other")
    missing = _serve_fails(tmp_path, {**tls_env(certs), "SLUICE_SECURITY__TLS_CERT": str(tmp_path / "nope.pem")})
    assert missing.returncode == 1
    assert f"error: security.tls_cert: {tmp_path / 'nope.pem'} does not exist" in missing.stderr
    mismatched = _serve_fails(tmp_path, {**tls_env(certs), "SLUICE_SECURITY__TLS_KEY": str(other.key)})
    assert mismatched.returncode == 1 and "is not the key of security.tls_cert" in mismatched.stderr
    half = _serve_fails(tmp_path, {"SLUICE_SECURITY__TLS_CERT": str(certs.cert)})
    assert half.returncode == 2 and "security.tls_cert and security.tls_key are set together" in half.stderr
    no_mqtt_left = _serve_fails(tmp_path, {"SLUICE_MQTT__PLAINTEXT": "false"})
    assert no_mqtt_left.returncode == 2 and "mqtt.plaintext = false leaves no MQTT listener" in no_mqtt_left.stderr
    for result in (missing, mismatched, half, no_mqtt_left):
        assert "Traceback" not in result.stderr, result.stderr


def test_tcp_client_certificate_replaces_the_auth_line(tmp_path: Path, certs: DevCertificates) -> None:
    """With auth = required, a verified client certificate logs a TCP device in: its first line is data."""
    proc = SluiceProcess(tmp_path / "data", env={**tls_env(certs, client_ca=True), "SLUICE_SECURITY__AUTH": "required",
                                                 "SLUICE_TCP__ACK": "true", "SLUICE_MQTT__TLS_PORT": "0",
                                                 "SLUICE_SECURITY__OPEN_METRICS": "true",
                                                 "SLUICE_SECURITY__SUPER_USERS": '["gateway-1"]'})  # its CN
    proc.start()
    try:
        with socket.create_connection(("127.0.0.1", port(proc, "tcp")), timeout=15) as raw, \
                client_context(certs, "gateway-1").wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b'{"sensor": "g-1", "ts": 1700000000000, "v": 1}\n')
            answer = b""
            while b"ACK 1\n" not in answer:
                chunk = tls.recv(4096)
                assert chunk, f"closed before the ack: {answer!r}"
                answer += chunk
            assert b"OK sensors 0 " in answer
        with socket.create_connection(("127.0.0.1", port(proc, "tcp")), timeout=15) as raw, \
                client_context(certs).wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b'{"sensor": "g-2", "v": 1}\n')  # no certificate, no AUTH line: refused
            refused = b""
            while chunk := tls.recv(4096):
                refused += chunk
            assert refused == b"FATAL authentication failed\n"
    finally:
        proc.stop()
