"""``/groups``: consumer groups, their members and assignments, offset lag and event-time lag.

The group coordinator lives in the Kafka front (``runtime.registries["groups"]``); this module only reads
it, and answers with an empty list when no coordinator is running (Kafka listener disabled).
Lag is computed here from committed offsets and the log: offset lag = high watermark − committed offset;
event-time lag = event time of the newest record − event time of the last committed one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Any

from fastapi import APIRouter, Depends, Request

from broker.errors import BrokerError
from broker.groups import GroupsError, decode_assignment
from broker.groups.coordinator import GroupCoordinator
from broker.groups.group import MemberDescription
from broker.log.api import LogStore
from broker.security import Operation, ResourceType
from sluice.http.auth import Caller, allow, may
from sluice.http.context import Ctx
from sluice.http.models import GroupDetail, GroupPartitionLag, GroupSummary
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError
from sluice.http.records import read_records

__all__ = ["collect_group", "list_group_summaries", "partition_lag", "plain", "router"]

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


def _assignment(member: MemberDescription, protocol_type: str) -> dict[str, list[int]]:
    if protocol_type != "consumer" or not member.assignment:
        return {}
    try:
        decoded = decode_assignment(member.assignment)
    except GroupsError:
        return {}
    out: dict[str, list[int]] = {}
    for topic, partition in decoded.topic_partitions():
        out.setdefault(topic, []).append(partition)
    return {t: sorted(ps) for t, ps in out.items()}


def _coordinator(registries: dict[str, Any]) -> GroupCoordinator | None:
    coordinator = registries.get("groups")
    return coordinator if isinstance(coordinator, GroupCoordinator) else None


def list_group_summaries(coordinator: GroupCoordinator | None) -> list[GroupSummary]:
    if coordinator is None:
        return []
    out = []
    for group_id, protocol_type, state in coordinator.list_groups():
        members = len(coordinator.describe(group_id).members) if coordinator.group(group_id) is not None else 0
        out.append(GroupSummary(group_id=group_id, state=state, protocol_type=protocol_type or None, members=members))
    return out


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


def collect_group(coordinator: GroupCoordinator | None, store: LogStore, group_id: str) -> GroupDetail:
    """A group's members, assignment and per-partition lag; ProblemError 404 if it is unknown."""
    known = {s.group_id for s in list_group_summaries(coordinator)}
    if coordinator is None or group_id not in known:
        raise ProblemError(
            404,
            "unknown-group",
            "Unknown group",
            f"no consumer group {group_id!r}; GET /groups lists the groups this Sluice knows",
        )
    desc = coordinator.describe(group_id)
    committed = {tp: off for tp, (off, _meta) in coordinator.fetch_offsets(group_id, None).items() if off >= 0}
    members: list[dict[str, Any]] = []
    owner: dict[tuple[str, int], str] = {}
    for m in desc.members:
        assignment = _assignment(m, desc.protocol_type)
        for topic, parts in assignment.items():
            for p in parts:
                owner[(topic, p)] = m.member_id
        members.append(
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "assignment": assignment,
            }
        )
    keys = sorted(set(committed) | set(owner))
    rows = [partition_lag(store, t, p, committed.get((t, p)), owner.get((t, p))) for t, p in keys]
    return GroupDetail(
        group_id=group_id,
        state=desc.state,
        protocol_type=desc.protocol_type or None,
        protocol=desc.protocol_name or None,
        members=members,
        partitions=rows,
        total_lag=sum(r.lag or 0 for r in rows),
    )


@router.get("", response_model=list[GroupSummary], summary="List consumer groups")
async def list_groups(ctx: Ctx, request: Request, who: Caller) -> list[GroupSummary]:
    """Only the groups the caller may describe (as Kafka's ListGroups)."""
    return [g for g in list_group_summaries(_coordinator(ctx.runtime.registries))
            if may(ctx, request, who, Operation.DESCRIBE, ResourceType.GROUP, g.group_id)]


@router.get(
    "/{group_id}",
    response_model=GroupDetail,
    summary="Describe a group: members, assignment, committed offsets, offset lag and event-time lag",
    responses={404: PROBLEM_RESPONSES[404]},
    dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.GROUP, "group_id"))],
)
async def describe_group(group_id: str, ctx: Ctx) -> GroupDetail:
    return collect_group(_coordinator(ctx.runtime.registries), ctx.store, group_id)
