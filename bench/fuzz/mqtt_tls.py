"""The MQTT campaign through the TLS front door: the same inputs as ``mqtt.py``, each connection opened on
``mqtt.tls_port`` through a TLS handshake (dev certificates made for the run, one CA for all the
campaign's connections), so hostile MQTT reaches the broker inside TLS records and every end of a
connection (EOF without close_notify, resets mid-record) passes the TLS layer. The probe and the
real-client check use the plain door of the same broker."""

from __future__ import annotations

import socket

from bench.fuzz.mqtt import MqttTarget
from bench.fuzz.tls import campaign_tls

__all__ = ["MqttTlsTarget"]


class MqttTlsTarget(MqttTarget):
    name = "mqtt-tls"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.tls = campaign_tls()
        self.http_tls = self.tls.http_tls

    def broker_env(self) -> dict[str, str]:
        return {**super().broker_env(), **self.tls.env(), "SLUICE_MQTT__TLS_PORT": "0"}

    def _open(self) -> socket.socket:
        assert self.broker is not None
        return self.tls.wrap(self.broker.endpoints["mqtt-tls"], self.deadline)
