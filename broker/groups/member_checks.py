"""The checks of a consumer group's requests that never change its state: Heartbeat, the member
checks of OffsetCommit and TxnOffsetCommit, and Kafka's ``validateCurrentMember``.

``MemberChecks`` is a base of ``Group`` (group.py, which owns the state machine and its other rules);
it only reads the group's state, generation and members, and restarts a member's session clock.
The rules keep their numbers from group.py's header:

7. Heartbeat: unknown member → UNKNOWN_MEMBER_ID; wrong generation → ILLEGAL_GENERATION;
   PreparingRebalance → REBALANCE_IN_PROGRESS; otherwise NONE. Heartbeats, JoinGroup, SyncGroup and
   accepted commits push the member's session deadline to now + session timeout.
9. Offset commits, checked in Kafka's order (``validateOffsetCommit``): Dead → COORDINATOR_NOT_AVAILABLE;
   generation < 0 on an Empty group is a standalone commit (no membership); with a generation >= 0,
   a member id or an instance id: the instance id must be held (UNKNOWN_MEMBER_ID) by this member
   (FENCED_INSTANCE_ID), the member must exist (UNKNOWN_MEMBER_ID), the generation must be the current
   one (ILLEGAL_GENERATION); with none of them a non-Empty group answers UNKNOWN_MEMBER_ID; only then
   CompletingRebalance → REBALANCE_IN_PROGRESS. Commits are allowed in PreparingRebalance (consumers
   commit while revoking partitions).
12. TxnOffsetCommit (Kafka's validateOffsetCommit with isTransactional, KIP-447): the member checks
    of rule 9 in its order when the request names a generation >= 0, a member id or an instance id
    (v3 does: a producer whose consumer lost its partitions is refused, and aborts); without them
    (v0-v2) the offsets are accepted whatever the state. CompletingRebalance refuses nothing here and
    no session restarts (a transaction's commit is no sign of life of the consumer).
15. Heartbeat and SyncGroup v3+ name the instance id too, and are checked as Kafka checks them
    (``validateCurrentMember``) before the generation: an old incarnation of a static member gets
    FENCED_INSTANCE_ID (clients stop: librdkafka raises a fatal error), not UNKNOWN_MEMBER_ID (which
    would make it join again and fence the new incarnation in turn).
"""

from __future__ import annotations

from broker.groups.answers import GroupState
from broker.groups.member import Member
from broker.protocol.kafka_codes import ErrorCode

__all__ = ["MemberChecks"]


class MemberChecks:
    """The read-only checks of rules 7, 9, 12 and 15; ``Group`` supplies the attributes below."""

    state: GroupState
    generation_id: int
    members: dict[str, Member]

    def heartbeat(self, now: float, generation_id: int, member_id: str, group_instance_id: str | None = None
                  ) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._current_member_error(member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return error
        error = self._touch_member(now, generation_id, member_id)
        if error is ErrorCode.NONE and self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return error

    def validate_commit(
        self, now: float, generation_id: int, member_id: str, group_instance_id: str | None = None
    ) -> ErrorCode:
        """Rule 9: may this (generation, member) commit offsets now? (A member's session restarts.)"""
        error = self.validate_txn_commit(generation_id, member_id, group_instance_id)
        if error != ErrorCode.NONE or (generation_id < 0 and self.state is GroupState.EMPTY):
            return error
        if generation_id >= 0 or member_id or group_instance_id:
            self.members[member_id].touch(now)
        elif self.state is not GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def validate_txn_commit(self, generation_id: int, member_id: str, group_instance_id: str | None = None
                            ) -> ErrorCode:
        """Rule 12: may a TxnOffsetCommit naming this (generation, member, instance) add offsets?"""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if generation_id >= 0 or member_id or group_instance_id:
            error = self._current_member_error(member_id, group_instance_id)
            if error != ErrorCode.NONE:
                return error
            if generation_id != self.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def _touch_member(self, now: float, generation_id: int, member_id: str) -> ErrorCode:
        """A known member of the current generation is alive as of ``now``; otherwise its error."""
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.touch(now)
        return ErrorCode.NONE

    def _current_member_error(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's ``validateCurrentMember`` (rule 15): an instance id, if given, must be held
        (UNKNOWN_MEMBER_ID) by this member id (FENCED_INSTANCE_ID); the member id must be a member."""
        if group_instance_id:
            holder = self._instance_holder(group_instance_id)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        return ErrorCode.NONE if member_id in self.members else ErrorCode.UNKNOWN_MEMBER_ID

    def _instance_holder(self, group_instance_id: str) -> str | None:
        return next((m.member_id for m in self.members.values() if m.group_instance_id == group_instance_id), None)
