"""The data the group state machine (group.py) keeps and hands out: a member, the running initial
rebalance window, and the ``Effects`` of a call (answers owed to parked requests, and the metadata
write its coordinator must make, rule 13)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.groups.answers import JoinResult, SyncResult

__all__ = ["Effects", "InitialDelay", "Member", "StoreGroup"]


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    session_deadline: float
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False

    def metadata_for(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def touch(self, now: float) -> None:
        self.session_deadline = now + self.session_timeout_ms / 1000.0


@dataclass(slots=True)
class InitialDelay:
    """The window of the initial rebalance (rule 5) that is running."""

    window_end: float
    delay_ms: int  # length of this window
    remaining_ms: int  # what is left of the rebalance timeout for further windows
    new_member_added: bool = False


@dataclass(frozen=True, slots=True)
class StoreGroup:
    """Rule 13: write the group's metadata (Kafka's ``storeGroup``) as it is now, with these
    assignments, then report back: ``assignment_stored`` (why = "assignment"), ``revert_static``
    on a failed write (why = "static-member", ``replaced`` = the member as it was before the swap);
    a failed write of an Empty group (why = "empty") is only logged, as Kafka does."""

    why: str
    generation_id: int
    assignments: Mapping[str, bytes]
    replaced: Member | None = None


@dataclass(slots=True)
class Effects:
    """Answers owed to parked requests, in the order they became due, and a write to make."""

    joins: list[tuple[str, JoinResult]] = field(default_factory=list)
    syncs: list[tuple[str, SyncResult]] = field(default_factory=list)
    store: StoreGroup | None = None
