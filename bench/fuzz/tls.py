"""The Kafka, TCP and HTTP campaigns through TLS: with ``security.tls_cert``/``tls_key`` set every listener of
the broker speaks TLS (Kafka SSL on its port, the TCP line listeners, HTTPS), so the same hostile inputs
reach the decoders inside TLS records, and every end of a connection (EOF without close_notify, a reset in
the middle of a record, a request split over many records) passes the TLS layer. Dev certificates are made
for the run (one CA per campaign); the probes, the real clients (kcat with ``security.protocol=ssl``,
``openssl s_client``, httpx and curl verifying the CA) and the harness's partition count go through TLS
too."""

from __future__ import annotations

import functools
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path

from bench.fuzz.harness import recv_exactly
from bench.fuzz.http import HttpTarget
from bench.fuzz.kafka import KafkaTarget, _sentinel
from bench.fuzz.tcp import TcpTarget
from sluice.dev_certs import write_dev_certificates

__all__ = ["HttpsTarget", "KafkaTlsTarget", "TcpTlsTarget", "campaign_tls"]


class _Tls:
    """Certificates for one campaign (every connection of it trusts the same CA) and the client side of TLS."""

    def __init__(self) -> None:
        self._certs_dir = tempfile.TemporaryDirectory(prefix="sluice-fuzz-tls-")  # removed with the target
        self.certs = write_dev_certificates(Path(self._certs_dir.name))
        self.context = ssl.create_default_context(cafile=str(self.certs.ca))
        self.http_tls = self.context  # the harness reads the partition count over HTTPS

    def env(self) -> dict[str, str]:
        return {"SLUICE_SECURITY__TLS_CERT": str(self.certs.cert), "SLUICE_SECURITY__TLS_KEY": str(self.certs.key)}

    def wrap(self, address: tuple[str, int], timeout: float) -> socket.socket:
        raw = socket.create_connection(address, timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return self.context.wrap_socket(raw, server_hostname="localhost")
        except BaseException:
            raw.close()
            raise

    def kcat_options(self) -> list[str]:
        return ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={self.certs.ca}"]


@functools.cache
def campaign_tls() -> _Tls:
    """One set of certificates per process: the broker is started with the first target's environment."""
    return _Tls()


class KafkaTlsTarget(KafkaTarget):
    name = "kafka-tls"

    def __init__(self, deadline: float = 10.0, per_version: int = 12) -> None:
        super().__init__(deadline, per_version)
        self.tls = campaign_tls()
        self.http_tls = self.tls.http_tls

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), **self.tls.env()}

    def _connect(self) -> socket.socket:
        assert self.broker is not None
        return self.tls.wrap(self.broker.endpoints["kafka"], self.deadline)

    def kcat_options(self) -> list[str]:
        return self.tls.kcat_options()

    def probe(self) -> bool:
        try:
            with self._connect() as sock:
                sock.sendall(_sentinel(1))
                head = recv_exactly(sock, 4)
                return head is not None and recv_exactly(sock, int.from_bytes(head, "big")) is not None
        except OSError:
            return False


class TcpTlsTarget(TcpTarget):
    name = "tcp-tls"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.tls = campaign_tls()
        self.http_tls = self.tls.http_tls

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), **self.tls.env()}

    def _open(self, endpoint: str) -> socket.socket:
        assert self.broker is not None
        return self.tls.wrap(self.broker.endpoints[endpoint], self.deadline)

    def kcat_options(self) -> list[str]:
        return self.tls.kcat_options()

    def send_line(self, line: bytes) -> bytes:
        """openssl s_client sends ``line`` through TLS (verifying the dev CA) and prints the answers."""
        assert self.broker is not None
        host, port = self.broker.endpoints["tcp"]
        client = subprocess.Popen(
            ["openssl", "s_client", "-quiet", "-connect", f"{host}:{port}", "-CAfile", str(self.tls.certs.ca),
             "-verify_return_error", "-servername", "localhost"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        assert client.stdin is not None and client.stdout is not None
        try:  # -quiet ignores the end of its input: read its answer (or its end), then end it
            client.stdin.write(line)
            client.stdin.flush()
            answers = b""
            while b"ACK" not in answers and (answer := client.stdout.readline()):  # "OK <topic> ..." first
                answers += answer
            return answers
        finally:
            client.kill()
            client.communicate()

    def probe(self) -> bool:
        try:
            with self._open("tcp") as sock:
                sock.sendall(b'{"device": "probe", "ts": 1700000000000}\n')
                got = b""
                while b"ACK 1" not in got:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return False
                    got += chunk
                return True
        except OSError:
            return False


class HttpsTarget(HttpTarget):
    """The HTTP API campaign over HTTPS (raw requests inside TLS; httpx and curl verify the dev CA)."""

    name = "https"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.tls = campaign_tls()
        self.http_tls = self.tls.http_tls
        self.ca_file = str(self.tls.certs.ca)

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), **self.tls.env()}
