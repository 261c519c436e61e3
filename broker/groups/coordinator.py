"""The group coordinator: every consumer group of this broker, their committed offsets, and time.

The Kafka front calls one method per request (JoinGroup → ``join``, SyncGroup → ``sync``, …) and
encodes the result; nothing here knows about sockets or framing. The per-group rules live in
``broker.groups.group`` (a sans-IO state machine); this module parks JoinGroup/SyncGroup requests
on asyncio futures until the group answers them, validates and stores offset commits, and drives
timeouts: ``check_timeouts(now)`` expires silent members, pending member ids and overdue
rebalances. ``start()`` runs it every ``tick_interval_s`` on the injected clock (the real monotonic
clock by default); tests pass a ``FakeClock``, advance it and call ``check_timeouts()`` themselves.

Group metadata is stored beside the offsets when the group asks for it (rule 13 of group.py:
a generation's assignment, an Empty group, a static member's swap), in the order asked, one write
after the other per group; ``start()`` restores every stored group (group_records.restore_group),
so a broker restart keeps each group's generation, members and assignments, and members that go on
heartbeating carry on without a rebalance, as with Kafka's coordinator loading ``__consumer_offsets``.
Every ``settings.empty_group_check_interval_ms`` (Kafka's ``cleanupGroupMetadata``) the committed
offsets that expired (``settings.offsets_retention_ms``, the rules of expiry.py) are removed from the
store, then every Empty group without committed offsets is deleted with its metadata, so groups
nobody uses do not pile up in the store. Commit and expiry times are wall-clock milliseconds
(``wall_clock``, ``time.time`` by default): they are stored and count across restarts. A deleted
topic's offsets go from every group at once (``forget_topic``, Kafka's ``handleDeletedPartitions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TypeVar

from broker.groups.clock import Clock, MonotonicClock
from broker.groups.errors import OffsetStoreError
from broker.groups.expiry import expired_offsets
from broker.groups.group import (
    Effects,
    Group,
    GroupDescription,
    GroupSettings,
    GroupState,
    JoinResult,
    StoreGroup,
    SyncResult,
)
from broker.groups.group_records import GroupMetadataRecord, record_of, restore_group
from broker.groups.offset_deletion import offset_deletion
from broker.groups.offsets import CommittedOffset, OffsetStore, TopicPartition
from broker.protocol.kafka_codes import ErrorCode

__all__ = ["GroupCoordinator"]

log = logging.getLogger(__name__)

_Key = tuple[str, str]  # (group id, member id)
_T = TypeVar("_T")
_MAX_TIMESTAMP_MS = 2**63 - 1
_MAX_STRING_BYTES = 0x7FFF  # a Kafka string (JoinGroup's member id, the group record's fields)


def _member_id(client_id: str) -> str:
    """``<client id>-<uuid>`` as Kafka makes it, with the client id cut so the id stays a Kafka
    string: a 32 KiB client id (allowed in the request header) would make an id no JoinGroup answer
    or group record can carry."""
    suffix = f"-{uuid.uuid4()}"
    prefix = client_id.encode()[: _MAX_STRING_BYTES - len(suffix)].decode(errors="ignore")
    return prefix + suffix


class GroupCoordinator:
    def __init__(
        self,
        offsets: OffsetStore,
        clock: Clock | None = None,
        *,
        settings: GroupSettings | None = None,
        tick_interval_s: float = 0.1,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.offsets = offsets
        self.clock: Clock = clock or MonotonicClock()
        self.wall_clock = wall_clock  # seconds since the epoch: commit times, when groups became Empty
        self.settings = settings or GroupSettings()
        self.tick_interval_s = tick_interval_s
        self._groups: dict[str, Group] = {}
        self._join_waiters: dict[_Key, asyncio.Future[JoinResult]] = {}
        self._sync_waiters: dict[_Key, asyncio.Future[SyncResult]] = {}
        self._task: asyncio.Task[None] | None = None
        self._writes: dict[str, asyncio.Task[ErrorCode]] = {}  # the latest metadata write of each group
        self.metadata_write_failures = 0
        self.offsets_expired = 0  # committed offsets removed by expiry (/metrics)
        self._empty_since_ms: dict[str, int] = {}  # Kafka's currentStateTimestamp of Empty groups
        self._pending_commits: dict[str, Counter[TopicPartition]] = {}  # commits being written
        self._topic_removals: set[asyncio.Task[None]] = set()  # offsets of deleted topics being removed

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the offset store, restore the stored groups and start the timeout task."""
        await self.offsets.open()
        now = self.clock.monotonic()
        for group_id, record in self.offsets.group_metadata().items():
            self._groups[group_id] = group = restore_group(group_id, record, self.settings, now)
            if group.state is GroupState.EMPTY and record.current_state_timestamp_ms >= 0:
                self._empty_since_ms[group_id] = record.current_state_timestamp_ms
            log.info("group restored", extra={"group": group_id, "state": group.state.value,
                                              "generation": group.generation_id, "members": len(group.members)})
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-coordinator-timeouts")

    async def stop(self) -> None:
        """Stop the timeout task, answer parked requests with COORDINATOR_NOT_AVAILABLE, close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for group in self._groups.values():
            self._deliver(group.group_id, group.fail_all(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        await asyncio.gather(*self._writes.values(), *self._topic_removals, return_exceptions=True)
        await self.offsets.close()

    async def _run(self) -> None:
        next_cleanup = self.clock.monotonic() + self.settings.empty_group_check_interval_ms / 1000
        while True:
            await asyncio.sleep(self.tick_interval_s)
            try:
                self.check_timeouts()
                if self.clock.monotonic() >= next_cleanup:
                    next_cleanup = self.clock.monotonic() + self.settings.empty_group_check_interval_ms / 1000
                    await self.cleanup_groups()
            except Exception:  # keep the coordinator alive; the next tick retries
                log.exception("group timeout check failed")

    def _wall_ms(self) -> int:
        return int(self.wall_clock() * 1000)

    async def cleanup_groups(self) -> tuple[int, list[str]]:
        """One round of Kafka's ``cleanupGroupMetadata``: remove expired offsets, then delete Empty
        groups without offsets. Returns (offsets expired, groups deleted)."""
        expired = await self.expire_offsets()
        return expired, await self.remove_empty_groups()

    async def expire_offsets(self) -> int:
        """Remove every committed offset that has expired (expiry.py) from the store; returns how many."""
        removed = 0
        groups = 0
        for group_id in sorted(set(self._groups) | set(self.offsets.groups())):  # (checked again after each await)
            # No await between reading the offsets and appending the removal: a commit arriving
            # later is written after it; one being written now is pending and kept (rule 6).
            gone = expired_offsets(
                self._groups.get(group_id), self.offsets.fetch(group_id), now_ms=self._wall_ms(),
                retention_ms=self.settings.offsets_retention_ms, empty_since_ms=self._empty_since_ms.get(group_id),
                pending=self._pending_commits.get(group_id, Counter()))
            if not gone:
                continue
            try:
                await self.offsets.remove_offsets(group_id, gone)
            except OffsetStoreError as exc:
                log.error("expired offsets not removed", extra={"group": group_id, "error": str(exc)})
                continue
            removed += len(gone)
            groups += 1
        if removed:
            self.offsets_expired += removed
            log.info("expired offsets removed", extra={"offsets": removed, "groups": groups,
                                                       "retention_ms": self.settings.offsets_retention_ms})
        return removed

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: its committed offsets go from every group at once (Kafka's
        ``handleDeletedPartitions``), then the groups that leaves Empty without offsets. Synchronous
        (a LogStore deletion listener): the removal is written by a task; ``stop`` waits for it."""
        task = asyncio.get_running_loop().create_task(self._remove_topic_offsets(topic), name=f"forget-topic-{topic}")
        self._topic_removals.add(task)
        task.add_done_callback(self._topic_removals.discard)

    async def _remove_topic_offsets(self, topic: str) -> None:
        removed = 0
        for group_id in self.offsets.groups():
            gone = [tp for tp in self.offsets.fetch(group_id) if tp[0] == topic]
            if not gone:
                continue
            try:
                await self.offsets.remove_offsets(group_id, gone)
            except OffsetStoreError as exc:
                log.error("offsets of a deleted topic not removed", extra={"group": group_id, "topic": topic,
                                                                           "error": str(exc)})
                continue
            removed += len(gone)
        if removed:
            log.info("offsets of a deleted topic removed", extra={"topic": topic, "offsets": removed})
            await self.remove_empty_groups()

    async def remove_empty_groups(self) -> list[str]:
        """Delete every Empty group without committed offsets (and its stored metadata), as Kafka's
        periodic cleanup does; returns their ids."""
        removed = []
        for group_id, group in list(self._groups.items()):  # (checked again after each await)
            empty = (group.state is GroupState.EMPTY and not self.offsets.fetch(group_id)
                     and group_id not in self._pending_commits)
            if empty and await self._forget(group_id, group) == ErrorCode.NONE:
                removed.append(group_id)
        if removed:
            log.info("empty groups removed", extra={"groups": removed})
        return removed

    def check_timeouts(self, now: float | None = None) -> None:
        """Expire members, pending member ids and rebalances whose time has passed."""
        if now is None:
            now = self.clock.monotonic()
        for group in list(self._groups.values()):
            self._tick_group(group, now)

    def _tick_group(self, group: Group, now: float | None = None) -> None:
        """One group's timeouts that have passed, applied now. The periodic task does this up to a tick
        late; the requests that report or act on a group's membership (DescribeGroups, ListGroups,
        DeleteGroups) call it first, so their answers hold as of the request, as Kafka's per-member
        timers do (librdkafka's test 0081 deletes a group the moment its static member's session ends)."""
        before = set(group.members)
        effects = group.tick(self.clock.monotonic() if now is None else now)
        gone = before - set(group.members)
        if gone:
            log.info(
                "group members expired",
                extra={"group": group.group_id, "members": sorted(gone), "generation": group.generation_id},
            )
        self._deliver(group.group_id, effects)

    tick = check_timeouts

    # ------------------------------------------------------------------ membership

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
    ) -> JoinResult:
        """JoinGroup; waits until the rebalance completes. ``rebalance_timeout_ms`` <= 0 (JoinGroup v0)
        means the session timeout."""
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=member_id)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        group = self._group(group_id)
        if member_id:
            # A repeated JoinGroup replaces a parked one; the old request is answered now.
            self._resolve(
                self._join_waiters,
                (group_id, member_id),
                JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member_id),
            )
        answer, mid, effects = group.join(
            self.clock.monotonic(),
            member_id=member_id,
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocols=protocols,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            client_id=client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
            new_member_id=_member_id(client_id),
        )
        if answer is not None:
            write = self._deliver(group_id, effects)
            if write is not None:  # a static member's swap is answered once it is stored (rule 13c)
                code = await asyncio.shield(write)
                if code != ErrorCode.NONE:
                    return JoinResult(code, generation_id=group.generation_id, protocol_type=group.protocol_type,
                                      protocol_name=group.protocol_name, leader_id=answer.leader_id)
            return answer
        # Register before delivering: the effects may already hold this member's answer.
        key = (group_id, mid)
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        self._join_waiters[key] = future
        self._deliver(group_id, effects)
        try:
            return await future
        finally:
            if self._join_waiters.get(key) is future:
                del self._join_waiters[key]

    async def sync(
        self, group_id: str, generation_id: int, member_id: str, assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> SyncResult:
        """SyncGroup; a follower waits here for the leader's assignment."""
        if not group_id:  # as Kafka's validateGroupStatus for the membership APIs
            return SyncResult(ErrorCode.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        key = (group_id, member_id)
        # A repeated SyncGroup replaces a parked one; the old request is answered now.
        self._resolve(self._sync_waiters, key, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        answer, effects = group.sync(self.clock.monotonic(), generation_id, member_id, assignments, group_instance_id)
        if answer is not None:
            self._deliver(group_id, effects)
            return answer
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        self._sync_waiters[key] = future
        self._deliver(group_id, effects)
        try:
            return await future
        finally:
            if self._sync_waiters.get(key) is future:
                del self._sync_waiters[key]

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None
                  ) -> ErrorCode:
        if not group_id:  # as Kafka's validateGroupStatus for the membership APIs
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return group.heartbeat(self.clock.monotonic(), generation_id, member_id, group_instance_id)

    async def leave(self, group_id: str, member_ids: list[str]) -> dict[str, ErrorCode]:
        """Members named by member id leave (LeaveGroup v0-v2); each id's code."""
        _, codes = await self.leave_members(group_id, [(mid, None) for mid in member_ids])
        return dict(zip(member_ids, codes, strict=True))

    async def leave_members(
        self, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """LeaveGroup v3+ (group rule 14): (top-level code, one code per (member id, instance id)).

        As Kafka's ``handleLeaveGroup``: an empty group id is INVALID_GROUP_ID with no member codes;
        a group nobody has joined answers UNKNOWN_MEMBER_ID for every member."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        codes, effects = group.leave_members(self.clock.monotonic(), leaving)
        self._deliver(group_id, effects)
        left = [f"{mid or '-'}/{instance or '-'}" for (mid, instance), code in zip(leaving, codes, strict=True)
                if code == ErrorCode.NONE]
        if left:
            log.info("group members left", extra={"group": group_id, "members": left})
        return ErrorCode.NONE, codes

    # ------------------------------------------------------------------ offsets

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        offsets: Mapping[tuple[str, int], tuple[int, str | None]],
        group_instance_id: str | None = None,
        retention_time_ms: int = -1,
    ) -> dict[tuple[str, int], ErrorCode]:
        """OffsetCommit. Returns once accepted offsets are stored (durably, with a durable store).
        Whether each partition exists is the caller's check (Kafka makes it before the coordinator).
        ``retention_time_ms`` (OffsetCommit v2-v4; -1 = the broker's retention) gives each offset an
        expire time, commit time + retention, as Kafka does (expiry.py rule 1)."""
        if not offsets:
            return {}
        # An empty group id is a group like any other here, as in Kafka ("for backwards compatibility,
        # we support offset commits for the empty groupId"); only the membership APIs refuse it.
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return dict.fromkeys(offsets, ErrorCode.ILLEGAL_GENERATION)
            group = self._group(group_id)
        error = group.validate_commit(self.clock.monotonic(), generation_id, member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return dict.fromkeys(offsets, error)
        result: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        limit = self.settings.max_offset_metadata_bytes
        now_ms = self._wall_ms()
        # Held within [0, int64 max]: a huge retention would overflow the stored i64 (Kafka's long sum
        # wraps negative, expiring it at once); a very negative one is an expire time in the past, as in
        # Kafka, not -1 (which the store reads as "no expire time").
        expire_ms = -1 if retention_time_ms == -1 else max(0, min(now_ms + retention_time_ms, _MAX_TIMESTAMP_MS))
        for tp, (offset, metadata) in offsets.items():
            if metadata is not None and len(metadata.encode()) > limit:
                result[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = CommittedOffset(offset, metadata, now_ms, expire_ms)
                result[tp] = ErrorCode.NONE
        if accepted:
            pending = self._pending_commits.setdefault(group_id, Counter())
            pending.update(accepted.keys())
            try:
                await self.offsets.commit(group_id, accepted)
            except OffsetStoreError as exc:
                log.error("offset commit failed", extra={"group": group_id, "error": str(exc)})
                for tp in accepted:
                    result[tp] = ErrorCode.COORDINATOR_NOT_AVAILABLE
            finally:
                pending.subtract(accepted.keys())
                if not +pending:
                    self._pending_commits.pop(group_id, None)
        return result

    def fetch_offsets(
        self, group_id: str, partitions: list[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[int, str | None]]:
        """OffsetFetch: committed (offset, metadata); a partition without a commit is (-1, "")."""
        stored = self.offsets.fetch(group_id, partitions)
        if partitions is None:
            return {tp: (c.offset, c.metadata) for tp, c in stored.items()}
        return {tp: (stored[tp].offset, stored[tp].metadata) if tp in stored else (-1, "") for tp in partitions}

    def commits_in_flight(self, group_id: str) -> set[TopicPartition]:
        """Partitions whose OffsetCommit is being written (accepted, not yet stored)."""
        return {tp for tp, count in self._pending_commits.get(group_id, Counter()).items() if count > 0}

    async def delete_offsets(
        self, group_id: str, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete (offset_deletion.py's rules): (group error, code per partition asked for).
        An Empty group left without offsets is then deleted, as Kafka's cleanup does."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, {}
        group = self._groups.get(group_id)
        stored = self.offsets.fetch(group_id)
        decision = offset_deletion(group, bool(stored) or group_id in self._pending_commits, partitions)
        if decision.error != ErrorCode.NONE:
            return decision.error, {}
        gone = [tp for tp in decision.removable if tp in stored]
        if gone:
            try:
                await self.offsets.remove_offsets(group_id, gone)
            except OffsetStoreError as exc:
                log.error("offsets not deleted", extra={"group": group_id, "error": str(exc)})
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
            log.info("offsets deleted", extra={"group": group_id, "offsets": len(gone)})
        group = self._groups.get(group_id)
        if (group is not None and group.state is GroupState.EMPTY and not self.offsets.fetch(group_id)
                and group_id not in self._pending_commits):
            await self._forget(group_id, group)
        return ErrorCode.NONE, {**dict.fromkeys(decision.removable, ErrorCode.NONE), **decision.refused}

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: forget groups without members and their committed offsets (Kafka's checks: an
        unknown group → GROUP_ID_NOT_FOUND, members → NON_EMPTY_GROUP; the empty id is a group like any
        other, as Kafka keeps it deletable for backwards compatibility)."""
        result: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if group is not None:
                self._tick_group(group)
            if group is not None and group.members:
                result[group_id] = ErrorCode.NON_EMPTY_GROUP
                continue
            if group is None and not self.offsets.fetch(group_id):
                result[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
                continue
            result[group_id] = await self._forget(group_id, group)
            if result[group_id] == ErrorCode.NONE:
                log.info("group deleted", extra={"group": group_id})
        return result

    async def _forget(self, group_id: str, group: Group | None) -> ErrorCode:
        """Delete a group without members: its state machine, committed offsets and stored metadata."""
        if group is not None:
            # Dead before the first await: a JoinGroup arriving meanwhile starts a fresh group.
            group.mark_dead()
            self._groups.pop(group_id, None)
            self._empty_since_ms.pop(group_id, None)
        write = self._writes.get(group_id)
        if write is not None:  # the delete must come after the group's last metadata write
            await asyncio.gather(write, return_exceptions=True)
        try:
            await self.offsets.delete_group(group_id)
        except OffsetStoreError as exc:
            log.error("group delete failed", extra={"group": group_id, "error": str(exc)})
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    # ------------------------------------------------------------------ description

    def describe(self, group_id: str) -> GroupDescription:
        group = self._groups.get(group_id)
        if group is None:
            state = GroupState.EMPTY if self.offsets.fetch(group_id) else GroupState.DEAD
            return GroupDescription(group_id, state.value, "", "", [])
        self._tick_group(group)
        return group.describe()

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group with members or committed offsets."""
        self.check_timeouts()
        rows = {gid: (gid, g.protocol_type or "", g.state.value) for gid, g in self._groups.items()}
        for gid in self.offsets.groups():
            rows.setdefault(gid, (gid, "", GroupState.EMPTY.value))
        return [rows[gid] for gid in sorted(rows)]

    def group(self, group_id: str) -> Group | None:
        """The live state machine of a group (tests and tooling; do not mutate)."""
        return self._groups.get(group_id)

    # ------------------------------------------------------------------ internals

    def _group(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id, self.settings)
        return group

    def _deliver(self, group_id: str, effects: Effects) -> asyncio.Task[ErrorCode] | None:
        """Answer the parked requests ``effects`` names; start the metadata write it asks for."""
        done = [r for _, r in effects.joins if r.error_code == ErrorCode.NONE]
        if done:
            log.info(
                "group rebalanced",
                extra={
                    "group": group_id,
                    "generation": done[0].generation_id,
                    "members": len(done),
                    "protocol": done[0].protocol_name,
                    "leader": done[0].leader_id,
                },
            )
        for mid, join_result in effects.joins:
            self._resolve(self._join_waiters, (group_id, mid), join_result)
        for mid, sync_result in effects.syncs:
            self._resolve(self._sync_waiters, (group_id, mid), sync_result)
        group = self._groups.get(group_id)
        if effects.store is None or group is None:
            return None
        # The record is taken now, in the state the group asked in; the writes of a group queue up.
        record = record_of(group, effects.store, self._wall_ms())
        if group.state is GroupState.EMPTY:  # rule 13b: it has just become Empty
            self._empty_since_ms[group_id] = record.current_state_timestamp_ms
        previous = self._writes.get(group_id)
        write = asyncio.get_running_loop().create_task(
            self._store_group(group, effects.store, record, previous), name=f"group-metadata-{group_id}")
        self._writes[group_id] = write
        write.add_done_callback(self._forget_write)
        return write

    def _forget_write(self, write: asyncio.Task[ErrorCode]) -> None:
        for group_id, latest in list(self._writes.items()):
            if latest is write:
                del self._writes[group_id]

    async def _store_group(self, group: Group, store: StoreGroup, record: GroupMetadataRecord,
                           previous: asyncio.Task[ErrorCode] | None) -> ErrorCode:
        """Write one metadata record, then tell the group (rule 13). Returns the error code of the write."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        code = ErrorCode.NONE
        context = {"group": group.group_id, "why": store.why, "generation": store.generation_id}
        try:
            await self.offsets.store_group(group.group_id, record)
        except OffsetStoreError as exc:  # the disk: as Kafka's failed appends, COORDINATOR_NOT_AVAILABLE
            self.metadata_write_failures += 1
            log.error("group metadata write failed", extra={**context, "error": str(exc)})
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        except ValueError as exc:  # the members' data does not fit Kafka's record (Kafka: a record too large)
            self.metadata_write_failures += 1
            log.warning("group metadata refused", extra={**context, "error": str(exc)})
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        now = self.clock.monotonic()
        if store.why == "assignment":
            stored = group.assignment_stored(now, store.generation_id, dict(store.assignments), code)
            self._deliver(group.group_id, stored)
        elif store.why == "static-member" and code != ErrorCode.NONE and store.replaced is not None:
            new_id = next((m.member_id for m in group.members.values()
                           if m.group_instance_id == store.replaced.group_instance_id), "")
            group.revert_static(now, new_id, store.replaced)
        return code

    @staticmethod
    def _resolve(waiters: dict[_Key, asyncio.Future[_T]], key: _Key, result: _T) -> None:
        future = waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)
