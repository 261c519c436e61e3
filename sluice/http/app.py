"""``create_app(runtime)``: the FastAPI application of the HTTP API (routers per area, problem+json errors)."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

import sluice
from sluice.components.security import authenticator, authorizer
from sluice.console import install_console
from sluice.http import acls, fronts, groups, metrics, ops, records, stream, topics, users
from sluice.http.auth import caller, console_access, metrics_access
from sluice.http.context import ApiContext, ApiCounters
from sluice.http.limits import BodyLimitMiddleware
from sluice.http.metrics import RequestMetricsMiddleware, RuntimeCollector
from sluice.http.problems import PROBLEM_RESPONSES, install_problem_handlers
from sluice.runtime import Runtime

__all__ = ["create_app"]

DESCRIPTION = """\
Admin, produce, consume, Server-Sent Events and metrics for a running Sluice.

Data also flows over the Kafka protocol (any Kafka client, or `clients/`); this API is for scripts,
dashboards and operators. Errors are `application/problem+json` documents (type, title, status, detail).
"""


def create_app(runtime: Runtime, *, max_wait_ms: int = 30_000, sse_heartbeat_s: float = 15.0) -> FastAPI:
    """The API over ``runtime``; ``max_wait_ms`` caps long-polls, ``sse_heartbeat_s`` paces SSE keepalives."""
    # /docs and /redoc with Swagger UI and ReDoc served from fastapi-offline's files, not a CDN;
    # no validator badge (Swagger UI would fetch it from validator.swagger.io)
    app = FastAPIOffline(
        title="Sluice",
        version=sluice.__version__,
        description=DESCRIPTION,
        static_url="/docs-static",
        swagger_ui_parameters={"validatorUrl": None},
    )
    registry = CollectorRegistry(auto_describe=True)
    ctx = ApiContext(runtime, registry, ApiCounters(registry), max_wait_ms=max_wait_ms, sse_heartbeat_s=sse_heartbeat_s)
    ctx.collector = RuntimeCollector(ctx)
    ctx.authenticator, ctx.authorizer = authenticator(runtime), authorizer(runtime)  # None with security.auth off
    registry.register(ctx.collector)
    app.state.ctx = ctx
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.http.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware, ctx=ctx)  # outermost: counts the 413s too
    for module in (topics, records, stream, groups, ops, fronts, metrics, users, acls):
        # Any request may carry a number out of range (400) or an oversized body (413); with security.auth =
        # required, every route but /health, /ready and (per security.open_metrics) /metrics wants credentials.
        common = (400, 413, 422) if module is ops else (400, 401, 403, 413, 422)
        auth = [Depends(metrics_access)] if module is metrics else [] if module is ops else [Depends(caller)]
        app.include_router(module.router, responses={k: PROBLEM_RESPONSES[k] for k in common}, dependencies=auth)
    if runtime.settings.http.console:
        install_console(app, dependencies=[Depends(console_access)])
    return app
