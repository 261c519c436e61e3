"""FindCoordinator and the group APIs, translated onto the group coordinator.

The coordinator (``broker.groups.coordinator.GroupCoordinator``) owns the state machine and the
offset store; this module only maps wire fields to its calls and back:
join/sync/leave/commit_offsets/delete_groups are awaited, heartbeat/fetch_offsets/describe/list_groups
are plain calls. This broker is the coordinator for every group (FindCoordinator answers with itself).
"""

from __future__ import annotations

import logging
from typing import Any

from broker.errors import UnknownTopicError
from broker.protocol.kafka_codes import ErrorCode
from broker.security import Operation, ResourceType
from broker.server.authz import allowed, authorized_operations
from broker.server.handlers_common import NODE_ID, BrokerContext, ConnectionInfo, millis

__all__ = [
    "handle_delete_groups",
    "handle_describe_groups",
    "handle_find_coordinator",
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_list_groups",
    "handle_offset_commit",
    "handle_offset_delete",
    "handle_offset_fetch",
    "handle_sync_group",
]

log = logging.getLogger("broker.server.kafka")

_CLASSIC_GROUP_TYPE = "classic"  # Kafka's Group.GroupType of JoinGroup/SyncGroup groups


async def handle_find_coordinator(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    host, port = ctx.advertised_for(conn)
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "node_id": NODE_ID,
            "host": host, "port": port}


async def handle_join_group(
    ctx: BrokerContext, body: Any, conn: ConnectionInfo, version: int, client_id: str | None
) -> dict[str, Any]:
    session_ms = millis(body.session_timeout)
    rebalance = getattr(body, "rebalance_timeout", None)
    rebalance_ms = millis(rebalance) if rebalance is not None else session_ms
    result = await ctx.coordinator.join(
        str(body.group_id),
        str(body.member_id),
        getattr(body, "group_instance_id", None),
        str(body.protocol_type),
        [(str(p.name), bytes(p.metadata)) for p in body.protocols],
        session_ms,
        rebalance_ms,
        client_id or "",
        f"/{conn.peer_host}",  # Kafka's client host is Java's InetAddress text, "/127.0.0.1"
        version >= 4,
    )
    return {
        "throttle_time": 0,
        "error_code": int(result.error_code),
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name or "",
        "leader": result.leader_id or "",
        "member_id": result.member_id or "",
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
            for m in result.members
        ],
    }


