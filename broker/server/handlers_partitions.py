"""CreatePartitions, DeleteRecords and OffsetForLeaderEpoch: requests about a topic's partitions.

One broker (node 0) leads every partition with leader epoch 0 from the partition's first offset, so
its leader-epoch cache holds one entry, ``{0: log start offset}``. OffsetForLeaderEpoch answers as
Kafka's ``LeaderEpochFileCache.endOffsetFor`` does with that cache: epoch 0 → (0, log end offset);
an epoch above 0 or -1 (undefined) → (-1, -1) without error; an epoch below -1 → (that epoch, log
start offset). A ``current_leader_epoch`` other than -1 is checked first: below 0 →
FENCED_LEADER_EPOCH, above 0 → UNKNOWN_LEADER_EPOCH.

DeleteRecords (Kafka's ``Partition.deleteRecordsOnLeader``): offset -1 means the high watermark;
a negative offset or one above the high watermark → OFFSET_OUT_OF_RANGE; an internal topic →
INVALID_TOPIC_EXCEPTION; a topic whose cleanup.policy lacks ``delete`` → POLICY_VIOLATION; otherwise
the log start offset moves up to the offset (never down) and the answer is the new low watermark.
Records below it are no longer served; whole segments below it are removed from disk.

ElectLeaders (Kafka's ``ReplicationControlManager.electLeaders``): the only replica leads every partition,
so it is the preferred leader and a live one: each partition named is ELECTION_NOT_NEEDED, an unknown
topic or partition UNKNOWN_TOPIC_OR_PARTITION; asked for every partition (null), the answer leaves out
those that needed none, so it is empty. An election type other than preferred (0) or unclean (1) is
INVALID_REQUEST for the whole request.

ListPartitionReassignments (``kafka-reassign-partitions --list``): a single replica is never being moved,
so the answer lists no reassignment, for every topic or the ones named (unknown ones are left out, as
Kafka's controller does); DESCRIBE on the cluster with ACLs.

CreatePartitions grows a topic through ``LogStore.create_partitions`` (Kafka's rules: the count must
grow; a topic listed twice fails with INVALID_REQUEST; explicit replica assignments must name broker
0 only, one replica per new partition, else INVALID_REPLICA_ASSIGNMENT).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from broker.errors import BrokerError, OffsetOutOfRangeError
from broker.protocol.kafka_codes import ErrorCode
from broker.server.handlers_common import NODE_ID, BrokerContext, ConnectionInfo, error_code_for

__all__ = [
    "handle_create_partitions",
    "handle_delete_records",
    "handle_elect_leaders",
    "handle_list_partition_reassignments",
    "handle_offset_for_leader_epoch",
]

log = logging.getLogger("broker.server.kafka")

LEADER_EPOCH = 0  # the only leader epoch a partition of this broker ever has
_UNDEFINED = -1
_HIGH_WATERMARK = -1  # DeleteRecords: "up to the high watermark"
_ELECTION_TYPES = (0, 1)  # preferred, unclean
_NOT_NEEDED = "Leader election not needed for topic partition."  # Kafka's message for ELECTION_NOT_NEEDED


async def handle_elect_leaders(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    election_type = int(getattr(body, "election_type", 0))  # v0 elects the preferred replica only
    if election_type not in _ELECTION_TYPES:
        message = f"Unknown election type {election_type}"
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_REQUEST, "replica_election_results": [
            {"topic": t.topic, "partition_result": [
                {"partition_id": p, "error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
                for p in t.partitions]}
            for t in body.topic_partitions or ()]}
    results = [{"topic": str(t.topic), "partition_result": [_election(ctx, str(t.topic), int(p)) for p in t.partitions]}
               for t in body.topic_partitions or ()]
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "replica_election_results": results}


async def handle_list_partition_reassignments(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "topics": []}


def _election(ctx: BrokerContext, topic: str, partition: int) -> dict[str, Any]:
    try:
        ctx.store.partition(topic, partition)
    except BrokerError as exc:
        return {"partition_id": partition, "error_code": error_code_for(exc), "error_message": str(exc)}
    return {"partition_id": partition, "error_code": ErrorCode.ELECTION_NOT_NEEDED, "error_message": _NOT_NEEDED}


async def handle_offset_for_leader_epoch(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    topics: list[dict[str, Any]] = []
    for topic in body.topics:
        name = str(topic.topic)
        partitions = [_epoch_end_offset(ctx, name, p) for p in topic.partitions]
        topics.append({"topic": name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


def _epoch_end_offset(ctx: BrokerContext, topic: str, p: Any) -> dict[str, Any]:
    index = int(p.partition)
    answer: dict[str, Any] = {"partition": index, "error_code": ErrorCode.NONE, "leader_epoch": _UNDEFINED,
                              "end_offset": _UNDEFINED}
    try:
        plog = ctx.store.partition(topic, index)
    except BrokerError as exc:
        answer["error_code"] = error_code_for(exc)
        return answer
    current = int(p.current_leader_epoch)
    if current != _UNDEFINED and current != LEADER_EPOCH:
        fenced = current < LEADER_EPOCH
        answer["error_code"] = ErrorCode.FENCED_LEADER_EPOCH if fenced else ErrorCode.UNKNOWN_LEADER_EPOCH
        return answer
    requested = int(p.leader_epoch)
    if requested == LEADER_EPOCH:
        answer["leader_epoch"], answer["end_offset"] = LEADER_EPOCH, plog.high_watermark
    elif requested < _UNDEFINED:
        answer["leader_epoch"], answer["end_offset"] = requested, plog.log_start_offset
    return answer


async def handle_delete_records(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    topics: list[dict[str, Any]] = []
    for topic in body.topics:
        name = str(topic.name)
        results = [await _delete_records(ctx, name, int(p.partition_index), int(p.offset), conn)
                   for p in topic.partitions]
        topics.append({"name": name, "partitions": results})
    return {"throttle_time": 0, "topics": topics}


async def _delete_records(ctx: BrokerContext, topic: str, index: int, offset: int,
                          conn: ConnectionInfo) -> dict[str, Any]:
    answer: dict[str, Any] = {"partition_index": index, "low_watermark": -1, "error_code": ErrorCode.NONE}
    try:
        info = ctx.store.topic(topic)
        plog = ctx.store.partition(topic, index)
        if info.internal:
            answer["error_code"] = ErrorCode.INVALID_TOPIC_EXCEPTION
        elif not info.config.delete:
            answer["error_code"] = ErrorCode.POLICY_VIOLATION
        else:
            before = plog.high_watermark if offset == _HIGH_WATERMARK else offset
            if before < 0:
                raise OffsetOutOfRangeError(f"the offset {before} for partition {topic}-{index} is not valid")
            answer["low_watermark"] = await plog.delete_records(before)  # the store logs it
    except BrokerError as exc:
        answer["error_code"] = error_code_for(exc)
        if answer["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR:
            log.error("delete records failed", extra={"topic": topic, "partition": index, "error": str(exc),
                                                      "peer": conn.peer_host})
    return answer


async def handle_create_partitions(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    counts = Counter(str(t.name) for t in body.topics)
    results: list[dict[str, Any]] = []
    for topic in body.topics:
        name = str(topic.name)
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.NONE, "error_message": None}
        results.append(result)
        if counts[name] > 1:
            result["error_code"] = ErrorCode.INVALID_REQUEST
            result["error_message"] = "Duplicate topic in request."
            continue
        total = int(topic.count)
        try:
            current = ctx.store.topic(name).partitions
            problem = _assignment_problem(topic.assignments, total - current)
            if problem is not None:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem
                continue
            ctx.store.create_partitions(name, total, validate_only=bool(body.validate_only))
        except BrokerError as exc:
            result["error_code"] = error_code_for(exc)
            result["error_message"] = str(exc)
            continue
        if not body.validate_only:
            log.info("partitions created", extra={"topic": name, "from": current, "to": total, "peer": conn.peer_host})
    return {"throttle_time": 0, "results": results}


def _assignment_problem(assignments: Any, new_partitions: int) -> str | None:
    """Kafka's checks of explicit replica assignments, for a cluster of one broker."""
    if assignments is None or new_partitions <= 0:
        return None
    if len(assignments) != new_partitions:
        return (f"Increasing the number of partitions by {new_partitions} but {len(assignments)} "
                "assignments provided.")
    for assignment in assignments:
        brokers = [int(b) for b in assignment.broker_ids]
        if brokers != [NODE_ID]:
            return f"Replica assignment {brokers} is not valid: this cluster has one broker, id {NODE_ID}."
    return None
