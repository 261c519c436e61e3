"""Committed offsets expire as Kafka's do (offsets.retention.minutes; broker.groups.expiry's rules),
driven through the coordinator with a fake clock whose wall time moves with it: a standalone group's
offsets from each commit, a consumer group's only once it is Empty and counted from then, a Stable
consumer group's only for topics nobody subscribes to, an OffsetCommit retention time from the commit;
expired offsets are removed durably (a restart does not bring them back) and an Empty group left
without offsets is deleted with its metadata."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.groups import DurableOffsetStore, FakeClock, GroupCoordinator, GroupSettings, MemoryOffsetStore
from broker.groups.answers import GroupState
from broker.groups.expiry import expired_offsets
from broker.groups.group import Group
from broker.groups.offsets import CommittedOffset, OffsetStore
from broker.protocol.kafka_codes import ErrorCode
from tests.broker.groups.test_coordinator import GROUP, form_group, join, settle

RETENTION_MS = 60_000
SETTINGS = GroupSettings(offsets_retention_ms=RETENTION_MS)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def coords(clock: FakeClock) -> AsyncIterator[list[GroupCoordinator]]:
    made: list[GroupCoordinator] = []
    yield made
    for c in made:
        await c.stop()


async def start(store: OffsetStore, clock: FakeClock, coords: list[GroupCoordinator]) -> GroupCoordinator:
    coord = GroupCoordinator(store, clock, settings=SETTINGS, tick_interval_s=3600, wall_clock=clock.time)
    await coord.start()
    coords.append(coord)
    return coord


def committed(coord: GroupCoordinator, group_id: str = GROUP) -> dict[tuple[str, int], int]:
    return {tp: offset for tp, (offset, _) in coord.fetch_offsets(group_id, None).items()}


async def test_a_standalone_groups_offsets_expire_from_each_commit(
        clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coord = await start(MemoryOffsetStore(), clock, coords)
    assert await coord.commit_offsets("solo", -1, "", {("t", 0): (5, None)}) == {("t", 0): ErrorCode.NONE}
    clock.advance(40)
    await coord.commit_offsets("solo", -1, "", {("t", 1): (7, None)})
    clock.advance(19.9)
    assert await coord.cleanup_groups() == (0, [])
    clock.advance(0.1)  # t0 committed 60 s ago: expired (now - commit >= retention); t1 20 s ago
    assert await coord.cleanup_groups() == (1, [])
    assert committed(coord, "solo") == {("t", 1): 7}
    assert coord.fetch_offsets("solo", [("t", 0)]) == {("t", 0): (-1, "")}  # OffsetFetch answers -1
    clock.advance(40)
    assert await coord.cleanup_groups() == (1, ["solo"])  # its last offset gone: the Empty group goes too
    assert coord.list_groups() == [] and coord.offsets_expired == 2


async def test_a_consumer_group_keeps_its_offsets_while_stable_and_expires_them_once_empty(
        clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coord = await start(MemoryOffsetStore(), clock, coords)
    a, = await form_group(coord, 1)  # subscribes to topic "t"
    codes = await coord.commit_offsets(GROUP, a.generation_id, a.member_id, {("t", 0): (3, None), ("u", 0): (9, None)})
    assert set(codes.values()) == {ErrorCode.NONE}
    clock.advance(3600)  # an hour, Stable: the subscribed topic's offset stays however old
    assert coord.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.NONE
    assert await coord.cleanup_groups() == (1, [])  # KIP-496: "u", which nobody subscribes to, expires
    assert committed(coord) == {("t", 0): 3}
    await coord.leave(GROUP, [a.member_id])
    assert coord.describe(GROUP).state == GroupState.EMPTY.value
    clock.advance(59)  # the commit is an hour old, but the retention counts from when it became Empty
    assert await coord.cleanup_groups() == (0, [])
    clock.advance(1)
    assert await coord.cleanup_groups() == (1, [GROUP])
    assert coord.list_groups() == [] and GROUP not in coord.offsets.group_metadata()


async def test_an_offset_commit_retention_time_expires_it_from_the_commit(
        clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    """OffsetCommit v2-v4's retention_time_ms: expire time = commit time + retention, whatever the
    group's state and the broker's retention."""
    coord = await start(MemoryOffsetStore(), clock, coords)
    await coord.commit_offsets("solo", -1, "", {("t", 0): (1, None)}, retention_time_ms=5_000)
    await coord.commit_offsets("solo", -1, "", {("t", 1): (2, None)}, retention_time_ms=-1)
    clock.advance(4.999)
    assert await coord.cleanup_groups() == (0, [])
    clock.advance(0.001)
    assert await coord.cleanup_groups() == (1, [])
    assert committed(coord, "solo") == {("t", 1): 2}


async def test_expired_offsets_do_not_come_back_after_a_restart_and_the_empty_time_is_kept(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    first = await start(DurableOffsetStore(tmp_path), clock, coords)
    a, = await form_group(first, 1)
    await first.commit_offsets(GROUP, a.generation_id, a.member_id, {("t", 0): (3, None)})
    await first.commit_offsets("solo", -1, "", {("t", 0): (8, None)})
    clock.advance(20)
    await first.leave(GROUP, [a.member_id])
    await settle()  # the Empty group's record is written (Empty since 20 s after the commits)
    clock.advance(30)
    await first.commit_offsets("solo", -1, "", {("t", 1): (9, None)})
    await first.stop()
    coords.remove(first)
    second = await start(DurableOffsetStore(tmp_path), clock, coords)
    assert committed(second) == {("t", 0): 3}, "not expired yet: it survives the restart"
    clock.advance(20)  # 70 s after the commits, 50 s after the group became Empty
    assert await second.cleanup_groups() == (1, [])  # solo's t0
    assert committed(second) == {("t", 0): 3} and committed(second, "solo") == {("t", 1): 9}
    clock.advance(10)  # 60 s Empty, counted from before the restart
    assert await second.cleanup_groups() == (1, [GROUP])
    await second.stop()
    coords.remove(second)
    third = await start(DurableOffsetStore(tmp_path), clock, coords)
    assert committed(third) == {} and committed(third, "solo") == {("t", 1): 9}
    assert GROUP not in third.offsets.group_metadata() and [g for g, _, _ in third.list_groups()] == ["solo"]


class _HeldFsyncStore(DurableOffsetStore):
    """A durable store whose fsyncs wait while ``hold`` is clear (a slow disk)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.hold = threading.Event()
        self.hold.set()

    def _fsync(self, fd: int, dir_dirty: bool) -> None:
        assert self.hold.wait(30)
        super()._fsync(fd, dir_dirty)


