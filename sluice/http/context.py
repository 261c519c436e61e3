"""What every route handler reaches through ``Depends(api_context)``: the runtime and the API's own counters."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Gauge

from broker.log.api import LogStore
from broker.security import Authenticator, Authorizer
from sluice.runtime import Runtime

__all__ = ["ApiContext", "ApiCounters", "Ctx", "api_context"]


class ApiCounters:
    """Counters for the work the HTTP API itself does, in the app's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sluice_http_requests", "HTTP requests served", ["method", "route", "status"], registry=registry
        )
        self.produced_records = Counter(
            "sluice_http_produced_records", "Records appended through the HTTP API", ["topic"], registry=registry
        )
        self.produced_bytes = Counter(
            "sluice_http_produced_bytes",
            "Value and key bytes appended through the HTTP API",
            ["topic"],
            registry=registry,
        )
        self.fetched_records = Counter(
            "sluice_http_fetched_records",
            "Records returned by HTTP fetches and SSE",
            ["topic", "via"],
            registry=registry,
        )
        self.fetch_requests = Counter(
            "sluice_http_fetch_requests",
            "HTTP record fetches (GET /topics/{topic}/records)",
            ["topic"],
            registry=registry,
        )
        self.sse_clients = Gauge("sluice_http_sse_clients", "Open Server-Sent Events streams", registry=registry)
        self.errors = Counter(
            "sluice_http_errors", "HTTP responses with a 4xx/5xx status", ["status"], registry=registry
        )


@dataclass
class ApiContext:
    runtime: Runtime
    registry: CollectorRegistry
    counters: ApiCounters
    max_wait_ms: int = 30_000  # cap on long-poll waits
    sse_heartbeat_s: float = 15.0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    accepting: bool = False  # set by the component once the socket serves; cleared when stopping
    collector: Any = None  # the RuntimeCollector read by /metrics
    authenticator: Authenticator | None = None  # set with security.auth = required (see auth.py)
    authorizer: Authorizer | None = None

    @property
    def store(self) -> LogStore:
        return self.runtime.store


def api_context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ApiContext, Depends(api_context)]
