"""``/groups``: consumer groups, their members and assignments, offset lag and event-time lag.

The group coordinator lives in the Kafka front (``runtime.registries["groups"]``); this module only reads
it, through duck typing, so the API works (with an empty list) when no coordinator is running.
Lag is computed here from committed offsets and the log: offset lag = high watermark − committed offset;
event-time lag = event time of the newest record − event time of the last committed one.
"""

from __future__ import annotations

import dataclasses
import inspect
import struct
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from fastapi import APIRouter

from broker.errors import BrokerError
from broker.log.api import LogStore
from sluice.http.context import Ctx
from sluice.http.models import GroupDetail, GroupPartitionLag, GroupSummary
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError
from sluice.http.records import read_records

__all__ = [
    "collect_group",
    "decode_assignment",
    "list_group_summaries",
    "normalise_offsets",
    "plain",
    "router",
]

router = APIRouter(prefix="/groups", tags=["groups"], responses={500: PROBLEM_RESPONSES[500]})


def plain(obj: Any) -> Any:
    """Dataclasses, enums, mappings and sequences as JSON-friendly values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return plain(obj.value)
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj).hex()
    if isinstance(obj, list | tuple | set | frozenset):
        return [plain(v) for v in obj]
    return obj


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, Mapping) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """Kafka ConsumerProtocolAssignment: version, [topic, [partition]], user_data."""
    pos = 2
    out: dict[str, list[int]] = {}
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(max(count, 0)):
        (nlen,) = struct.unpack_from(">h", data, pos)
        pos += 2
        topic = data[pos : pos + nlen].decode()
        pos += nlen
        (pcount,) = struct.unpack_from(">i", data, pos)
        pos += 4
        parts = list(struct.unpack_from(f">{max(pcount, 0)}i", data, pos))
        pos += 4 * max(pcount, 0)
        out[topic] = parts
    return out


def _assignment(raw: Any) -> dict[str, list[int]]:
    if raw is None:
        return {}
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            return decode_assignment(bytes(raw))
        except (struct.error, UnicodeDecodeError):
            return {}
    if isinstance(raw, Mapping):
        return {str(t): sorted(int(p) for p in ps) for t, ps in raw.items()}
    if isinstance(raw, Iterable):
        out: dict[str, list[int]] = {}
        for item in raw:
            if isinstance(item, tuple) and len(item) == 2:
                out.setdefault(str(item[0]), []).append(int(item[1]))
            else:
                out.setdefault(str(_get(item, "topic")), []).append(int(_get(item, "partition")))
        return out
    return {}


def normalise_offsets(raw: Any) -> dict[tuple[str, int], int]:
    """Committed offsets in whichever shape the coordinator returns them, as {(topic, partition): offset}."""
    out: dict[tuple[str, int], int] = {}

    def value(v: Any) -> int | None:
        off = v if isinstance(v, int) else _get(v, "offset", "committed_offset")
        return None if off is None or off < 0 else int(off)

    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if isinstance(k, tuple):
                off = value(v)
                if off is not None:
                    out[(str(k[0]), int(k[1]))] = off
            elif isinstance(v, Mapping):
                for p, pv in v.items():
                    off = value(pv)
                    if off is not None:
                        out[(str(k), int(p))] = off
            else:
                topic, partition = _get(k, "topic"), _get(k, "partition")
                off = value(v)
                if topic is not None and off is not None:
                    out[(str(topic), int(partition))] = off
    elif isinstance(raw, Iterable):
        for item in raw:
            topic, partition, off = _get(item, "topic"), _get(item, "partition"), value(item)
            if topic is not None and off is not None:
                out[(str(topic), int(partition))] = off
    return out


async def _call(fn: Any, *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def list_group_summaries(coordinator: Any) -> list[GroupSummary]:
    if coordinator is None:
        return []
    out = []
    for g in await _call(coordinator.list_groups):
        if isinstance(g, str):
            out.append(GroupSummary(group_id=g))
            continue
        members = _get(g, "members")
        out.append(
            GroupSummary(
                group_id=str(_get(g, "group_id", "id", "name")),
                state=_state(_get(g, "state")),
                protocol_type=_get(g, "protocol_type"),
                members=len(members) if isinstance(members, list | tuple | dict) else members,
            )
        )
    return sorted(out, key=lambda s: s.group_id)


def _state(raw: Any) -> str | None:
    if raw is None:
        return None
    return str(raw.value if isinstance(raw, Enum) else raw)


def _timestamp_at(store: LogStore, topic: str, partition: int, offset: int) -> int | None:
    try:
        log = store.partition(topic, partition)
        if not log.log_start_offset <= offset < log.high_watermark:
            return None
        records = read_records(log, offset, 1)
    except BrokerError:
        return None
    return records[0].timestamp if records else None


def partition_lag(
    store: LogStore, topic: str, partition: int, committed: int | None, member: str | None
) -> GroupPartitionLag:
    try:
        log = store.partition(topic, partition)
        hw, start = log.high_watermark, log.log_start_offset
    except BrokerError:
        return GroupPartitionLag(
            topic=topic,
            partition=partition,
            committed_offset=committed,
            high_watermark=0,
            lag=None,
            event_time_lag_ms=None,
            member_id=member,
        )
    lag = hw - max(committed, start) if committed is not None else hw - start
    event_lag: int | None = None
    if lag == 0:
        event_lag = 0
    elif hw > start:
        newest = _timestamp_at(store, topic, partition, hw - 1)
        consumed = committed - 1 if committed is not None and committed > start else start
        last = _timestamp_at(store, topic, partition, consumed)
        if newest is not None and last is not None:
            event_lag = max(newest - last, 0)
    return GroupPartitionLag(
        topic=topic,
        partition=partition,
        committed_offset=committed,
        high_watermark=hw,
        lag=max(lag, 0),
        event_time_lag_ms=event_lag,
        member_id=member,
    )


async def collect_group(coordinator: Any, store: LogStore, group_id: str) -> GroupDetail:
    """A group's members, assignment and per-partition lag; ProblemError 404 if it is unknown."""
    known = {s.group_id for s in await list_group_summaries(coordinator)}
    if coordinator is None or group_id not in known:
        raise ProblemError(
            404,
            "unknown-group",
            "Unknown group",
            f"no consumer group {group_id!r}; GET /groups lists the groups this Sluice knows",
        )
    desc = await _call(coordinator.describe, group_id)
    committed = normalise_offsets(await _call(coordinator.fetch_offsets, group_id, None))
    members: list[dict[str, Any]] = []
    owner: dict[tuple[str, int], str] = {}
    for m in _get(desc, "members", default=[]) or []:
        member_id = str(_get(m, "member_id", "id"))
        assignment = _assignment(_get(m, "assignment"))
        for topic, parts in assignment.items():
            for p in parts:
                owner[(topic, p)] = member_id
        members.append(
            {
                "member_id": member_id,
                "client_id": _get(m, "client_id"),
                "client_host": _get(m, "client_host", "host"),
                "assignment": assignment,
            }
        )
    keys = sorted(set(committed) | set(owner))
    rows = [partition_lag(store, t, p, committed.get((t, p)), owner.get((t, p))) for t, p in keys]
    return GroupDetail(
        group_id=group_id,
        state=_state(_get(desc, "state")),
        protocol_type=_get(desc, "protocol_type"),
        protocol=_get(desc, "protocol", "protocol_name"),
        members=members,
        partitions=rows,
        total_lag=sum(r.lag or 0 for r in rows),
    )


@router.get("", response_model=list[GroupSummary], summary="List consumer groups")
async def list_groups(ctx: Ctx) -> list[GroupSummary]:
    return await list_group_summaries(ctx.runtime.registries.get("groups"))


@router.get(
    "/{group_id}",
    response_model=GroupDetail,
    summary="Describe a group: members, assignment, committed offsets, offset lag and event-time lag",
    responses={404: PROBLEM_RESPONSES[404]},
)
async def describe_group(group_id: str, ctx: Ctx) -> GroupDetail:
    return await collect_group(ctx.runtime.registries.get("groups"), ctx.store, group_id)
