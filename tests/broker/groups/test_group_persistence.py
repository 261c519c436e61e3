"""Group metadata survives a coordinator restart (Kafka's GroupMetadata records in __consumer_offsets):
the record codec (Kafka's GroupMetadataValue v0-v3), the durable store (latest record per group,
kept by compaction, dropped by DeleteGroups, old data directories without records still open), and
the coordinator restored on the same directory with a fake clock: members keep generation and
assignment, a member that does not come back expires after its session timeout, an Empty group
comes back Empty, and a failed write answers as Kafka's storeGroup callback does."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from broker.groups import (
    CommittedOffset,
    DurableOffsetStore,
    FakeClock,
    GroupCoordinator,
    GroupSettings,
    MemoryOffsetStore,
    OffsetStoreError,
)
from broker.groups.group_records import (
    GroupMetadataRecord,
    MemberRecord,
    decode_group_metadata,
    encode_group_metadata,
)
from broker.groups.offsets import SNAPSHOT_NAME, encode_commit
from broker.protocol.kafka_codes import ErrorCode
from tests.broker.groups.test_coordinator import (
    GROUP,
    REBALANCE_MS,
    SESSION_MS,
    SUB,
    assignment_for,
    form_group,
    join,
    settle,
    start_join,
    static_join,
)
from tests.broker.groups.test_offsets import plain

MEMBER = MemberRecord("m-1", "inst-1", "client", "/10.0.0.1", 30_000, 10_000, b"sub", b"assign")
RECORD = GroupMetadataRecord("consumer", 7, "range", "m-1", 1_700_000_000_000, (MEMBER,))


def _s(value: str | None) -> bytes:
    return struct.pack(">h", -1) if value is None else struct.pack(">h", len(value)) + value.encode()


def _b(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def test_codec_round_trip_and_kafkas_version_3_layout() -> None:
    data = encode_group_metadata(RECORD)
    assert decode_group_metadata(data) == RECORD
    expected = (struct.pack(">h", 3) + _s("consumer") + struct.pack(">i", 7) + _s("range") + _s("m-1")
                + struct.pack(">q", 1_700_000_000_000) + struct.pack(">i", 1)
                + _s("m-1") + _s("inst-1") + _s("client") + _s("/10.0.0.1") + struct.pack(">ii", 30_000, 10_000)
                + _b(b"sub") + _b(b"assign"))
    assert data == expected
    empty = GroupMetadataRecord("consumer", 8, None, None, 5, ())
    assert decode_group_metadata(encode_group_metadata(empty)) == empty


def test_older_versions_decode() -> None:
    # v0: no rebalance timeout (the session timeout stands in), no timestamp, no instance id
    v0 = (struct.pack(">h", 0) + _s("consumer") + struct.pack(">i", 2) + _s("range") + _s("a") + struct.pack(">i", 1)
          + _s("a") + _s("c") + _s("h") + struct.pack(">i", 9_000) + _b(b"s") + _b(b"x"))
    assert decode_group_metadata(v0) == GroupMetadataRecord(
        "consumer", 2, "range", "a", -1, (MemberRecord("a", None, "c", "h", 9_000, 9_000, b"s", b"x"),))
    v2 = (struct.pack(">h", 2) + _s("consumer") + struct.pack(">i", 2) + _s(None) + _s(None) + struct.pack(">q", 4)
          + struct.pack(">i", 0))
    assert decode_group_metadata(v2) == GroupMetadataRecord("consumer", 2, None, None, 4, ())


@pytest.mark.parametrize("data", [
    b"", struct.pack(">h", 4), struct.pack(">h", -1),
    encode_group_metadata(RECORD)[:-1], encode_group_metadata(RECORD) + b"\x00",
    encode_group_metadata(GroupMetadataRecord("consumer", 1, "range", "nobody", 0, (MEMBER,))),
])
def test_damaged_records_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_group_metadata(data)


# ---------------------------------------------------------------------- durable store


async def reopen(path: Path, **kw: int) -> DurableOffsetStore:
    store = DurableOffsetStore(path, **kw)
    await store.open()
    return store


async def test_latest_record_per_group_survives_restart_and_compaction(tmp_path: Path) -> None:
    store = await reopen(tmp_path, compact_bytes=1)  # every write compacts into the snapshot
    await store.store_group("a", RECORD)
    newer = GroupMetadataRecord("consumer", 8, None, None, 9, ())
    await store.store_group("a", newer)
    await store.store_group("b", RECORD)
    await store.commit("b", {("t", 0): CommittedOffset(5, None)})
    await store.delete_group("b")  # DeleteGroups: offsets and metadata go
    await store.close()
    assert len(list(tmp_path.glob("offsets-*.log"))) == 1, "compaction folded the writes into the snapshot"
    again = await reopen(tmp_path)
    assert again.group_metadata() == {"a": newer}
    assert plain(again.fetch("b")) == {}
    await again.close()


async def test_records_in_the_log_replay_without_a_snapshot_covering_them(tmp_path: Path) -> None:
    store = await reopen(tmp_path)
    await store.store_group("a", RECORD)
    await store.commit("a", {("t", 0): CommittedOffset(1, "m")})
    # no close: the process dies; the log holds the records
    again = await reopen(tmp_path)
    assert again.group_metadata() == {"a": RECORD} and plain(again.fetch("a")) == {("t", 0): (1, "m")}
    await again.close()
    await store.close()


async def test_a_data_directory_from_before_group_records_opens(tmp_path: Path) -> None:
    """A version-1 snapshot and a log of commits only (what older Sluice wrote)."""
    def frame(payload: bytes) -> bytes:
        import crc32c
        return struct.pack(">II", len(payload), crc32c.crc32c(payload)) + payload
    commit = encode_commit("old", {("t", 0): CommittedOffset(3, None)})
    snapshot = struct.pack(">8sHQ", b"SLUICEOF", 1, 4) + frame(commit) + frame(b"\x03" + struct.pack(">I", 1))
    (tmp_path / SNAPSHOT_NAME).write_bytes(snapshot)
    (tmp_path / "offsets-000000000005.log").write_bytes(frame(encode_commit("old", {("t", 1): CommittedOffset(4, "")})))
    store = await reopen(tmp_path)
    assert plain(store.fetch("old")) == {("t", 0): (3, None), ("t", 1): (4, "")}
    assert store.group_metadata() == {}
    await store.close()
    coord = GroupCoordinator(DurableOffsetStore(tmp_path), FakeClock(), tick_interval_s=3600)
    await coord.start()
    assert coord.list_groups() == [("old", "", "Empty")]
    await coord.stop()


# ---------------------------------------------------------------------- coordinator restart


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def start(path: Path, clock: FakeClock) -> GroupCoordinator:
    coord = GroupCoordinator(DurableOffsetStore(path), clock, tick_interval_s=3600)
    await coord.start()
    return coord


@pytest.fixture
async def coords(tmp_path: Path, clock: FakeClock) -> AsyncIterator[list[GroupCoordinator]]:
    made: list[GroupCoordinator] = []
    yield made
    for c in made:
        await c.stop()


async def test_members_keep_generation_and_assignment_across_a_restart(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    a, b, c = await form_group(first, 3)
    gen = a.generation_id
    before = first.describe(GROUP)
    # kill -9: the first coordinator is never stopped; its acknowledged writes are on disk
    clock.advance(5)
    coords.append(second := await start(tmp_path, clock))
    after = second.describe(GROUP)
    assert after == before and after.state == "Stable"
    assert second.list_groups() == [(GROUP, "consumer", "Stable")]
    # a and b go on heartbeating with the generation they had; c never comes back
    for _ in range(3):
        clock.advance(SESSION_MS / 1000 / 3)
        assert second.heartbeat(GROUP, gen, a.member_id) == ErrorCode.NONE
        assert second.heartbeat(GROUP, gen, b.member_id) == ErrorCode.NONE
        second.check_timeouts()
    codes = await second.commit_offsets(GROUP, gen, a.member_id, {("t", 0): (10, None)})
    assert codes == {("t", 0): ErrorCode.NONE}
    assert second.describe(GROUP).state == "PreparingRebalance", "c's session ran out (counted from the load)"
    assert second.heartbeat(GROUP, gen, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    tb = start_join(second, b.member_id)
    await settle()
    a2 = await join(second, a.member_id)
    assert a2.generation_id == (await tb).generation_id == gen + 1
    assert {m.member_id for m in a2.members} == {a.member_id, b.member_id}


async def test_the_sync_answer_waits_for_the_stored_assignment(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    r = await join(first)
    s = await first.sync(GROUP, r.generation_id, r.member_id, {r.member_id: assignment_for(0)})
    assert s.error_code == ErrorCode.NONE
    stored = first.offsets.group_metadata()[GROUP]
    assert (stored.generation_id, stored.leader_id, stored.protocol_name) == (r.generation_id, r.member_id, "range")
    assert [(m.member_id, m.subscription, m.assignment, m.session_timeout_ms, m.rebalance_timeout_ms)
            for m in stored.members] == [(r.member_id, SUB, assignment_for(0), SESSION_MS, REBALANCE_MS)]


async def test_a_group_in_a_rebalance_comes_back_as_its_last_stored_generation(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    a, b = await form_group(first, 2)
    assert (await first.leave(GROUP, [b.member_id])) == {b.member_id: ErrorCode.NONE}
    assert first.describe(GROUP).state == "PreparingRebalance"
    coords.append(second := await start(tmp_path, clock))
    d = second.describe(GROUP)
    assert d.state == "Stable" and {m.member_id for m in d.members} == {a.member_id, b.member_id}
    assert second.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.NONE


async def test_an_empty_group_comes_back_empty_with_its_generation_and_offsets(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    a, b = await form_group(first, 2)
    await first.commit_offsets(GROUP, a.generation_id, a.member_id, {("t", 0): (3, "x")})
    await first.leave(GROUP, [a.member_id, b.member_id])
    await first.stop()
    coords.remove(first)
    coords.append(second := await start(tmp_path, clock))
    assert second.describe(GROUP).state == "Empty"
    assert second.list_groups() == [(GROUP, "consumer", "Empty")]
    assert second.fetch_offsets(GROUP, None) == {("t", 0): (3, "x")}
    r = await join(second)
    assert r.generation_id == a.generation_id + 2, "the generation goes on from the stored Empty one"
    assert (await second.delete_groups([GROUP])) == {GROUP: ErrorCode.NON_EMPTY_GROUP}


async def test_a_deleted_group_stays_deleted(tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    a, = await form_group(first, 1)
    await first.leave(GROUP, [a.member_id])
    assert await first.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
    coords.append(second := await start(tmp_path, clock))
    assert second.list_groups() == [] and second.describe(GROUP).state == "Dead"


async def test_a_swapped_static_member_is_stored(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    coords.append(first := await start(tmp_path, clock))
    a = await static_join(first, "", "instance-a")
    await first.sync(GROUP, a.generation_id, a.member_id, {a.member_id: assignment_for(0, 1)})
    a2 = await static_join(first, "", "instance-a")
    assert a2.error_code == ErrorCode.NONE and a2.generation_id == a.generation_id
    coords.append(second := await start(tmp_path, clock))
    assert second.heartbeat(GROUP, a.generation_id, a2.member_id) == ErrorCode.NONE
    assert second.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    s = await second.sync(GROUP, a.generation_id, a2.member_id, {})
    assert s.assignment == assignment_for(0, 1)


class FailingGroupWrites(DurableOffsetStore):
    """Offsets are stored; group metadata writes fail once ``fail`` is set (a full disk, say)."""

    fail = False

    async def store_group(self, group_id: str, record: GroupMetadataRecord) -> None:
        if self.fail:
            raise OffsetStoreError("disk full")
        await super().store_group(group_id, record)


async def test_a_failed_assignment_write_fails_the_syncs_and_rebalances(tmp_path: Path, clock: FakeClock) -> None:
    store = FailingGroupWrites(tmp_path)
    coord = GroupCoordinator(store, clock, tick_interval_s=3600)
    await coord.start()
    try:
        a = await join(coord)
        tb = start_join(coord, client_id="b")
        await settle()
        a = await join(coord, a.member_id)
        b = await tb
        store.fail = True
        plan: Mapping[str, bytes] = {a.member_id: assignment_for(0), b.member_id: assignment_for(1)}
        sb = asyncio.ensure_future(coord.sync(GROUP, b.generation_id, b.member_id, {}))
        sa = await coord.sync(GROUP, a.generation_id, a.member_id, dict(plan))
        assert sa.error_code == (await sb).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert coord.describe(GROUP).state == "PreparingRebalance"
        assert coord.metadata_write_failures == 1
        store.fail = False
        ta = start_join(coord, a.member_id)
        await settle()
        assert (await join(coord, b.member_id)).generation_id == (await ta).generation_id == a.generation_id + 1
    finally:
        await coord.stop()


async def test_a_failed_static_swap_write_keeps_the_old_member(tmp_path: Path, clock: FakeClock) -> None:
    store = FailingGroupWrites(tmp_path)
    coord = GroupCoordinator(store, clock, tick_interval_s=3600)
    await coord.start()
    try:
        a = await static_join(coord, "", "instance-a")
        await coord.sync(GROUP, a.generation_id, a.member_id, {a.member_id: assignment_for(0)})
        store.fail = True
        a2 = await static_join(coord, "", "instance-a")
        assert a2.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE and a2.member_id == ""
        assert coord.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.NONE, "the old id holds the slot"
        assert [m.member_id for m in coord.describe(GROUP).members] == [a.member_id]
    finally:
        await coord.stop()


async def test_empty_groups_without_offsets_are_removed_with_their_metadata(
        tmp_path: Path, clock: FakeClock, coords: list[GroupCoordinator]) -> None:
    """Kafka's periodic cleanup: an Empty group without committed offsets goes (tombstoned); one with
    offsets, or with members, stays."""
    coords.append(first := await start(tmp_path, clock))
    a, = await form_group(first, 1)
    await first.leave(GROUP, [a.member_id])  # Empty, no offsets
    await first.commit_offsets("kept", -1, "", {("t", 0): (1, None)})  # Empty, with offsets
    r = await first.join("busy", "", None, "consumer", [("range", SUB)], SESSION_MS, REBALANCE_MS, "c", "h", False)
    await first.sync("busy", r.generation_id, r.member_id, {})
    assert await first.remove_empty_groups() == [GROUP]
    assert [g for g, _, _ in first.list_groups()] == ["busy", "kept"]
    coords.append(second := await start(tmp_path, clock))
    assert [g for g, _, _ in second.list_groups()] == ["busy", "kept"]
    assert GROUP not in second.offsets.group_metadata()


async def test_the_background_task_removes_empty_groups_every_interval() -> None:
    coord = GroupCoordinator(MemoryOffsetStore(), settings=GroupSettings(empty_group_check_interval_ms=50),
                             tick_interval_s=0.01)
    await coord.start()
    try:
        r = await join(coord)
        await coord.leave(GROUP, [r.member_id])
        deadline = asyncio.get_running_loop().time() + 30
        while coord.list_groups():
            assert asyncio.get_running_loop().time() < deadline, "the Empty group was never removed"
            await asyncio.sleep(0.01)
    finally:
        await coord.stop()


@pytest.mark.parametrize("durable", [False, True])
async def test_a_32_kib_client_id_makes_a_member_id_that_fits_and_is_stored(
        tmp_path: Path, clock: FakeClock, durable: bool) -> None:
    """The client id in a request header may have 32 767 bytes; Kafka's ``<client id>-<uuid>`` would
    not fit a Kafka string any more (no JoinGroup answer or group record could carry it): the client
    id is cut. Before, the durable store's encoder raised inside the write task and the SyncGroup was
    never answered."""
    store = DurableOffsetStore(tmp_path) if durable else MemoryOffsetStore()
    coord = GroupCoordinator(store, clock, tick_interval_s=3600)
    await coord.start()
    try:
        r = await join(coord, client_id="é" * 16_383)
        assert len(r.member_id.encode()) <= 0x7FFF and r.member_id.startswith("é" * 16_000)
        s = await asyncio.wait_for(coord.sync(GROUP, r.generation_id, r.member_id, {r.member_id: b"a"}), 10)
        assert s.error_code == ErrorCode.NONE and s.assignment == b"a"
        assert [m.member_id for m in store.group_metadata()[GROUP].members] == [r.member_id]
    finally:
        await coord.stop()


class RefusingGroupRecords(MemoryOffsetStore):
    """A store that finds every group record too large for Kafka's format (the codec's ValueError)."""

    async def store_group(self, group_id: str, record: GroupMetadataRecord) -> None:
        raise ValueError("a string of 40000 bytes does not fit a group metadata record")


async def test_a_record_the_format_cannot_hold_fails_the_sync_with_unknown_server_error(clock: FakeClock) -> None:
    """As Kafka's storeGroup answers a record too large; the SyncGroup is answered, never left waiting."""
    coord = GroupCoordinator(RefusingGroupRecords(), clock, tick_interval_s=3600)
    await coord.start()
    try:
        r = await join(coord)
        s = await asyncio.wait_for(coord.sync(GROUP, r.generation_id, r.member_id, {}), 10)
        assert s.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and coord.metadata_write_failures == 1
    finally:
        await coord.stop()


