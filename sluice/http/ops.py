"""Operator routes: ``/health``, ``/ready``, ``/sources`` (ingest health) and ``/processors``.

``/health`` and ``/ready`` answer without credentials (probes); with ``security.auth = required`` the other
two need describe on the cluster (``auth.py``).

``/sources`` and ``/processors`` read registries other components publish into
(``runtime.registries["ingest_health"]`` and ``["processors"]``); absent registries give empty lists.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import APIRouter, Depends, Query

from broker.security import Operation, ResourceType
from sluice.http.auth import allow
from sluice.http.context import ApiContext, Ctx
from sluice.http.groups import plain
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["processor_statuses", "router", "source_rows"]

router = APIRouter(tags=["operations"], responses={500: PROBLEM_RESPONSES[500]})


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def source_rows(ctx: ApiContext) -> list[dict[str, Any]]:
    registry = ctx.runtime.registries.get("ingest_health")
    if registry is None:
        return []
    rows = await _maybe_await(registry.snapshot())
    return [plain(r) for r in rows]


async def processor_statuses(ctx: ApiContext) -> list[dict[str, Any]]:
    registry = ctx.runtime.registries.get("processors")
    if registry is None:
        return []
    if callable(getattr(registry, "status", None)):
        result = plain(await _maybe_await(registry.status()))
        return result if isinstance(result, list) else [result]
    items: Iterable[tuple[str | None, Any]] = (
        registry.items() if isinstance(registry, Mapping) else ((None, p) for p in registry)
    )
    out: list[dict[str, Any]] = []
    for name, proc in items:
        status = plain(await _maybe_await(proc.status()))
        if isinstance(status, dict) and name is not None:
            status.setdefault("name", name)
        out.append(status)
    return out


@router.get("/health", summary="Liveness: the process answers")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Readiness: serving, store open", responses={503: PROBLEM_RESPONSES[503]})
async def ready(ctx: Ctx) -> dict[str, Any]:
    if not ctx.accepting or ctx.stopping.is_set():
        raise ProblemError(503, "not-ready", "Not ready", "Sluice is starting or shutting down; retry shortly")
    try:
        topics = len(ctx.store.list_topics(include_internal=True))
    except Exception as exc:  # the store is the one thing readiness must prove
        raise ProblemError(503, "store-unavailable", "Store unavailable", f"the log store failed: {exc}") from None
    endpoints = {e.name: f"{e.host}:{e.port}" for e in ctx.runtime.endpoints.values()}
    return {"status": "ready", "topics": topics, "endpoints": endpoints}


@router.get(
    "/sources",
    response_model=list[dict[str, Any]],
    summary="Ingest health per source and device: messages, bytes, errors, last seen, idle",
    dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.CLUSTER))],
)
async def sources(
    ctx: Ctx, idle: bool | None = Query(None, description="Only idle (true) or only active (false) devices.")
) -> list[dict[str, Any]]:
    rows = await source_rows(ctx)
    if idle is not None:
        rows = [r for r in rows if bool(r.get("idle")) == idle]
    return rows


@router.get("/processors", response_model=list[dict[str, Any]], summary="Attached processors: status, watermarks, lag",
            dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.CLUSTER))])
async def processors(ctx: Ctx) -> list[dict[str, Any]]:
    return await processor_statuses(ctx)
