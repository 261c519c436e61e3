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

CreatePartitions grows a topic through ``LogStore.create_partitions`` (Kafka's rules: the count must
grow; a topic listed twice fails with INVALID_REQUEST; explicit replica assignments must name broker
0 only, one replica per new partition, else INVALID_REPLICA_ASSIGNMENT).
"""

from __future__ import annotations

import logging
from typing import Any

from broker.errors import BrokerError
from broker.protocol.kafka_codes import ErrorCode
from broker.server.handlers_common import BrokerContext, ConnectionInfo, error_code_for

__all__ = ["handle_offset_for_leader_epoch"]

log = logging.getLogger("broker.server.kafka")

LEADER_EPOCH = 0  # the only leader epoch a partition of this broker ever has
_UNDEFINED = -1


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
