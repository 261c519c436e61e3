"""What each console page shows, gathered from the runtime with the HTTP API's own readers.

Nothing here computes what the API does not already expose, except the rates of counters between two
refreshes (``RateTracker``) and picking the newest dead letters; groups, sources and processors come from
the same functions ``/groups``, ``/sources`` and ``/processors`` answer with.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BrokerError
from broker.groups.coordinator import GroupCoordinator
from broker.log.api import LogStore
from broker.server.stats import KafkaStats
from sluice.console.rates import RateTracker
from sluice.console.render import ShownRecord, View, show_bytes, show_record
from sluice.front_metrics import bridge_statuses, mqtt_status
from sluice.http.context import ApiContext
from sluice.http.groups import collect_group, list_group_summaries
from sluice.http.models import GroupDetail, GroupSummary
from sluice.http.ops import processor_statuses, source_rows
from sluice.http.records import read_records

__all__ = [
    "DeadLetter",
    "ProcessorView",
    "browse",
    "dead_letters",
    "group_detail",
    "groups",
    "overview",
    "processors",
    "sources",
    "topic_detail",
    "topics",
]

MAX_DEVICE_ROWS = 500  # a page, not a dump: `GET /sources` has them all


def _coordinator(ctx: ApiContext) -> GroupCoordinator | None:
    found = ctx.runtime.registries.get("groups")
    return found if isinstance(found, GroupCoordinator) else None


def _kafka_stats(ctx: ApiContext) -> KafkaStats | None:
    for collector in ctx.runtime.registries.get("metrics", []) or []:
        stats = getattr(collector, "stats", None)
        if isinstance(stats, KafkaStats):
            return stats
    return None


def _sample_sum(metric: Any, suffix: str = "") -> float:
    """The sum of a prometheus-client metric's samples over all labels (``_total`` ones for a counter)."""
    return sum(s.value for family in metric.collect() for s in family.samples if s.name.endswith(suffix))


def topics(ctx: ApiContext, rates: RateTracker, *, internal: bool = False) -> list[dict[str, Any]]:
    now = time.monotonic()
    out = []
    for info in sorted(ctx.store.list_topics(include_internal=internal), key=lambda t: t.name):
        logs = ctx.store.partitions(info.name)
        records = sum(log.high_watermark - log.log_start_offset for log in logs)
        end = sum(log.high_watermark for log in logs)
        size = sum(log.size_bytes for log in logs)
        out.append(
            {
                "name": info.name,
                "internal": info.internal,
                "partitions": info.partitions,
                "records": records,
                "size_bytes": size,
                "rate": rates.observe(("topic", info.name), end, now),
            }
        )
    return out


def topic_detail(ctx: ApiContext, rates: RateTracker, topic: str) -> dict[str, Any]:
    info = ctx.store.topic(topic)  # UnknownTopic -> the API's 404 problem
    now = time.monotonic()
    partitions = [
        {
            "partition": log.partition,
            "log_start_offset": log.log_start_offset,
            "high_watermark": log.high_watermark,
            "size_bytes": log.size_bytes,
            "rate": rates.observe(("partition", topic, log.partition), log.high_watermark, now),
        }
        for log in ctx.store.partitions(topic)
    ]
    return {
        "name": info.name,
        "internal": info.internal,
        "created_ms": info.created_ms,
        "partitions": partitions,
        "config": sorted(info.config.to_kafka_configs().items()),
    }


def overview(ctx: ApiContext, rates: RateTracker) -> dict[str, Any]:
    now = time.monotonic()
    store: LogStore = ctx.store
    all_topics = store.list_topics(include_internal=True)
    records_in = bytes_in = stored = partitions = 0
    for info in all_topics:
        for log in store.partitions(info.name):
            partitions += 1
            stored += log.size_bytes
            if not info.internal:
                records_in += log.high_watermark
                bytes_in += log.size_bytes
    kafka = _kafka_stats(ctx)
    hub = ctx.runtime.registries.get("mqtt")
    mqtt = mqtt_status(hub) if hub is not None else None
    health = ctx.runtime.registries.get("ingest_health")
    tcp_connections = (
        sum(s.connections for s in health.sources() if s.source.kind == "tcp") if health is not None else None
    )
    try:
        disk = shutil.disk_usage(ctx.runtime.settings.data_dir)
        disk_free: int | None = disk.free
    except OSError:
        disk_free = None
    fetched = _sample_sum(ctx.counters.fetched_records, "_total")
    return {
        "in": {
            "records_per_s": rates.observe("records_in", records_in, now),
            "bytes_per_s": rates.observe("bytes_in", bytes_in, now),
        },
        "out": {
            "kafka_bytes_per_s": rates.observe("kafka_fetch", kafka.fetch_bytes, now) if kafka else None,
            "http_records_per_s": rates.observe("http_fetched", fetched, now),
            "mqtt_per_s": rates.observe("mqtt_delivered", mqtt["delivered"], now) if mqtt else None,
        },
        "storage": {
            "backend": ctx.runtime.settings.storage.backend,
            "bytes": stored,
            "topics": sum(1 for t in all_topics if not t.internal),
            "internal_topics": sum(1 for t in all_topics if t.internal),
            "partitions": partitions,
            "data_dir": str(ctx.runtime.settings.data_dir),
            "disk_free": disk_free,
        },
        "connections": {
            "kafka": sum(kafka.connections_open.values()) if kafka else None,
            "mqtt": mqtt["connections"] if mqtt else None,
            "tcp": tcp_connections,
            "sse": int(_sample_sum(ctx.counters.sse_clients)),
        },
        "groups": len(list_group_summaries(_coordinator(ctx))),
        "endpoints": sorted((e.name, f"{e.host}:{e.port}") for e in ctx.runtime.endpoints.values()),
    }


