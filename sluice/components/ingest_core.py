"""One ingest core per running Sluice: the Router, the HealthRegistry and the IngestSink.

Every device front door (MQTT listener, MQTT bridge, TCP listeners, file sources) calls
``ingest_core(runtime)``; the first call builds the core from ``settings.ingest`` and stores it in
``runtime.registries`` (``"router"``, ``"ingest_health"``, ``"ingest_sink"``), later calls get the
same objects. The HTTP API adds routes at runtime through ``router.add_rule``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingest.errors import ConfigError
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults, RouteRule
from ingest.sink import IngestSink
from sluice.config import IngestSettings
from sluice.runtime import Runtime

__all__ = ["IngestCore", "build_router", "ingest_core"]


@dataclass(frozen=True, slots=True)
class IngestCore:
    router: Router
    health: HealthRegistry
    sink: IngestSink


def build_router(settings: IngestSettings) -> Router:
    """The router from config; a bad rule raises ConfigError naming it."""
    defaults = RouteDefaults(
        settings.default_mqtt_topic, settings.default_tcp_topic, settings.default_file_topic, settings.sensors_topic
    )
    rules = []
    for i, raw in enumerate(settings.routes):
        try:
            rules.append(RouteRule.from_mapping(raw))
        except (ConfigError, TypeError, ValueError) as exc:
            raise ConfigError(f"ingest.routes[{i}]: {exc}") from exc
    return Router(rules, defaults)


def ingest_core(runtime: Runtime) -> IngestCore:
    """Get or create the runtime's ingest core."""
    registries = runtime.registries
    sink = registries.get("ingest_sink")
    if isinstance(sink, IngestSink):
        return IngestCore(sink.router, sink.health, sink)
    settings = runtime.settings.ingest
    router = build_router(settings)
    health = HealthRegistry(
        idle_timeout_s=settings.idle_timeout_s, max_devices_per_source=settings.max_devices_per_source
    )
    sink = IngestSink(
        runtime.store,
        router,
        health,
        dead_letter_topic=settings.dead_letter_topic,
        max_pending_bytes=settings.max_pending_bytes,
        coalesce_s=settings.coalesce_ms / 1000,
    )
    registries["router"] = router
    registries["ingest_health"] = health
    registries["ingest_sink"] = sink
    return IngestCore(router, health, sink)
