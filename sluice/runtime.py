"""What every component of a running Sluice shares: settings, the log store, endpoints.

Components are the pluggable parts of ``sluice serve`` (the Kafka listener, MQTT, TCP, HTTP,
attached processors). Each is built by a factory in ``sluice/components/__init__.py`` from the Runtime and
started in order; they stop in reverse order.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.log.api import LogStore
from sluice.config import Settings

__all__ = ["Component", "Endpoint", "Runtime"]

log = logging.getLogger("sluice.runtime")


class Component(Protocol):
    name: str

    async def start(self) -> None:
        """Bind sockets / start tasks; return once serving."""

    async def stop(self) -> None:
        """Stop accepting, finish in-flight work, release resources."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # "kafka", "mqtt", "tcp", "http"
    host: str
    port: int


@dataclass
class Runtime:
    settings: Settings
    store: LogStore
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    # Shared registries components publish into (ingest health, processor status, metrics…),
    # keyed by a name the reader knows; lower layers get them passed in, never import sluice.
    registries: dict[str, Any] = field(default_factory=dict)

    def announce(self, name: str, host: str, port: int) -> None:
        """Record a bound listener; tests and scripts read ``<data_dir>/endpoints.json``."""
        self.endpoints[name] = Endpoint(name, host, port)
        log.info("listening", extra={"listener": name, "host": host, "port": port})
        self.write_endpoints()

    def write_endpoints(self) -> None:
        path = self.settings.data_dir / "endpoints.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({e.name: {"host": e.host, "port": e.port} for e in self.endpoints.values()}))
        tmp.replace(path)