async def test_the_memory_store_refuses_what_the_durable_store_cannot_encode() -> None:
    long_member = MemberRecord("m" * 40_000, None, "c", "h", 1, 1, b"", b"")
    with pytest.raises(ValueError):
        await MemoryOffsetStore().store_group("g", GroupMetadataRecord("consumer", 1, "range", "m" * 40_000, 0,
                                                                       (long_member,)))


@pytest.mark.parametrize("durable", [False, True])
async def test_a_group_record_larger_than_kafkas_message_limit_fails_the_sync(
        tmp_path: Path, clock: FakeClock, durable: bool) -> None:
    """Members' subscriptions and assignments of 600 KB each: the group's record (1.2 MB) would not fit
    Kafka's message.max.bytes, and Kafka's storeGroup answers UNKNOWN_SERVER_ERROR. Before, any size
    was stored (and read back at every start); a later small assignment is stored as usual."""
    store = DurableOffsetStore(tmp_path) if durable else MemoryOffsetStore()
    coord = GroupCoordinator(store, clock, tick_interval_s=3600)
    await coord.start()
    try:
        r = await join(coord, protocols=[("range", b"s" * 600_000)])
        s = await asyncio.wait_for(coord.sync(GROUP, r.generation_id, r.member_id, {r.member_id: b"a" * 600_000}), 10)
        assert s.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and coord.metadata_write_failures == 1
        assert GROUP not in store.group_metadata()
        r = await join(coord, r.member_id)  # the default subscription: a few bytes
        s = await asyncio.wait_for(coord.sync(GROUP, r.generation_id, r.member_id, {r.member_id: b"a"}), 10)
        assert s.error_code == ErrorCode.NONE and store.group_metadata()[GROUP].generation_id == r.generation_id
    finally:
        await coord.stop()
