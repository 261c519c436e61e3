"""Group metadata records: what the coordinator stores of a group beside its committed offsets, so
that a restarted broker has the group back as it was (Kafka's GroupMetadata records).

The value is Kafka's ``GroupMetadataValue`` (non-flexible versions 0-3; written as version 3),
big-endian, strings as ``i16 length`` + utf-8 (-1 = null), bytes as ``i32 length`` + data::

    i16 version
    string protocol_type, i32 generation, nullable string protocol, nullable string leader,
    i64 current_state_timestamp (v2+, ms since the epoch),
    i32 member count, then per member: string member_id, nullable string group_instance_id (v3+),
        string client_id, string client_host, i32 rebalance_timeout_ms (v1+),
        i32 session_timeout_ms, bytes subscription, bytes assignment

``record_of`` builds the record of a live group (rule 13 of group.py says when); ``restore_group``
turns a record back into a group as Kafka's ``GroupMetadata.loadGroup`` does: Stable with the
stored generation, leader and assignments when it has members, otherwise Empty; every member's
session deadline counts from the load. Sans-IO: bytes in, values out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.groups.answers import GroupSettings, GroupState
from broker.groups.group import Group
from broker.groups.member import Member, StoreGroup

__all__ = [
    "GROUP_METADATA_VERSION",
    "MAX_GROUP_RECORD_BYTES",
    "GroupMetadataRecord",
    "MemberRecord",
    "decode_group_metadata",
    "encode_group_metadata",
    "record_of",
    "restore_group",
]

GROUP_METADATA_VERSION = 3
# Kafka's message.max.bytes default: a group's record in __consumer_offsets must fit it, or storeGroup fails
# (RECORD_TOO_LARGE, answered UNKNOWN_SERVER_ERROR). Without it members' metadata and assignments (up to a
# request each) would make records of any size, all read back at every start.
MAX_GROUP_RECORD_BYTES = 1024 * 1024 + 12
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataRecord:
    protocol_type: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberRecord, ...]


# ---------------------------------------------------------------------- codec


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode()
    if len(raw) > 0x7FFF:  # Kafka's string limit (e.g. a member id made from a 32 KiB client id)
        raise ValueError(f"a string of {len(raw)} bytes does not fit a group metadata record")
    return _I16.pack(len(raw)) + raw


def _bytes(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def encode_group_metadata(record: GroupMetadataRecord) -> bytes:
    """Kafka's GroupMetadataValue v3; ValueError when a string is longer than Kafka's format allows or the
    record is larger than ``MAX_GROUP_RECORD_BYTES``."""
    parts = [
        _I16.pack(GROUP_METADATA_VERSION),
        _string(record.protocol_type),
        _I32.pack(record.generation_id),
        _string(record.protocol_name),
        _string(record.leader_id),
        _I64.pack(record.current_state_timestamp_ms),
        _I32.pack(len(record.members)),
    ]
    for m in record.members:
        parts += [
            _string(m.member_id), _string(m.group_instance_id), _string(m.client_id), _string(m.client_host),
            _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms),
            _bytes(m.subscription), _bytes(m.assignment),
        ]
    value = b"".join(parts)
    if len(value) > MAX_GROUP_RECORD_BYTES:
        raise ValueError(f"a group metadata record of {len(value)} bytes is larger than {MAX_GROUP_RECORD_BYTES}")
    return value


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("group metadata ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int(self, fmt: struct.Struct) -> int:
        (value,) = fmt.unpack(self.take(fmt.size))
        return int(value)

    def nullable_string(self) -> str | None:
        n = self.int(_I16)
        return None if n == -1 else self.take(n).decode()

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ValueError("null where group metadata needs a string")
        return value

    def bytes(self) -> bytes:
        return self.take(self.int(_I32))


def decode_group_metadata(data: bytes) -> GroupMetadataRecord:
    """A ``GroupMetadataValue`` of version 0-3; ValueError (or UnicodeDecodeError) if it is not one."""
    c = _Cursor(data)
    version = c.int(_I16)
    if not 0 <= version <= GROUP_METADATA_VERSION:
        raise ValueError(f"unsupported group metadata version {version}")
    protocol_type = c.string()
    generation_id = c.int(_I32)
    protocol_name = c.nullable_string()
    leader_id = c.nullable_string()
    timestamp = c.int(_I64) if version >= 2 else -1
    members = []
    for _ in range(c.int(_I32)):
        member_id = c.string()
        instance = c.nullable_string() if version >= 3 else None
        client_id, client_host = c.string(), c.string()
        rebalance_ms = c.int(_I32) if version >= 1 else -1
        session_ms = c.int(_I32)
        members.append(MemberRecord(member_id, instance, client_id, client_host,
                                    rebalance_ms if version >= 1 else session_ms, session_ms, c.bytes(), c.bytes()))
    if c.pos != len(data):
        raise ValueError("trailing bytes after group metadata")
    if members and leader_id not in {m.member_id for m in members}:
        raise ValueError(f"group metadata names leader {leader_id!r}, not one of its members")
    return GroupMetadataRecord(protocol_type, generation_id, protocol_name, leader_id, timestamp, tuple(members))


# ---------------------------------------------------------------------- live group <-> record


def record_of(group: Group, store: StoreGroup, timestamp_ms: int) -> GroupMetadataRecord:
    """The record of ``group`` as it is now, with the assignments of ``store`` (rule 13)."""
    protocol = group.protocol_name
    members = tuple(
        MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                     m.session_timeout_ms, m.metadata_for(protocol), bytes(store.assignments.get(m.member_id, b"")))
        for m in group.members.values()
    )
    return GroupMetadataRecord(group.protocol_type or "", store.generation_id, protocol,
                               group.leader_id if members else None, timestamp_ms, members)


def restore_group(group_id: str, record: GroupMetadataRecord, settings: GroupSettings, now: float) -> Group:
    """The group as ``record`` left it (Kafka's loadGroup): Stable with members, else Empty."""
    group = Group(group_id, settings)
    group.generation_id = record.generation_id
    group.protocol_type = record.protocol_type or None
    if record.members:
        group.state = GroupState.STABLE
        group.protocol_name = record.protocol_name
        group.leader_id = record.leader_id
    for m in record.members:
        group.members[m.member_id] = Member(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            protocol_type=record.protocol_type,
            protocols=[(record.protocol_name or "", m.subscription)],
            session_timeout_ms=m.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            session_deadline=now + m.session_timeout_ms / 1000.0,
            assignment=m.assignment,
        )
    return group
