"""The one place listeners and runners plug into ``sluice serve``.

Each factory takes the Runtime and returns a Component, or None when its section is disabled.
Order matters: components start top to bottom and stop bottom to top, so the front doors that
accept data stop before the parts that store it.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.ingest_components import file_component, tcp_component
from sluice.kafka_component import kafka_component
from sluice.mqtt_wiring import mqtt_bridges, mqtt_listener
from sluice.processors_component import processors_component
from sluice.runtime import Component, Runtime

__all__ = ["COMPONENT_FACTORIES", "build_components"]

ComponentFactory = Callable[[Runtime], Component | None]


def _http_component(runtime: Runtime) -> Component | None:
    from sluice.http.server import http_component  # imported lazily: FastAPI is not needed to build the rest

    return http_component(runtime)


COMPONENT_FACTORIES: list[ComponentFactory] = [
    kafka_component,  # Kafka wire protocol listener(s) and the group coordinator
    mqtt_listener,  # MQTT 3.1.1/5.0 device front door -> ingest sink
    mqtt_bridges,  # [[mqtt.bridges]]: external MQTT brokers -> ingest sink, acked after the append
    tcp_component,  # TCP line ingest (NDJSON, InfluxDB line protocol, CSV)
    file_component,  # file replay/tail sources from [[ingest.files]]
    processors_component,  # attached stream processors (--processor module:pipeline)
    _http_component,  # HTTP API last: starts once everything it reports on is up, stops first
]


def build_components(runtime: Runtime) -> list[Component]:
    built = (factory(runtime) for factory in COMPONENT_FACTORIES)
    return [component for component in built if component is not None]