def groups(ctx: ApiContext) -> list[tuple[GroupSummary, int]]:
    """Each group with its total lag."""
    coordinator = _coordinator(ctx)
    return [
        (summary, collect_group(coordinator, ctx.store, summary.group_id).total_lag)
        for summary in sorted(list_group_summaries(coordinator), key=lambda s: s.group_id)
    ]


def group_detail(ctx: ApiContext, group_id: str) -> GroupDetail:
    return collect_group(_coordinator(ctx), ctx.store, group_id)  # unknown: the API's 404 problem


@dataclass(frozen=True, slots=True)
class DeadLetter:
    partition: int
    offset: int
    timestamp: int
    reason: str
    source: str
    device: str
    subject: str | None
    value: str


def dead_letters(ctx: ApiContext, limit: int = 20) -> tuple[str, list[DeadLetter]]:
    """The dead-letter topic's name and its newest ``limit`` records (all partitions), newest first."""
    topic = ctx.runtime.settings.ingest.dead_letter_topic
    found: list[DeadLetter] = []
    try:
        logs = ctx.store.partitions(topic)
    except BrokerError:
        return topic, []
    for log in logs:
        start = max(log.log_start_offset, log.high_watermark - limit)
        for r in read_records(log, start, limit):
            headers = {k: (v.decode("utf-8", "replace") if v is not None else "") for k, v in r.headers}
            shown = show_bytes(r.value)
            found.append(
                DeadLetter(
                    partition=log.partition,
                    offset=r.offset,
                    timestamp=r.timestamp,
                    reason=headers.get("reason", ""),
                    source=headers.get("source", ""),
                    device=headers.get("device", ""),
                    subject=headers.get("mqtt_topic"),
                    value=shown.text[:300],
                )
            )
    found.sort(key=lambda d: (d.timestamp, d.partition, d.offset), reverse=True)
    return topic, found[:limit]


async def sources(ctx: ApiContext) -> dict[str, Any]:
    rows = await source_rows(ctx)
    srcs = [r for r in rows if r.get("type") == "source"]
    devices = [r for r in rows if r.get("type") == "device"]
    devices.sort(key=lambda r: (-int(r.get("errors") or 0), str(r.get("source")), str(r.get("device"))))
    hub = ctx.runtime.registries.get("mqtt")
    endpoint = ctx.runtime.endpoints.get("mqtt")
    dl_topic, letters = dead_letters(ctx)
    return {
        "sources": srcs,
        "devices": devices[:MAX_DEVICE_ROWS],
        "devices_total": len(devices),
        "bridges": bridge_statuses(ctx.runtime.registries.get("bridges")),
        "mqtt": mqtt_status(hub, f"{endpoint.host}:{endpoint.port}" if endpoint else None) if hub else None,
        "dead_letter_topic": dl_topic,
        "dead_letters": letters,
    }


@dataclass
class ProcessorView:
    status: dict[str, Any]
    checkpoint_age_ms: int | None
    backpressure: bool
    idle_partitions: int
    partitions: list[dict[str, Any]] = field(default_factory=list)


async def processors(ctx: ApiContext) -> list[ProcessorView]:
    now_ms = int(time.time() * 1000)
    out = []
    for status in await processor_statuses(ctx):
        queues = status.get("queues") or {}
        checkpoints = status.get("checkpoints") or {}
        last = checkpoints.get("last_ms")
        limit = queues.get("max")
        full = bool(limit) and max(queues.get("in", 0), queues.get("out", 0)) >= limit
        parts = list(status.get("partitions") or [])
        out.append(
            ProcessorView(
                status=status,
                checkpoint_age_ms=None if not last else max(now_ms - int(last), 0),
                backpressure=full,
                idle_partitions=sum(1 for p in parts if p.get("idle")),
                partitions=parts,
            )
        )
    return out


def browse(
    ctx: ApiContext,
    topic: str,
    *,
    partition: int | None,
    offset: int | None,
    at_ms: int | None,
    limit: int,
    view: View,
) -> list[ShownRecord]:
    """Records of ``topic``: from ``offset`` (one partition), from event time ``at_ms``, or the newest ``limit``.

    Across partitions, records are merged by timestamp. Raises the store's errors (unknown topic/partition)
    for the API's problem handlers; an offset out of range is clamped to what is kept.
    """
    ctx.store.topic(topic)
    logs = [ctx.store.partition(topic, partition)] if partition is not None else ctx.store.partitions(topic)
    found: list[ShownRecord] = []
    for log in logs:
        if offset is not None:
            start = min(max(offset, log.log_start_offset), log.high_watermark)
        elif at_ms is not None:
            located = log.offset_for_timestamp(at_ms)
            start = log.high_watermark if located is None else located
        else:
            start = max(log.log_start_offset, log.high_watermark - limit)
        found.extend(show_record(log.partition, r, view) for r in read_records(log, start, limit))
    found.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    if offset is None and at_ms is None:
        return found[-limit:]  # the newest
    return found[:limit]
