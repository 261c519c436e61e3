"""Builds the MQTT listener and the MQTT bridges of a running Sluice on the shared ingest core.

The listener writes through ``ingest_core(runtime).sink`` as source ``SourceRef("mqtt", "default")``.
With ``security.auth = "required"`` every CONNECT must carry a user name and password of the user store
(``broker.security``; anonymous clients are refused, ``mqtt.allow_anonymous`` and ``mqtt.users`` are not
used); with ``"off"``, credentials from ``settings.mqtt.users`` become the authentication hook.
With ``mqtt.durable`` (the default) persistent sessions and retained messages are journaled in the
compacted internal topics ``__mqtt_sessions`` and ``__mqtt_retained`` and restored here, before the
listener starts (``ingest/mqtt/session_store.py``).
Each ``[[mqtt.bridges]]`` entry writes as ``SourceRef("bridge", name)``; the bridge objects are in
``runtime.registries["bridges"]`` (name -> MqttBridge, whose ``status()`` the HTTP API shows). Both publish
a collector for ``/metrics``.
"""

from __future__ import annotations

import functools
import hmac
import logging
import ssl

from broker.security import Authenticator as SecurityAuthenticator
from ingest.admission import ConnectionLimits
from ingest.bridge import BridgeConfig, MqttBridge
from ingest.mqtt.from_log import LogToMqtt
from ingest.mqtt.hub import Authenticator, Hub, HubConfig
from ingest.mqtt.journal import Journal
from ingest.mqtt.listener import MqttDoor, MqttListener, SinkPort
from ingest.mqtt.retained_store import DurableRetainedStore
from ingest.mqtt.session_store import RETAINED_TOPIC, SESSIONS_TOPIC, SessionStore
from ingest.routing import SourceRef
from sluice.components.ingest_core import ingest_core
from sluice.components.mqtt_access import MqttAccess
from sluice.components.security import authenticator, authorizer
from sluice.components.tls import handshake_timeout, server_context
from sluice.config import MqttSettings
from sluice.front_metrics import BridgeCollector, MqttCollector, WebSocketCollector, publish_collector
from sluice.runtime import Component, Runtime

__all__ = ["MQTT_SOURCE", "BridgesComponent", "mqtt_bridges", "mqtt_doors", "mqtt_listener"]

MQTT_SOURCE = SourceRef("mqtt", "default")

log = logging.getLogger("sluice.mqtt")


def _password_check(users: dict[str, str]) -> Authenticator:
    def check(client_id: str, username: str | None, password: bytes | None) -> bool:
        expected = users.get(username or "")
        return expected is not None and password is not None and hmac.compare_digest(expected.encode(), password)

    return check


def _store_check(auth: SecurityAuthenticator) -> Authenticator:
    """The user store as the hub's hook; failures are counted and logged (rate-limited) as "mqtt"."""

    def check(client_id: str, username: str | None, password: bytes | None) -> bool:
        who = f"client id {client_id!r}"
        if username is None or password is None:
            auth.failed("mqtt", who, username, "no password")
            return False
        try:
            principal = auth.check_password(username, password.decode("utf-8"))
        except UnicodeDecodeError:
            principal = None
        if principal is None:
            auth.failed("mqtt", who, username, "bad user name or password")
            return False
        auth.succeeded("mqtt")
        return True

    return check


def _seconds(interval: int) -> float:
    """An MQTT expiry interval setting: 4294967295 (0xFFFFFFFF) means never, as on the wire."""
    return float("inf") if interval == 0xFFFFFFFF else float(interval)


