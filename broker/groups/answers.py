"""What the group state machine (group.py) is configured with and answers: settings, JoinGroup and
SyncGroup results, and the description DescribeGroups puts on the wire. Plain frozen records."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from broker.protocol.kafka_codes import ErrorCode

__all__ = [
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "JoinMember",
    "JoinResult",
    "MemberDescription",
    "SyncResult",
]


class GroupState(StrEnum):
    """The names DescribeGroups and ListGroups put on the wire."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupSettings:
    min_session_timeout_ms: int = 1_000
    max_session_timeout_ms: int = 1_800_000
    # 0 here (embedding, unit tests); ``sluice serve`` passes kafka.group_initial_rebalance_delay_ms,
    # whose default is Kafka's 3000.
    initial_rebalance_delay_ms: int = 0
    max_offset_metadata_bytes: int = 4096
    # Kafka's offsets.retention.check.interval.ms: how often an Empty group without committed offsets
    # is deleted (Kafka's cleanupGroupMetadata); its stored metadata goes with it
    empty_group_check_interval_ms: int = 600_000
    # Kafka's offsets.retention.minutes (7 days), in ms: when committed offsets expire (expiry.py)
    offsets_retention_ms: int = 7 * 24 * 3_600_000


@dataclass(frozen=True, slots=True)
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error_code: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    members: list[JoinMember] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SyncResult:
    error_code: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberDescription]