async def handle_sync_group(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    result = await ctx.coordinator.sync(
        str(body.group_id),
        int(body.generation_id),
        str(body.member_id),
        {str(a.member_id): bytes(a.assignment) for a in body.assignments},
        getattr(body, "group_instance_id", None),  # v3+
    )
    return {"throttle_time": 0, "error_code": int(result.error_code), "assignment": result.assignment or b""}


async def handle_heartbeat(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    code = ctx.coordinator.heartbeat(str(body.group_id), int(body.generation_id), str(body.member_id),
                                     getattr(body, "group_instance_id", None))  # v3+
    return {"throttle_time": 0, "error_code": int(code)}


async def handle_leave_group(ctx: BrokerContext, body: Any, conn: ConnectionInfo, version: int) -> dict[str, Any]:
    if version < 3:
        top, codes = await ctx.coordinator.leave_members(str(body.group_id), [(str(body.member_id), None)])
        return {"throttle_time": 0, "error_code": int(codes[0] if codes and top == ErrorCode.NONE else top)}
    members = [(str(m.member_id), m.group_instance_id) for m in body.members]
    top, codes = await ctx.coordinator.leave_members(str(body.group_id), members)
    if top != ErrorCode.NONE:  # Kafka's leaveError: the top-level code and no member list
        return {"throttle_time": 0, "error_code": int(top), "members": []}
    return {
        "throttle_time": 0,
        "error_code": int(top),
        "members": [
            {"member_id": mid, "group_instance_id": instance, "error_code": int(code)}
            for (mid, instance), code in zip(members, codes, strict=True)
        ],
    }


def _retention_time_ms(body: Any) -> int:
    """OffsetCommit v2-v4's retention_time_ms (-1: the broker's offsets.retention.minutes); Kafka
    then expires the offsets at commit time + retention (broker.groups.expiry rule 1)."""
    retention = getattr(body, "retention_time", None)  # an int: the codec reads it as a plain int64
    return -1 if retention is None else int(retention)


async def handle_offset_commit(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    # As Kafka's KafkaApis (every version): a partition that does not exist is answered
    # UNKNOWN_TOPIC_OR_PARTITION before the coordinator sees the request; the others are committed.
    offsets: dict[tuple[str, int], tuple[int, str | None]] = {}
    codes: dict[tuple[str, int], ErrorCode] = {}
    for topic in body.topics:
        for p in topic.partitions:
            tp = (str(topic.name), int(p.partition_index))
            if _partition_exists(ctx, *tp):
                offsets[tp] = (int(p.committed_offset), p.committed_metadata)
            else:
                codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    codes.update(await ctx.coordinator.commit_offsets(
        str(body.group_id), int(body.generation_id_or_member_epoch), str(body.member_id), offsets,
        getattr(body, "group_instance_id", None), _retention_time_ms(body),
    ))
    return {
        "throttle_time": 0,
        "topics": [
            {"name": str(topic.name), "partitions": [
                {"partition_index": int(p.partition_index),
                 "error_code": int(codes.get((str(topic.name), int(p.partition_index)), ErrorCode.NONE))}
                for p in topic.partitions
            ]}
            for topic in body.topics
        ],
    }


def _partition_exists(ctx: BrokerContext, topic: str, partition: int) -> bool:
    try:
        ctx.store.partition(topic, partition)
    except UnknownTopicError:
        return False
    return True


async def handle_offset_fetch(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    wanted: list[tuple[str, int]] | None = None
    if body.topics is not None:
        wanted = [(str(t.name), int(p)) for t in body.topics for p in t.partition_indexes]
    group_id = str(body.group_id)
    offsets = ctx.coordinator.fetch_offsets(group_id, wanted)
    # v7's require_stable (Kafka's getOffsets): a partition with a commit still in flight, plain or in an
    # open transaction, answers UNSTABLE_OFFSET_COMMIT and no offset, so the client retries.
    unstable: set[tuple[str, int]] = set()
    if getattr(body, "require_stable", False):
        unstable = ctx.coordinator.commits_in_flight(group_id) | ctx.transactions.pending_offsets(group_id)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    keys = wanted if wanted is not None else sorted(offsets)
    for name, index in keys:
        offset, metadata = offsets.get((name, index), (-1, None))
        error = ErrorCode.NONE
        if (name, index) in unstable:
            offset, metadata, error = -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT
        by_topic.setdefault(name, []).append({
            "partition_index": index, "committed_offset": offset, "committed_leader_epoch": -1,
            "metadata": metadata if metadata is not None else "", "error_code": error,
        })
    return {
        "throttle_time": 0,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        "error_code": ErrorCode.NONE,
    }


async def handle_describe_groups(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    groups: list[dict[str, Any]] = []
    for group_id in body.groups:
        desc = ctx.coordinator.describe(str(group_id))
        groups.append({
            "error_code": ErrorCode.NONE,
            "group_id": desc.group_id,
            "group_state": desc.state,
            "protocol_type": desc.protocol_type or "",
            "protocol_data": desc.protocol_name or "",
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                 "client_host": m.client_host, "member_metadata": m.metadata or b"",
                 "member_assignment": m.assignment or b""}
                for m in desc.members
            ],
            "authorized_operations": (authorized_operations(ctx, conn, ResourceType.GROUP, desc.group_id)
                                      if getattr(body, "include_authorized_operations", False) else -(2**31)),
        })
    return {"throttle_time": 0, "groups": groups}


async def handle_list_groups(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    # v4 (KIP-518): only groups in one of the states asked for, compared as Kafka does (case and
    # surrounding blanks ignored); an empty or absent filter lists every group. v5 (KIP-848) filters by
    # group type the same way: every Sluice group is a "classic" one.
    wanted = {str(s).strip().lower() for s in getattr(body, "states_filter", None) or ()}
    types = {str(t).strip().lower() for t in getattr(body, "types_filter", None) or ()}
    if types and _CLASSIC_GROUP_TYPE not in types:
        return {"throttle_time": 0, "error_code": ErrorCode.NONE, "groups": []}
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "groups": [{"group_id": g, "protocol_type": ptype, "group_state": state, "group_type": _CLASSIC_GROUP_TYPE}
                   for g, ptype, state in ctx.coordinator.list_groups() if not wanted or state.lower() in wanted],
    }


async def handle_delete_groups(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    names = list(dict.fromkeys(str(g) for g in body.groups_names))  # one result per group, as Kafka
    codes = await ctx.coordinator.delete_groups(names)
    log.info("delete groups", extra={"groups": names, "peer": conn.peer_host,
                                     "errors": {g: c.name for g, c in codes.items() if c != ErrorCode.NONE}})
    return {"throttle_time": 0, "results": [{"group_id": g, "error_code": int(codes[g])} for g in names]}


async def handle_offset_delete(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    # As Kafka's KafkaApis: DELETE on the group is checked before (authz.gate); per partition, READ on
    # its topic (TOPIC_AUTHORIZATION_FAILED), then its existence (UNKNOWN_TOPIC_OR_PARTITION); the
    # rest goes to the coordinator. A group error answers alone, without the partitions.
    codes: dict[tuple[str, int], ErrorCode] = {}
    asked: list[tuple[str, int]] = []
    for topic in body.topics:
        readable = allowed(ctx, conn, Operation.READ, ResourceType.TOPIC, str(topic.name))
        for p in topic.partitions:
            tp = (str(topic.name), int(p.partition_index))
            if not readable:
                codes[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif not _partition_exists(ctx, *tp):
                codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                asked.append(tp)
    error, deleted = await ctx.coordinator.delete_offsets(str(body.group_id), asked)
    if error != ErrorCode.NONE:
        return {"throttle_time": 0, "error_code": int(error), "topics": []}
    codes.update(deleted)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append({"partition_index": index, "error_code": int(code)})
    return {"throttle_time": 0, "error_code": ErrorCode.NONE,
            "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}
