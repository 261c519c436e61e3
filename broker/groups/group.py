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
   The initial rebalance (Kafka's ``group.initial.rebalance.delay.ms``, ``InitialDelayedJoin``):
   leaving Empty for PreparingRebalance does not complete when everyone has joined; it waits one
   delay window D instead, with ``remaining`` = max(rebalance timeout - D, 0). At the end of a window
   in which a new member joined, and while ``remaining`` != 0, another window of min(D, remaining)
   follows (``remaining`` -= the window that ended); otherwise the join completes. A member leaving
   or expiring still completes it at once when every remaining member has joined (as Kafka's
   removeMember does). With D = 0 the first rebalance is an ordinary one.
6. SyncGroup: unknown member → UNKNOWN_MEMBER_ID; wrong generation → ILLEGAL_GENERATION; during
   PreparingRebalance → REBALANCE_IN_PROGRESS; during CompletingRebalance the request is parked until
   the leader's SyncGroup stores the assignments (members it left out get empty bytes), which makes
   the group Stable and answers every parked SyncGroup with the member's own assignment; in Stable
   the member's assignment is returned at once.
8. A member whose session deadline passes is removed as if it had left, unless it has a parked
   JoinGroup or SyncGroup (the rebalance deadline or the leader's sync governs those); answering a
   parked request restarts the member's session clock. Removing a member with a parked request
   answers it with UNKNOWN_MEMBER_ID.
10. The generation never decreases; a member is in at most one of: pending, parked join, parked sync.
11. Static membership (``group_instance_id``): such a member never gets MEMBER_ID_REQUIRED. Joining
    with an empty member id while another member holds the instance id (a restarted process) swaps
    the new member id in place of the old one, keeping its assignment and leadership (Kafka's
    ``replaceStaticMember``); the old id's parked requests get FENCED_INSTANCE_ID and the old id is
    unknown from then on. In Stable, when the protocol the group would select does not change, the
    join is answered at once with the current generation, no member list and the leader id as it was
    before the swap (so the new id never acts as leader), and the member's SyncGroup returns its
    existing assignment: no rebalance. In CompletingRebalance the swap rebalances (the leader may
    have assigned to the old id); in PreparingRebalance the new id simply joins the rebalance.
    A non-empty member id naming an instance id nobody holds gets UNKNOWN_MEMBER_ID; one that does
    not hold the instance id it names gets FENCED_INSTANCE_ID.
13. Persistence (Kafka's ``storeGroup``): the group asks its coordinator to write its metadata
    (``Effects.store``) at three points, and nowhere else. (a) The leader's SyncGroup in
    CompletingRebalance parks the leader too and asks to store the generation with its assignments;
    the group stays CompletingRebalance until ``assignment_stored`` reports the write: then rule 6's
    Stable transition happens; a failed write answers the parked SyncGroups with its error, clears
    the assignments and rebalances; a report for another generation or state changes nothing.
    (b) A completed join that leaves the group Empty stores it Empty (its generation, no members).
    (c) A static member swapped in Stable (rule 11) stores the swap before its JoinGroup is
    answered; a failed write swaps the old member back (``revert_static``). A group restored from
    its last record (group_records.restore_group) is Stable with that generation, or Empty.
14. LeaveGroup (Kafka's ``handleLeaveGroup``), per member in request order: an empty member id with an
    instance id removes the static member holding that instance id (an admin's
    ``removeMembersFromConsumerGroup``; nobody holds it: UNKNOWN_MEMBER_ID); a pending member id is
    dropped; otherwise the instance id, if given, must be held (UNKNOWN_MEMBER_ID) by this member id
    (FENCED_INSTANCE_ID), and the member id must be a member (UNKNOWN_MEMBER_ID). A member removed
    is handled as one whose session expired (rule 8's removal: rebalance, or Empty).
Rules 7, 9, 12 and 15 (Heartbeat, the member checks of offset commits, ``validateCurrentMember``:
checks that never change the group's state) live with their code in member_checks.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from broker.groups.answers import (
    GroupDescription,
    GroupSettings,
    GroupState,
    JoinMember,
    JoinResult,
    MemberDescription,
    SyncResult,
)
from broker.groups.member import Effects, InitialDelay, Member, StoreGroup
from broker.groups.member_checks import MemberChecks
from broker.protocol.kafka_codes import ErrorCode

__all__ = [
    "Effects",
    "Group",
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "InitialDelay",
    "JoinMember",
    "JoinResult",
    "Member",
    "MemberDescription",
    "StoreGroup",
    "SyncResult",
]


class Group(MemberChecks):
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
        self.rebalance_deadline: float | None = None  # ordinary rebalances only
        self.initial: InitialDelay | None = None  # the first rebalance after Empty (rule 5)

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
            holder = self._instance_holder(group_instance_id)
            if member_id == "" and holder is not None:
                answer = self._replace_static(
                    now, holder, new_member_id, protocols, session_timeout_ms, rebalance_timeout_ms, effects
                )
                return answer, new_member_id, effects
            if member_id and member_id not in self.pending and holder != member_id:
                code = ErrorCode.UNKNOWN_MEMBER_ID if holder is None else ErrorCode.FENCED_INSTANCE_ID
                return JoinResult(code, member_id=member_id), member_id, effects
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
        self, now: float, generation_id: int, member_id: str, assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> tuple[SyncResult | None, Effects]:
        """Handle a SyncGroup. Returns (immediate answer or None if parked, effects)."""
        effects = Effects()
        if self.state is GroupState.DEAD:
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE), effects
        error = self._current_member_error(member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return SyncResult(error), effects
        member = self.members[member_id]
        if generation_id != self.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION), effects
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS), effects
        member.touch(now)
        if self.state is GroupState.STABLE:
            return self._sync_answer(member), effects
        # CompletingRebalance. A repeated SyncGroup replaces a parked one (the coordinator answers
        # the old request). The leader's assignment takes effect once it is stored (rule 13a).
        member.awaiting_sync = True
        if member_id == self.leader_id:
            plan = {mid: assignments.get(mid, b"") for mid in self.members}
            effects.store = StoreGroup("assignment", self.generation_id, plan)
        return None, effects

    def assignment_stored(
        self, now: float, generation_id: int, assignments: dict[str, bytes], error: ErrorCode
    ) -> Effects:
        """Rule 13a: the leader's assignment for ``generation_id`` was written (or failed to be)."""
        effects = Effects()
        if self.state is not GroupState.COMPLETING_REBALANCE or generation_id != self.generation_id:
            return effects
        if error != ErrorCode.NONE:
            for mid, m in self.members.items():
                m.assignment = b""
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    effects.syncs.append((mid, SyncResult(error)))
            self._prepare_rebalance(now, effects)
            self._try_complete_join(now, effects)
            return effects
        for mid, m in self.members.items():
            m.assignment = assignments.get(mid, b"")
        self.state = GroupState.STABLE
        for mid, m in self.members.items():
            if m.awaiting_sync:
                m.awaiting_sync = False
                m.touch(now)
                effects.syncs.append((mid, self._sync_answer(m)))
        return effects

    def revert_static(self, now: float, new_id: str, old: Member) -> None:
        """Rule 13c: the swap of ``old`` for ``new_id`` was not stored: ``old`` holds the instance again."""
        if self.state is not GroupState.STABLE or new_id not in self.members:
            return  # the group moved on (a rebalance, the new id left): nothing to undo
        back = replace(old, awaiting_join=False, awaiting_sync=False)
        back.touch(now)
        self.members = {old.member_id if mid == new_id else mid: (back if mid == new_id else m)
                        for mid, m in self.members.items()}
        if self.leader_id == new_id:
            self.leader_id = old.member_id

    # ------------------------------------------------------------------ LeaveGroup

    def leave(self, now: float, member_ids: Sequence[str]) -> tuple[dict[str, ErrorCode], Effects]:
        """LeaveGroup v0-v2 (and tests): members named by member id only."""
        codes, effects = self.leave_members(now, [(mid, None) for mid in member_ids])
        return dict(zip(member_ids, codes, strict=True)), effects

    def leave_members(
        self, now: float, leaving: Sequence[tuple[str, str | None]]
    ) -> tuple[list[ErrorCode], Effects]:
        """Rule 14: LeaveGroup v3+, each member as (member id, instance id); one code per entry."""
        effects = Effects()
        codes: list[ErrorCode] = []
        for mid, instance in leaving:
            if mid == "":
                holder = self._instance_holder(instance) if instance else None
                if holder is None:
                    codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                mid = holder
            elif mid in self.pending:
                del self.pending[mid]
                codes.append(ErrorCode.NONE)
                self._try_complete_join(now, effects, member_left=True)
                continue
            else:
                error = self._current_member_error(mid, instance)
                if error != ErrorCode.NONE:
                    codes.append(error)
                    continue
            self._remove_member(now, mid, effects)
            codes.append(ErrorCode.NONE)
        return codes, effects

    # ------------------------------------------------------------------ time, description

    def tick(self, now: float) -> Effects:
        """Expire pending ids and silent members, and complete a rebalance whose time has come."""
        effects = Effects()
        left = False
        for mid, deadline in list(self.pending.items()):
            if deadline <= now:
                del self.pending[mid]
                left = True
        for mid, member in list(self.members.items()):
            if mid not in self.members:
                continue
            if member.awaiting_join or member.awaiting_sync:
                continue
            if member.session_deadline <= now:
                self._remove_member(now, mid, effects)
        self._try_complete_join(now, effects, member_left=left)
        return effects

    def next_deadline(self) -> float | None:
        """The earliest time at which ``tick`` may change something (None: nothing scheduled)."""
        times = list(self.pending.values())
        times += [m.session_deadline for m in self.members.values() if not (m.awaiting_join or m.awaiting_sync)]
        if self.state is GroupState.PREPARING_REBALANCE:
            if self.rebalance_deadline is not None:
                times.append(self.rebalance_deadline)
            if self.initial is not None:
                times.append(self.initial.window_end)
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
        if self.initial is not None:
            self.initial.new_member_added = True
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
        delay_ms = self.settings.initial_rebalance_delay_ms
        if was_empty and delay_ms > 0:
            self.rebalance_deadline = None
            self.initial = InitialDelay(now + delay_ms / 1000.0, delay_ms, max(timeout_ms - delay_ms, 0))
        else:
            self.rebalance_deadline = now + timeout_ms / 1000.0
            self.initial = None

    def _try_complete_join(self, now: float, effects: Effects, *, member_left: bool = False) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        all_joined = not self.pending and all(m.awaiting_join for m in self.members.values())
        if not self.members or (member_left and all_joined):
            self._complete_join(now, effects)
        elif self.initial is not None:
            self._initial_window(now, effects)
        elif all_joined or (self.rebalance_deadline is not None and now >= self.rebalance_deadline):
            self._complete_join(now, effects)

    def _initial_window(self, now: float, effects: Effects) -> None:
        """Rule 5, initial rebalance: at the end of a window, extend it or complete the join."""
        initial = self.initial
        assert initial is not None
        if now < initial.window_end:
            return
        if initial.new_member_added and initial.remaining_ms != 0:
            delay_ms = min(self.settings.initial_rebalance_delay_ms, initial.remaining_ms)
            remaining_ms = max(initial.remaining_ms - initial.delay_ms, 0)
            self.initial = InitialDelay(now + delay_ms / 1000.0, delay_ms, remaining_ms)
            return
        self._complete_join(now, effects)

    def _complete_join(self, now: float, effects: Effects) -> None:
        for mid, m in list(self.members.items()):
            if not m.awaiting_join:
                self._drop(mid)
        self.generation_id += 1
        self.rebalance_deadline = None
        self.initial = None
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol_name = None
            effects.store = StoreGroup("empty", self.generation_id, {})  # rule 13b
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

    def _replace_static(
        self,
        now: float,
        old_id: str,
        new_id: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        effects: Effects,
    ) -> JoinResult | None:
        """Rule 11: a restarted static member takes ``new_id`` in place of ``old_id``. Returns the
        immediate answer (Stable, nothing to rebalance) or None when the new id's join is parked."""
        old = self.members[old_id]
        if old.awaiting_join:
            effects.joins.append((old_id, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old_id)))
        if old.awaiting_sync:
            effects.syncs.append((old_id, SyncResult(ErrorCode.FENCED_INSTANCE_ID)))
        previous_leader = self.leader_id
        member = replace(old, member_id=new_id, awaiting_join=False, awaiting_sync=False)
        self.members = {new_id if mid == old_id else mid: (member if mid == old_id else m)
                        for mid, m in self.members.items()}
        if self.leader_id == old_id:
            self.leader_id = new_id
        member.protocols = list(protocols)
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.touch(now)
        if self.state is GroupState.STABLE and self._select_protocol() == self.protocol_name:
            plan = {mid: m.assignment for mid, m in self.members.items()}
            effects.store = StoreGroup("static-member", self.generation_id, plan, replaced=old)  # rule 13c
            return JoinResult(
                error_code=ErrorCode.NONE,
                generation_id=self.generation_id,
                protocol_type=self.protocol_type,
                protocol_name=self.protocol_name,
                leader_id=previous_leader or "",
                member_id=new_id,
            )
        self._park_join(member, effects)
        self._prepare_rebalance(now, effects)
        self._try_complete_join(now, effects)
        return None

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
        else:
            self._try_complete_join(now, effects, member_left=True)
