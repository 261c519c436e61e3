"""The MQTT campaign through the TLS front door: the same inputs as ``mqtt.py``, each connection opened on
``mqtt.tls_port`` through a TLS handshake (dev certificates made for the run), so hostile MQTT reaches the
broker inside TLS records and every end of a connection (EOF without close_notify, resets mid-record)
passes the TLS layer. The probe and the real-client check use the plain door of the same broker."""

from __future__ import annotations

import socket
import ssl
import tempfile
from pathlib import Path

from bench.fuzz.mqtt import MqttTarget
from sluice.dev_certs import write_dev_certificates

__all__ = ["MqttTlsTarget"]


class MqttTlsTarget(MqttTarget):
    name = "mqtt-tls"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self._certs_dir = tempfile.TemporaryDirectory(prefix="sluice-fuzz-tls-")  # removed with the target
        self.certs = write_dev_certificates(Path(self._certs_dir.name))
        self.context = ssl.create_default_context(cafile=str(self.certs.ca))

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), "SLUICE_SECURITY__TLS_CERT": str(self.certs.cert),
                "SLUICE_SECURITY__TLS_KEY": str(self.certs.key), "SLUICE_MQTT__TLS_PORT": "0"}

    def _open(self) -> socket.socket:
        assert self.broker is not None
        raw = socket.create_connection(self.broker.endpoints["mqtt-tls"], timeout=self.deadline)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.context.wrap_socket(raw, server_hostname="localhost")