async def test_an_offset_whose_new_commit_is_being_written_is_not_expired(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    """Kafka's pending offset commits: the removal would be logged after the new commit and erase it."""
    store = _HeldFsyncStore(tmp_path)
    coord = await start(store, clock, coords)
    await coord.commit_offsets("solo", -1, "", {("t", 0): (1, None)})
    clock.advance(RETENTION_MS / 1000)
    store.hold.clear()
    commit = asyncio.ensure_future(coord.commit_offsets("solo", -1, "", {("t", 0): (2, None)}))
    await settle()  # written, waiting for its fsync
    cleanup = asyncio.ensure_future(coord.cleanup_groups())
    await settle()
    store.hold.set()
    assert await asyncio.wait_for(commit, 30) == {("t", 0): ErrorCode.NONE}
    assert await asyncio.wait_for(cleanup, 30) == (0, [])
    assert committed(coord, "solo") == {("t", 0): 2}


def test_other_states_and_unreadable_subscriptions_keep_every_offset() -> None:
    old = {("t", 0): CommittedOffset(1, None, 0, -1), ("u", 0): CommittedOffset(1, None, 0, 5)}
    group = Group("g")
    group.protocol_type = "consumer"
    for state in (GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE):
        group.state = state
        assert expired_offsets(group, old, now_ms=10**12, retention_ms=1, empty_since_ms=0) == []
    group.protocol_type = "connect"  # Stable, but not the consumer protocol: Kafka keeps them all
    group.state = GroupState.STABLE
    assert expired_offsets(group, old, now_ms=10**12, retention_ms=1, empty_since_ms=None) == []
    group.state = GroupState.EMPTY  # Empty: every protocol type's offsets expire
    assert sorted(expired_offsets(group, old, now_ms=10**12, retention_ms=1, empty_since_ms=0)) == [("t", 0), ("u", 0)]


async def test_a_stable_group_with_an_unreadable_subscription_keeps_its_offsets(
        clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coord = await start(MemoryOffsetStore(), clock, coords)
    r = await join(coord, protocols=[("range", b"\x00")])  # not a ConsumerProtocolSubscription
    await coord.sync(GROUP, r.generation_id, r.member_id, {})
    await coord.commit_offsets(GROUP, r.generation_id, r.member_id, {("u", 0): (4, None)})
    clock.advance(3600)
    assert await coord.cleanup_groups() == (0, [])
    assert committed(coord) == {("u", 0): 4}


async def test_a_standalone_commit_being_written_keeps_its_new_group(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    """The first commit of a standalone group makes an Empty group whose offset is not in the store
    until its fsync: a cleanup round then must not delete the group (its delete record would follow
    the commit's and erase an acknowledged offset)."""
    store = _HeldFsyncStore(tmp_path)
    coord = await start(store, clock, coords)
    store.hold.clear()
    commit = asyncio.ensure_future(coord.commit_offsets("solo", -1, "", {("t", 0): (1, None)}))
    await settle()
    cleanup = asyncio.ensure_future(coord.cleanup_groups())
    await settle()
    store.hold.set()
    assert await asyncio.wait_for(commit, 30) == {("t", 0): ErrorCode.NONE}
    assert await asyncio.wait_for(cleanup, 30) == (0, [])
    assert committed(coord, "solo") == {("t", 0): 1}
