"""Which committed offsets an OffsetDelete may remove (Kafka's ``handleDeleteOffsets``; sans-IO).

Rules, in Kafka's order:
1. A group nobody has joined and without committed offsets, or a Dead one: GROUP_ID_NOT_FOUND, nothing
   removed.
2. An Empty group (or one known only by its offsets): every partition asked for is removed.
3. A group with members and protocol type ``consumer``: partitions of topics a member subscribes to get
   GROUP_SUBSCRIBED_TO_TOPIC (all of them when a subscription cannot be read: Kafka then assumes it is
   subscribed), the others are removed.
4. Any other group with members: NON_EMPTY_GROUP, nothing removed.
A partition asked for that has no committed offset is answered NONE as well. Afterwards an Empty group
left without offsets is deleted, as Kafka's ``cleanupGroupMetadata`` does (the coordinator's part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.groups.answers import GroupState
from broker.groups.expiry import CONSUMER_PROTOCOL_TYPE, subscribed_topics
from broker.groups.group import Group
from broker.groups.offsets import TopicPartition
from broker.protocol.kafka_codes import ErrorCode

__all__ = ["OffsetDeletion", "offset_deletion"]


@dataclass(frozen=True, slots=True)
class OffsetDeletion:
    error: ErrorCode  # the group's: NONE, or the whole request's answer
    removable: tuple[TopicPartition, ...] = ()
    refused: dict[TopicPartition, ErrorCode] = field(default_factory=dict)


def offset_deletion(group: Group | None, has_offsets: bool, partitions: Sequence[TopicPartition]) -> OffsetDeletion:
    if (group is None and not has_offsets) or (group is not None and group.state is GroupState.DEAD):
        return OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND)  # rule 1
    if group is None or group.state is GroupState.EMPTY:
        return OffsetDeletion(ErrorCode.NONE, tuple(partitions))  # rule 2
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return OffsetDeletion(ErrorCode.NON_EMPTY_GROUP)  # rule 4
    topics = subscribed_topics(group)  # rule 3

    def subscribed(topic: str) -> bool:
        return topics is None or topic in topics

    return OffsetDeletion(
        ErrorCode.NONE,
        tuple(tp for tp in partitions if not subscribed(tp[0])),
        {tp: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC for tp in partitions if subscribed(tp[0])},
    )
