"""The one place listeners and runners plug into ``sluice serve``.

One module per part, named after what it wires: ``kafka`` (listener + group coordinator), ``mqtt``
(listener + bridges), ``tcp_file`` (TCP line listeners + file sources), ``processors`` (attached
pipelines), and the parts they share: ``ingest_core`` (router, health, sink) and ``security``
(the authenticator). The HTTP API's component lives in ``sluice.http.server``.

Each factory takes the Runtime and returns a Component, or None when its section is disabled.
Order matters: components start top to bottom and stop bottom to top, so the front doors that
accept data stop before the parts that store it.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.components.kafka import kafka_component
from sluice.components.mqtt import mqtt_bridges, mqtt_listener
from sluice.components.processors import processors_component
from sluice.components.tcp_file import file_component, tcp_component
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