def mqtt_listener(runtime: Runtime) -> Component | None:
    settings = runtime.settings.mqtt
    if not settings.enabled:
        return None
    core = ingest_core(runtime)
    auth = authenticator(runtime)
    check = _store_check(auth) if auth is not None else _password_check(settings.users) if settings.users else None
    if auth is not None and settings.users:
        log.warning("mqtt.users is ignored: security.auth = required checks MQTT logins against the user store")
    config = HubConfig(
        allow_anonymous=settings.allow_anonymous and auth is None,
        max_packet_size=settings.max_packet_bytes,
        receive_maximum=settings.receive_maximum,
        topic_alias_maximum=settings.topic_alias_maximum,
        max_queued_messages=settings.max_queued_messages,
        max_queued_bytes=settings.max_queued_bytes,
        max_queued_bytes_total=settings.max_queued_bytes_total,
        max_offline_sessions=settings.max_offline_sessions,
        session_expiry_s=_seconds(settings.session_expiry_s),
        max_session_expiry_s=_seconds(settings.max_session_expiry_s),
        connect_timeout_s=settings.connect_timeout_s,
        max_keepalive=settings.max_keepalive_s,
        backlog_high_bytes=core.sink.max_pending_bytes,
        protocol_versions=tuple(settings.protocol_versions),
        connection_limits=ConnectionLimits(settings.max_connections, settings.max_connections_per_address),
    )
    hub = Hub(SinkPort(core.sink, MQTT_SOURCE), config, check)
    authz = authorizer(runtime)
    if authz is not None:  # the ACLs of the log topics the routes lead to (mqtt_access.py)
        hub.access = MqttAccess(authz, core.router, MQTT_SOURCE)
    if settings.durable:  # restored here, before the listener accepts anyone
        retained = DurableRetainedStore(Journal(runtime.store, RETAINED_TOPIC))
        retained.restore()
        hub.retained = retained
        hub.store = store = SessionStore(Journal(runtime.store, SESSIONS_TOPIC), retained.journal)
        store.restore(hub)
    runtime.registries["mqtt"] = hub
    publish_collector(runtime, MqttCollector(hub))
    follower = LogToMqtt(hub, runtime.store, settings.deliver_from_topics,
                         committed=lambda: runtime.registries.get("transactions")) \
        if settings.deliver_from_topics else None
    doors = mqtt_doors(settings, server_context(runtime))  # never empty: Settings refuses plaintext=false without TLS
    listener = MqttListener(hub, runtime.settings.host, settings.port, announce=runtime.announce,
                            backlog=settings.backlog, follower=follower, doors=doors,
                            tls_handshake_timeout_s=handshake_timeout(runtime),
                            park_after_s=settings.park_after_s if settings.park_idle else None)
    if settings.websockets:
        publish_collector(runtime, WebSocketCollector(listener.websocket_stats))
    return listener


def mqtt_doors(settings: MqttSettings, tls: ssl.SSLContext | None) -> list[MqttDoor]:
    """Mosquitto's per-listener model: plain MQTT (and ws) unless ``mqtt.plaintext`` is false; with TLS
    configured also MQTT over TLS on ``tls_port`` (and wss); WebSockets only with ``mqtt.websockets``."""
    doors = []
    if settings.plaintext:
        doors.append(MqttDoor("mqtt", settings.port))
        if settings.websockets:
            doors.append(MqttDoor("mqtt-ws", settings.ws_port, websocket=True))
    if tls is not None:
        doors.append(MqttDoor("mqtt-tls", settings.tls_port, tls))
        if settings.websockets:
            doors.append(MqttDoor("mqtt-wss", settings.wss_port, tls, websocket=True))
    return doors


class BridgesComponent:
    """Every configured MQTT bridge, started and stopped together."""

    name = "mqtt-bridges"

    def __init__(self, bridges: list[MqttBridge]) -> None:
        self.bridges = bridges

    async def start(self) -> None:
        for bridge in self.bridges:
            await bridge.start()

    async def stop(self) -> None:
        for bridge in self.bridges:
            await bridge.stop()


def mqtt_bridges(runtime: Runtime) -> Component | None:
    configured = runtime.settings.mqtt.bridges
    if not configured:
        return None
    core = ingest_core(runtime)
    bridges: dict[str, MqttBridge] = runtime.registries.setdefault("bridges", {})
    built = []
    for b in configured:
        if b.name in bridges:
            raise ValueError(f"mqtt.bridges: duplicate bridge name {b.name!r}")
        config = BridgeConfig(
            name=b.name, host=b.host, port=b.port, topics=tuple(b.topics), client_id=b.client_id,
            username=b.username, password=b.password, protocol=b.protocol, keepalive_s=b.keepalive_s,
            max_inflight=b.max_inflight, backoff_initial_s=b.backoff_initial_s, backoff_max_s=b.backoff_max_s,
        )
        # The bridge acks once the write is durable; it needs no per-message outcomes.
        bridge = MqttBridge(config, functools.partial(core.sink.ingest, SourceRef("bridge", b.name)))
        bridges[b.name] = bridge
        built.append(bridge)
    publish_collector(runtime, BridgeCollector(lambda: runtime.registries.get("bridges")))
    return BridgesComponent(built)
