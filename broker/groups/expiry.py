"""Which committed offsets have expired (Kafka's ``offsets.retention.minutes``; sans-IO, no asyncio).

Kafka's classic groups (``ClassicGroup.offsetExpirationCondition``, ``OffsetMetadataManager.
cleanupExpiredOffsets``; before 3.7 ``GroupMetadata.removeExpiredOffsets``, KIP-211 and KIP-496):

1. An offset committed with an expire timestamp (OffsetCommit v2-v4 with ``retention_time_ms`` != -1:
   commit time + retention) expires once ``now >= expire timestamp``, whatever the base below.
   Every other offset expires once ``now - base >= retention``; the group's state picks the base:
2. A group without a protocol type (standalone consumers that only commit and fetch, ``assign()``
   users): base = each offset's commit time.
3. A group with a protocol type that is Empty: base = the time it became Empty (Kafka's
   ``currentStateTimestamp``); a group Empty since before that time was stored uses the commit time.
4. A Stable group of protocol type ``consumer`` whose members' subscriptions can be read: only the
   offsets of topics no member subscribes to expire (KIP-496), base = commit time.
5. Any other group (rebalancing, Stable with another protocol type or an unreadable subscription)
   keeps all its offsets.
6. An offset whose commit is still being written is not expired (Kafka's pending offset commits).

The coordinator then removes the expired offsets durably and deletes a group left Empty without
offsets (coordinator.py), as Kafka's ``cleanupGroupMetadata``.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from broker.groups.answers import GroupState
from broker.groups.assignment import decode_subscription_topics
from broker.groups.errors import InvalidConsumerProtocolError
from broker.groups.group import Group
from broker.groups.offsets import CommittedOffset, TopicPartition

__all__ = ["CONSUMER_PROTOCOL_TYPE", "expired_offsets", "subscribed_topics"]

CONSUMER_PROTOCOL_TYPE = "consumer"


def subscribed_topics(group: Group) -> set[str] | None:
    """The topics the members of a ``consumer`` group subscribe to (in the selected protocol's
    metadata); None when any subscription cannot be read (Kafka then expires nothing, rule 5)."""
    topics: set[str] = set()
    try:
        for member in group.members.values():
            topics.update(decode_subscription_topics(member.metadata_for(group.protocol_name)))
    except InvalidConsumerProtocolError:
        return None
    return topics


def expired_offsets(
    group: Group | None,
    offsets: Mapping[TopicPartition, CommittedOffset],
    *,
    now_ms: int,
    retention_ms: int,
    empty_since_ms: int | None,
    pending: Container[TopicPartition] = (),
) -> list[TopicPartition]:
    """The partitions whose committed offsets have expired at ``now_ms`` (rules 1-6). ``group`` is
    None for a group known only by its offsets (a standalone group after a restart)."""
    subscribed: set[str] = set()
    use_empty_since = False
    if group is None or group.protocol_type is None:
        pass  # rule 2
    elif group.state is GroupState.EMPTY:
        use_empty_since = empty_since_ms is not None  # rule 3
    elif group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.state is GroupState.STABLE:
        topics = subscribed_topics(group)  # rule 4
        if topics is None:
            return []
        subscribed = topics
    else:
        return []  # rule 5
    expired = []
    for tp, committed in offsets.items():
        if tp[0] in subscribed or tp in pending:
            continue
        if committed.expire_timestamp_ms >= 0:
            gone = now_ms >= committed.expire_timestamp_ms
        else:
            base = empty_since_ms if use_empty_since and empty_since_ms is not None else committed.commit_timestamp_ms
            gone = now_ms - base >= retention_ms
        if gone:
            expired.append(tp)
    return expired
