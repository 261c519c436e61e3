"""Builds the MQTT listener (and, later, bridges) of a running Sluice on the shared ingest core.

The listener writes through ``ingest_core(runtime).sink`` as source ``SourceRef("mqtt", "default")``;
credentials from ``settings.mqtt.users`` become the authentication hook.
"""

from __future__ import annotations

import hmac

from ingest.mqtt.hub import Authenticator, Hub, HubConfig
from ingest.mqtt.listener import MqttListener, SinkPort
from ingest.routing import SourceRef
from sluice.ingest_wiring import ingest_core
from sluice.runtime import Component, Runtime

__all__ = ["MQTT_SOURCE", "mqtt_listener"]

MQTT_SOURCE = SourceRef("mqtt", "default")


def _password_check(users: dict[str, str]) -> Authenticator:
    def check(client_id: str, username: str | None, password: bytes | None) -> bool:
        expected = users.get(username or "")
        return expected is not None and password is not None and hmac.compare_digest(expected.encode(), password)

    return check


def mqtt_listener(runtime: Runtime) -> Component | None:
    settings = runtime.settings.mqtt
    if not settings.enabled:
        return None
    core = ingest_core(runtime)
    config = HubConfig(
        allow_anonymous=settings.allow_anonymous,
        max_packet_size=settings.max_packet_bytes,
        receive_maximum=settings.receive_maximum,
        topic_alias_maximum=settings.topic_alias_maximum,
        max_queued_messages=settings.max_queued_messages,
        connect_timeout_s=settings.connect_timeout_s,
        backlog_high_bytes=core.sink.max_pending_bytes,
        protocol_versions=tuple(settings.protocol_versions),
    )
    hub = Hub(SinkPort(core.sink, MQTT_SOURCE), config, _password_check(settings.users) if settings.users else None)
    runtime.registries["mqtt"] = hub
    return MqttListener(hub, runtime.settings.host, settings.port, announce=runtime.announce, backlog=settings.backlog)
