"""``/metrics``: Prometheus text format, one CollectorRegistry per app.

Two kinds of series: counters the HTTP API increments itself (``sluice_http_*``, in ``ApiCounters``), and
series read from the runtime at scrape time (``RuntimeCollector``): partitions' offsets and sizes, group
lag, ingest health per device, processor watermarks, and any collector another component published in
``runtime.registries["metrics"]`` (a list of prometheus-client collectors).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.groups.coordinator import GroupCoordinator
from broker.log.fdcache import FdCache
from broker.log.indexcache import IndexCache
from sluice.http.context import ApiContext, Ctx
from sluice.http.groups import collect_group, list_group_summaries
from sluice.http.ops import processor_statuses, source_rows

__all__ = ["RequestMetricsMiddleware", "RuntimeCollector", "router"]

router = APIRouter(tags=["operations"])

_INGEST_COUNTERS = {"messages", "bytes", "errors", "records", "dropped", "rejected"}


class RuntimeCollector(Collector):
    """Reads the runtime at scrape time; async parts are gathered by ``refresh`` just before."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.groups: list[tuple[str, str, int, int | None, int | None]] = []
        self.sources: list[dict[str, Any]] = []
        self.processors: list[dict[str, Any]] = []

    async def refresh(self) -> None:
        coordinator = self.ctx.runtime.registries.get("groups")
        if not isinstance(coordinator, GroupCoordinator):
            coordinator = None
        rows: list[tuple[str, str, int, int | None, int | None]] = []
        for summary in list_group_summaries(coordinator):
            detail = collect_group(coordinator, self.ctx.store, summary.group_id)
            rows.extend((summary.group_id, p.topic, p.partition, p.lag, p.event_time_lag_ms) for p in detail.partitions)
        self.groups = rows
        self.sources = await source_rows(self.ctx)
        self.processors = await processor_statuses(self.ctx)

    def collect(self) -> Iterator[Metric]:
        store = self.ctx.store
        topics = store.list_topics(include_internal=True)
        yield GaugeMetricFamily("sluice_topics", "Topics in the log store", value=len(topics))
        hw = GaugeMetricFamily(
            "sluice_partition_high_watermark",
            "Offset below which readers see records (with flush=always: the fsynced ones)",
            labels=["topic", "partition"],
        )
        start = GaugeMetricFamily(
            "sluice_partition_log_start_offset", "First offset still kept", labels=["topic", "partition"]
        )
        size = GaugeMetricFamily("sluice_partition_size_bytes", "Bytes stored", labels=["topic", "partition"])
        end = GaugeMetricFamily(
            "sluice_partition_log_end_offset",
            "Next offset to be assigned; above the high watermark while records wait for their fsync",
            labels=["topic", "partition"],
        )
        for info in topics:
            for log in store.partitions(info.name):
                labels = [info.name, str(log.partition)]
                hw.add_metric(labels, log.high_watermark)
                start.add_metric(labels, log.log_start_offset)
                size.add_metric(labels, log.size_bytes)
                end.add_metric(labels, log.log_end_offset)
        yield from (hw, start, size, end)
        fds = getattr(store, "fds", None)
        if isinstance(fds, FdCache):
            yield GaugeMetricFamily("sluice_log_open_segment_files", "Descriptors segment files hold",
                                    value=fds.open_count)
            yield CounterMetricFamily("sluice_log_segment_file_evictions", "Segments closed to stay under "
                                      "storage.max_open_files", value=fds.evictions)
            yield CounterMetricFamily("sluice_log_fd_exhausted", "Segment file opens that met EMFILE/ENFILE "
                                      "(retried after closing idle files)", value=fds.exhausted)
        indexes = getattr(store, "indexes", None)
        if isinstance(indexes, IndexCache):
            yield GaugeMetricFamily("sluice_log_index_cache_bytes", "Memory closed segments' indexes hold",
                                    value=indexes.held_bytes)
            yield CounterMetricFamily("sluice_log_index_cache_evictions", "Closed segments' indexes dropped "
                                      "to stay under storage.index_cache_bytes", value=indexes.evictions)

        lag = GaugeMetricFamily(
            "sluice_group_lag", "Records a group has not committed yet", labels=["group", "topic", "partition"]
        )
        tlag = GaugeMetricFamily(
            "sluice_group_event_time_lag_seconds",
            "Event time of the newest record minus that of the last committed one",
            labels=["group", "topic", "partition"],
        )
        for group, topic, partition, offset_lag, time_lag in self.groups:
            labels = [group, topic, str(partition)]
            if offset_lag is not None:
                lag.add_metric(labels, offset_lag)
            if time_lag is not None:
                tlag.add_metric(labels, time_lag / 1000)
        yield from (lag, tlag)

        yield from self._ingest()
        yield from self._processors()
        for extra in self.ctx.runtime.registries.get("metrics", []) or []:
            yield from extra.collect()

    def _ingest(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        labels = ["source", "device"]
        now = time.time()
        for row in self.sources:
            values = [str(row.get("source", "")), str(row.get("device", ""))]
            for field, value in row.items():
                if field in ("source", "device") or isinstance(value, bool) and field != "idle":
                    continue
                if field == "idle":
                    name, value = "sluice_ingest_device_idle", float(bool(value))
                elif not isinstance(value, int | float):
                    continue
                elif field in _INGEST_COUNTERS:
                    name = f"sluice_ingest_{field}"
                elif field == "last_seen_ms":
                    name, value = "sluice_ingest_seconds_since_last_seen", max(now - float(value) / 1000, 0.0)
                else:
                    name = f"sluice_ingest_{field}"
                if name not in families:
                    kind = CounterMetricFamily if field in _INGEST_COUNTERS else GaugeMetricFamily
                    families[name] = kind(name, f"Ingest health: {field} per source and device", labels=labels)
                families[name].add_metric(values, float(value))
        yield from families.values()

    def _processors(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for status in self.processors:
            name = str(status.get("name", ""))
            for field, value in status.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                metric = f"sluice_processor_{field}"
                if metric not in families:
                    families[metric] = GaugeMetricFamily(metric, f"Processor status: {field}", labels=["processor"])
                families[metric].add_metric([name], float(value))
        yield from families.values()


class RequestMetricsMiddleware:
    """Counts requests by method, route template and status (raw ASGI, so streams are not buffered)."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.ctx.counters.requests.labels(scope.get("method", ""), path, str(status)).inc()
            if status >= 400:
                self.ctx.counters.errors.labels(str(status)).inc()


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Metrics"}},
)
async def metrics(ctx: Ctx) -> Response:
    collector: RuntimeCollector = ctx.collector
    await collector.refresh()
    registry: CollectorRegistry = ctx.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
