"""Consumer groups and committed offsets (no sockets, no Kafka framing).

``GroupCoordinator`` (coordinator.py) answers JoinGroup/SyncGroup/Heartbeat/LeaveGroup/OffsetCommit/
OffsetFetch/DescribeGroups/ListGroups/DeleteGroups for the Kafka front; ``Group`` (group.py) is the
per-group state machine, member_checks.py the checks of its requests that leave its state alone
(Heartbeat, commits), answers.py its settings and results; ``OffsetStore`` (offsets.py) keeps
committed offsets in memory or durably on disk; assignment.py decodes the consumer protocol's
assignment bytes for tooling.
"""

from broker.groups.assignment import (
    ConsumerAssignment,
    decode_assignment,
    encode_assignment,
)
from broker.groups.clock import Clock, FakeClock, MonotonicClock
from broker.groups.coordinator import GroupCoordinator
from broker.groups.errors import GroupsError, InvalidConsumerProtocolError, OffsetStoreCorruptError, OffsetStoreError
from broker.groups.group import (
    Group,
    GroupDescription,
    GroupSettings,
    GroupState,
    JoinMember,
    JoinResult,
    MemberDescription,
    SyncResult,
)
from broker.groups.offsets import CommittedOffset, DurableOffsetStore, MemoryOffsetStore, OffsetStore

__all__ = [
    "Clock",
    "CommittedOffset",
    "ConsumerAssignment",
    "DurableOffsetStore",
    "FakeClock",
    "Group",
    "GroupCoordinator",
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "GroupsError",
    "InvalidConsumerProtocolError",
    "JoinMember",
    "JoinResult",
    "MemberDescription",
    "MemoryOffsetStore",
    "MonotonicClock",
    "OffsetStore",
    "OffsetStoreCorruptError",
    "OffsetStoreError",
    "SyncResult",
    "decode_assignment",
    "encode_assignment",
]
