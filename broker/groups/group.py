"""One consumer group: the classic Kafka group membership state machine (sans-IO, no asyncio).

Each method takes ``now`` (seconds from the coordinator's monotonic clock) and returns the answers
that became due as ``Effects``: JoinGroup/SyncGroup responses owed to members whose requests are
parked. The coordinator turns them into resolved futures; tests drive this class directly.

States and transitions::

    Empty ──join──▶ PreparingRebalance ──all joined / rebalance timeout──▶ CompletingRebalance
      ▲                 ▲        │                                             │
      │                 │        └──(no members left)──▶ Empty                 │ leader's SyncGroup
      │                 │                                                      ▼
      └──(no members)───┴──── member joins/leaves/expires, leader rejoins ── Stable
    Dead: terminal; only DeleteGroups on a group without members gets there (``mark_dead``).

Rules:
1. Member ids are ``<client_id>-<uuid>``, made by the coordinator. A JoinGroup with an empty member
   id and ``require_known_member_id`` (JoinGroup v4+) gets MEMBER_ID_REQUIRED with a fresh id, which
   is kept as *pending* until it rejoins with it or its session timeout passes. A non-empty member id
   that is neither a member nor pending gets UNKNOWN_MEMBER_ID.
2. Session timeouts must lie in [min_session_timeout_ms, max_session_timeout_ms] (INVALID_SESSION_TIMEOUT).
   A non-empty group accepts a joiner only with the same protocol type and at least one protocol every
   other member supports (INCONSISTENT_GROUP_PROTOCOL).
3. The leader is the first member to join; when the leader leaves, the oldest remaining member leads.
4. A new member, a leaving or expired member, the leader rejoining, or a member rejoining with changed
   protocols moves the group to PreparingRebalance. Entering it from CompletingRebalance fails every
   parked SyncGroup with REBALANCE_IN_PROGRESS and clears the assignments. The rebalance deadline is
   now + the largest rebalance timeout of the members.
5. The rebalance completes when every member has a parked JoinGroup and no pending member id is
   outstanding, or when the deadline passes, or at once when no member is left; members without a
   parked JoinGroup are then removed.
   Completion bumps the generation, picks the protocol (each member votes for its most preferred one
   among those all support; most votes wins, ties to the leader's preference), and answers every
   parked JoinGroup; only the leader's answer lists the members with their metadata. With members the
   group is CompletingRebalance, without it is Empty.
   Leaving an Empty group for PreparingRebalance waits at least ``initial_rebalance_delay_ms`` (each
   new joiner extends it, never past the rebalance deadline) so that a starting fleet joins in one go.
6. SyncGroup: unknown member → UNKNOWN_MEMBER_ID; wrong generation → ILLEGAL_GENERATION; during
   PreparingRebalance → REBALANCE_IN_PROGRESS; during CompletingRebalance the request is parked until
   the leader's SyncGroup stores the assignments (members it left out get empty bytes), which makes
   the group Stable and answers every parked SyncGroup with the member's own assignment; in Stable
   the member's assignment is returned at once.
7. Heartbeat: unknown member → UNKNOWN_MEMBER_ID; wrong generation → ILLEGAL_GENERATION;
   PreparingRebalance → REBALANCE_IN_PROGRESS; otherwise NONE. Heartbeats, JoinGroup, SyncGroup and
   accepted commits push the member's session deadline to now + session timeout.
8. A member whose session deadline passes is removed as if it had left, unless it has a parked
   JoinGroup or SyncGroup (the rebalance deadline or the leader's sync governs those); answering a
   parked request restarts the member's session clock. Removing a member with a parked request
   answers it with UNKNOWN_MEMBER_ID.
9. Offset commits: generation < 0 on an Empty group is a standalone commit (no membership);
   otherwise CompletingRebalance → REBALANCE_IN_PROGRESS, unknown member → UNKNOWN_MEMBER_ID, wrong
   generation → ILLEGAL_GENERATION. Commits are allowed in PreparingRebalance (consumers commit
   while revoking partitions).
10. The generation never decreases; a member is in at most one of: pending, parked join, parked sync.
11. Static membership (``group_instance_id``): such a member never gets MEMBER_ID_REQUIRED; joining
    with an empty member id while another member holds the instance id removes that member (its
    parked requests get FENCED_INSTANCE_ID) and adds the new one, which rebalances the group; a
    member id that does not hold the instance id it names gets FENCED_INSTANCE_ID.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from broker.protocol.kafka_codes import ErrorCode

__all__ = [
    "Effects",
    "Group",
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "JoinMember",
    "JoinResult",
    "Member",
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
    initial_rebalance_delay_ms: int = 0
    max_offset_metadata_bytes: int = 4096


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
class Effects:
    """Answers owed to parked requests, in the order they became due."""

    joins: list[tuple[str, JoinResult]] = field(default_factory=list)
    syncs: list[tuple[str, SyncResult]] = field(default_factory=list)

    def extend(self, other: Effects) -> None:
        self.joins.extend(other.joins)
        self.syncs.extend(other.syncs)


class Group:
    """The membership state of one group. Not thread-safe; one event loop drives it."""

    def __init__(self, group_id: str, settings: GroupSettings | None = None) -> None:
        self.group_id = group_id
        self.settings = settings or GroupSettings()
        self.state = GroupState.EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.pending: dict[str, float] = {}  # member id handed out with MEMBER_ID_REQUIRED -> deadline
        self.rebalance_deadline: float | None = None
        self.join_not_before: float | None = None

    # ------------------------------------------------------------------ JoinGroup

    def join(
        self,
        now: float,
        *,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        new_member_id: str,
    ) -> tuple[JoinResult | None, str, Effects]:
        """Handle a JoinGroup. Returns (immediate answer or None if parked, member id, effects).

        When the answer is None the member's JoinGroup is parked; its answer arrives in these or
        later effects. ``new_member_id`` is used when the request carries an empty member id.
        """
        effects = Effects()
        if self.state is GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id), member_id, effects
        s = self.settings
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id), member_id, effects
        if not self._supports(member_id, protocol_type, protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id), member_id, effects

        if group_instance_id:
            holder = next(
                (m.member_id for m in self.members.values() if m.group_instance_id == group_instance_id), None
            )
            if member_id == "" and holder is not None:
                # A static member restarted: the new incarnation replaces (fences) the old one. The old
                # one is dropped without a transition of its own; adding the new one rebalances once.
                old = self._drop(holder)
                if old.awaiting_join:
                    effects.joins.append((holder, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=holder)))
                if old.awaiting_sync:
                    effects.syncs.append((holder, SyncResult(ErrorCode.FENCED_INSTANCE_ID)))
            elif member_id and holder is not None and holder != member_id:
                return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=member_id), member_id, effects
            require_known_member_id = False  # the instance id identifies a static member
        if member_id == "" and require_known_member_id:
            self.pending[new_member_id] = now + session_timeout_ms / 1000.0
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_member_id), new_member_id, effects
        if member_id == "" or member_id in self.pending:
            mid = member_id or new_member_id
            self.pending.pop(mid, None)
            member = Member(
                member_id=mid,
                group_instance_id=group_instance_id,
                client_id=client_id,
                client_host=client_host,
                protocol_type=protocol_type,
                protocols=list(protocols),
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                session_deadline=now + session_timeout_ms / 1000.0,
                awaiting_join=True,
            )
            self._add_member(now, member, effects)
            return None, mid, effects

        existing = self.members.get(member_id)
        if existing is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id), member_id, effects
        member = existing
        changed = member.protocols != list(protocols)
        member.protocols = list(protocols)
        member.protocol_type = protocol_type
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id = client_id
        member.client_host = client_host
        member.touch(now)

        if self.state is GroupState.PREPARING_REBALANCE:
            self._park_join(member, effects)
            self._try_complete_join(now, effects)
            return None, member_id, effects
        if self.state is GroupState.COMPLETING_REBALANCE and not changed:
            # The member lost our JoinGroup answer: repeat it.
            return self._join_answer(member), member_id, effects
        if self.state is GroupState.STABLE and not changed and member_id != self.leader_id:
            return self._join_answer(member), member_id, effects
        # Leader rejoining, changed protocols, or a rejoin during CompletingRebalance with changes.
        self._park_join(member, effects)
        self._prepare_rebalance(now, effects)
        self._try_complete_join(now, effects)
        return None, member_id, effects

    # ------------------------------------------------------------------ SyncGroup

    def sync(
        self, now: float, generation_id: int, member_id: str, assignments: dict[str, bytes]
    ) -> tuple[SyncResult | None, Effects]:
        """Handle a SyncGroup. Returns (immediate answer or None if parked, effects)."""
        effects = Effects()
        if self.state is GroupState.DEAD:
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE), effects
        member = self.members.get(member_id)
        if member is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID), effects
        if generation_id != self.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION), effects
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), effects
        member.touch(now)
        if self.state is GroupState.STABLE:
            return self._sync_answer(member), effects
        # CompletingRebalance. A repeated SyncGroup replaces a parked one (the coordinator answers
        # the old request).
        member.awaiting_sync = True
        if member_id == self.leader_id:
            for mid, m in self.members.items():
                m.assignment = assignments.get(mid, b"")
            self.state = GroupState.STABLE
            for mid, m in self.members.items():
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    m.touch(now)
                    effects.syncs.append((mid, self._sync_answer(m)))
        return None, effects

    # ------------------------------------------------------------------ Heartbeat, LeaveGroup

    def heartbeat(self, now: float, generation_id: int, member_id: str) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._touch_member(now, generation_id, member_id)
        if error is ErrorCode.NONE and self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return error

    def leave(self, now: float, member_ids: Sequence[str]) -> tuple[dict[str, ErrorCode], Effects]:
        effects = Effects()
        errors: dict[str, ErrorCode] = {}
        for mid in member_ids:
            if mid in self.pending:
                del self.pending[mid]
                errors[mid] = ErrorCode.NONE
                self._try_complete_join(now, effects)
            elif mid in self.members:
                self._remove_member(now, mid, effects)
                errors[mid] = ErrorCode.NONE
            else:
                errors[mid] = ErrorCode.UNKNOWN_MEMBER_ID
        return errors, effects

    # ------------------------------------------------------------------ offsets, time, description

    def validate_commit(self, now: float, generation_id: int, member_id: str) -> ErrorCode:
        """Rule 9: may this (generation, member) commit offsets now?"""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return self._touch_member(now, generation_id, member_id)

    def _touch_member(self, now: float, generation_id: int, member_id: str) -> ErrorCode:
        """A known member of the current generation is alive as of ``now``; otherwise its error."""
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.touch(now)
        return ErrorCode.NONE

    def tick(self, now: float) -> Effects:
        """Expire pending ids and silent members, and complete a rebalance whose time has come."""
        effects = Effects()
        for mid, deadline in list(self.pending.items()):
            if deadline <= now:
                del self.pending[mid]
        for mid, member in list(self.members.items()):
            if mid not in self.members:
                continue
            if member.awaiting_join or member.awaiting_sync:
                continue
            if member.session_deadline <= now:
                self._remove_member(now, mid, effects)
        self._try_complete_join(now, effects)
        return effects

    def next_deadline(self) -> float | None:
        """The earliest time at which ``tick`` may change something (None: nothing scheduled)."""
        times = list(self.pending.values())
        times += [m.session_deadline for m in self.members.values() if not (m.awaiting_join or m.awaiting_sync)]
        if self.state is GroupState.PREPARING_REBALANCE:
            if self.rebalance_deadline is not None:
                times.append(self.rebalance_deadline)
            if self.join_not_before is not None:
                times.append(self.join_not_before)
        return min(times, default=None)

    def describe(self) -> GroupDescription:
        stable = self.state is GroupState.STABLE
        members = [
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                metadata=m.metadata_for(self.protocol_name) if stable else b"",
                assignment=m.assignment if stable else b"",
            )
            for m in self.members.values()
        ]
        return GroupDescription(
            group_id=self.group_id,
            state=self.state.value,
            protocol_type=self.protocol_type or "",
            protocol_name=(self.protocol_name or "") if stable else "",
            members=members,
        )

    def mark_dead(self) -> None:
        """DeleteGroups on a group without members: nothing may use this object any more."""
        assert not self.members, "only a group without members can be deleted"
        self.pending.clear()
        self.state = GroupState.DEAD

    def fail_all(self, error: ErrorCode) -> Effects:
        """Answer every parked request with ``error`` (coordinator shutting down)."""
        effects = Effects()
        for mid, m in self.members.items():
            if m.awaiting_join:
                m.awaiting_join = False
                effects.joins.append((mid, JoinResult(error, member_id=mid)))
            if m.awaiting_sync:
                m.awaiting_sync = False
                effects.syncs.append((mid, SyncResult(error)))
        return effects

    # ------------------------------------------------------------------ internals

    def _supports(self, member_id: str, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        names = {name for name, _ in protocols}
        if not protocol_type or not names:
            return False
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        for m in others:
            names &= {name for name, _ in m.protocols}
        return bool(names)

    def _add_member(self, now: float, member: Member, effects: Effects) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id
        if self.state is GroupState.PREPARING_REBALANCE and self.join_not_before is not None:
            delay = self.settings.initial_rebalance_delay_ms / 1000.0
            limit = self.rebalance_deadline if self.rebalance_deadline is not None else now + delay
            self.join_not_before = min(now + delay, limit)
        self._prepare_rebalance(now, effects)
        self._try_complete_join(now, effects)

    def _park_join(self, member: Member, effects: Effects) -> None:
        # A repeated JoinGroup replaces a parked one (the coordinator answers the old request).
        if member.awaiting_sync:
            member.awaiting_sync = False
            effects.syncs.append((member.member_id, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)))
        member.awaiting_join = True

    def _prepare_rebalance(self, now: float, effects: Effects) -> None:
        if self.state is GroupState.PREPARING_REBALANCE:
            return
        if self.state is GroupState.COMPLETING_REBALANCE:
            for mid, m in self.members.items():
                m.assignment = b""
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    m.touch(now)  # its session clock restarts when its parked request is answered
                    effects.syncs.append((mid, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)))
        was_empty = self.state is GroupState.EMPTY
        self.state = GroupState.PREPARING_REBALANCE
        timeout_ms = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline = now + timeout_ms / 1000.0
        delay_ms = self.settings.initial_rebalance_delay_ms
        if was_empty and delay_ms > 0:
            self.join_not_before = min(now + delay_ms / 1000.0, self.rebalance_deadline)
        else:
            self.join_not_before = None

    def _try_complete_join(self, now: float, effects: Effects) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        all_joined = not self.pending and all(m.awaiting_join for m in self.members.values())
        if self.join_not_before is not None and now >= self.join_not_before:
            self.join_not_before = None
        delay_over = self.join_not_before is None
        timed_out = self.rebalance_deadline is not None and now >= self.rebalance_deadline
        if (all_joined and delay_over) or timed_out or not self.members:
            self._complete_join(now, effects)

    def _complete_join(self, now: float, effects: Effects) -> None:
        for mid, m in list(self.members.items()):
            if not m.awaiting_join:
                self._drop(mid)
        self.generation_id += 1
        self.rebalance_deadline = None
        self.join_not_before = None
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol_name = None
            return
        self.protocol_name = self._select_protocol()
        self.state = GroupState.COMPLETING_REBALANCE
        for m in self.members.values():
            m.awaiting_join = False
            m.assignment = b""
            m.touch(now)
            effects.joins.append((m.member_id, self._join_answer(m)))

    def _join_answer(self, member: Member) -> JoinResult:
        members: list[JoinMember] = []
        if member.member_id == self.leader_id:
            members = [
                JoinMember(m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            ]
        return JoinResult(
            error_code=ErrorCode.NONE,
            generation_id=self.generation_id,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader_id=self.leader_id or "",
            member_id=member.member_id,
            members=members,
        )

    def _sync_answer(self, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    def _select_protocol(self) -> str:
        members = list(self.members.values())
        candidates = {name for name, _ in members[0].protocols}
        for m in members[1:]:
            candidates &= {name for name, _ in m.protocols}
        votes: dict[str, int] = {}
        for m in members:
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader_id or "", members[0])
        order = [name for name, _ in leader.protocols if name in candidates]
        best = max(votes.values())
        return next(name for name in order if votes.get(name, 0) == best)

    def _drop(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def _remove_member(self, now: float, member_id: str, effects: Effects) -> None:
        member = self._drop(member_id)
        if member.awaiting_join:
            effects.joins.append((member_id, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)))
        if member.awaiting_sync:
            effects.syncs.append((member_id, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)))
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now, effects)
        self._try_complete_join(now, effects)
