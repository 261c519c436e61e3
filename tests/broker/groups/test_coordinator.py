"""The group coordinator driven through its public contract, with a fake clock (no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypedDict, Unpack

import pytest

from broker.groups import (
    FakeClock,
    GroupCoordinator,
    GroupSettings,
    JoinResult,
    MemoryOffsetStore,
    SyncResult,
)
from broker.groups.assignment import ConsumerAssignment, decode_assignment, encode_assignment
from broker.protocol.kafka_codes import ErrorCode

GROUP = "g1"
SESSION_MS = 10_000
REBALANCE_MS = 30_000
SUB = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"  # subscription v0: ["t"], null user data


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def coord(clock: FakeClock) -> AsyncIterator[GroupCoordinator]:
    c = GroupCoordinator(MemoryOffsetStore(), clock, tick_interval_s=3600)
    await c.start()
    yield c
    await c.stop()


async def join(
    coord: GroupCoordinator,
    member_id: str = "",
    *,
    client_id: str = "client",
    protocols: list[tuple[str, bytes]] | None = None,
    require_known: bool = False,
    session_ms: int = SESSION_MS,
    rebalance_ms: int = REBALANCE_MS,
) -> JoinResult:
    return await coord.join(
        GROUP,
        member_id,
        None,
        "consumer",
        protocols if protocols is not None else [("range", SUB)],
        session_ms,
        rebalance_ms,
        client_id,
        "/127.0.0.1",
        require_known,
    )


class JoinOptions(TypedDict, total=False):
    """The keyword parameters of ``join``."""

    client_id: str
    protocols: list[tuple[str, bytes]] | None
    require_known: bool
    session_ms: int
    rebalance_ms: int


def start_join(coord: GroupCoordinator, member_id: str = "", **kw: Unpack[JoinOptions]) -> asyncio.Task[JoinResult]:
    return asyncio.ensure_future(join(coord, member_id, **kw))


async def settle() -> None:
    """Let every ready task run (no time passes: the clock is fake)."""
    for _ in range(5):
        await asyncio.sleep(0)


def assignment_for(*partitions: int) -> bytes:
    return encode_assignment(ConsumerAssignment(partitions=(("t", partitions),)))


async def test_single_member_join_sync_heartbeat(coord: GroupCoordinator) -> None:
    r = await join(coord, client_id="app")
    assert r.error_code == ErrorCode.NONE
    assert r.member_id.startswith("app-")
    assert r.generation_id == 1
    assert r.leader_id == r.member_id
    assert r.protocol_type == "consumer" and r.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in r.members] == [(r.member_id, SUB)]

    s = await coord.sync(GROUP, r.generation_id, r.member_id, {r.member_id: assignment_for(0, 1)})
    assert s == SyncResult(ErrorCode.NONE, "consumer", "range", assignment_for(0, 1))
    assert coord.heartbeat(GROUP, r.generation_id, r.member_id) == ErrorCode.NONE
    assert coord.heartbeat(GROUP, r.generation_id + 1, r.member_id) == ErrorCode.ILLEGAL_GENERATION
    assert coord.heartbeat(GROUP, r.generation_id, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat("other-group", 1, r.member_id) == ErrorCode.UNKNOWN_MEMBER_ID

    d = coord.describe(GROUP)
    assert d.state == "Stable" and d.protocol_name == "range"
    assert [(m.member_id, m.client_id, m.metadata, m.assignment) for m in d.members] == [
        (r.member_id, "app", SUB, assignment_for(0, 1))
    ]
    assert decode_assignment(d.members[0].assignment).topic_partitions() == [("t", 0), ("t", 1)]
    assert coord.list_groups() == [(GROUP, "consumer", "Stable")]


async def test_member_id_required_then_join(coord: GroupCoordinator) -> None:
    r = await join(coord, require_known=True)
    assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert r.member_id.startswith("client-")
    assert coord.describe(GROUP).members == []
    r2 = await join(coord, r.member_id, require_known=True)
    assert r2.error_code == ErrorCode.NONE and r2.member_id == r.member_id and r2.generation_id == 1


async def test_unknown_member_and_bad_session_timeout(coord: GroupCoordinator) -> None:
    assert (await join(coord, "ghost")).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert (await join(coord, session_ms=10)).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert (
        await coord.join("", "", None, "consumer", [("range", SUB)], SESSION_MS, REBALANCE_MS, "c", "h", False)
    ).error_code == ErrorCode.INVALID_GROUP_ID


async def test_inconsistent_protocols(coord: GroupCoordinator) -> None:
    a = await join(coord, protocols=[("range", SUB)])
    assert a.error_code == ErrorCode.NONE
    b = await join(coord, protocols=[("roundrobin", SUB)])
    assert b.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    wrong_type = await coord.join(
        GROUP, "", None, "connect", [("range", SUB)], SESSION_MS, REBALANCE_MS, "c", "h", False
    )
    assert wrong_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


async def test_protocol_chosen_among_common_ones(coord: GroupCoordinator) -> None:
    t1 = start_join(coord, protocols=[("cooperative-sticky", b"x"), ("range", b"r1")])
    await settle()
    first = t1.result()
    t2 = start_join(coord, protocols=[("range", b"r2"), ("roundrobin", b"rr")])
    await settle()
    t1b = start_join(coord, first.member_id, protocols=[("cooperative-sticky", b"x"), ("range", b"r1")])
    await settle()
    leader, follower = t1b.result(), t2.result()
    assert leader.protocol_name == follower.protocol_name == "range"
    assert sorted(m.metadata for m in leader.members) == [b"r1", b"r2"]
    assert follower.members == []


async def test_three_members_follower_sync_waits_for_leader(coord: GroupCoordinator, clock: FakeClock) -> None:
    a = await join(coord, client_id="a")
    await coord.sync(GROUP, a.generation_id, a.member_id, {a.member_id: assignment_for(0, 1, 2)})
    # Two more members arrive: the group rebalances; they wait until the leader rejoins.
    tb, tc = start_join(coord, client_id="b"), start_join(coord, client_id="c")
    await settle()
    assert not tb.done() and not tc.done()
    assert coord.describe(GROUP).state == "PreparingRebalance"
    assert coord.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    a2 = await join(coord, a.member_id, client_id="a")
    b, c = await tb, await tc
    assert a2.generation_id == b.generation_id == c.generation_id == a.generation_id + 1
    assert a2.leader_id == b.leader_id == c.leader_id == a.member_id
    assert {m.member_id for m in a2.members} == {a.member_id, b.member_id, c.member_id}
    assert b.members == [] and c.members == []

    gen = a2.generation_id
    sb = asyncio.ensure_future(coord.sync(GROUP, gen, b.member_id, {}))
    sc = asyncio.ensure_future(coord.sync(GROUP, gen, c.member_id, {}))
    await settle()
    assert not sb.done() and not sc.done(), "followers must wait for the leader's assignment"
    assert coord.describe(GROUP).state == "CompletingRebalance"
    plan = {a.member_id: assignment_for(0), b.member_id: assignment_for(1), c.member_id: assignment_for(2)}
    sa = await coord.sync(GROUP, gen, a.member_id, plan)
    assert sa.assignment == plan[a.member_id]
    assert (await sb).assignment == plan[b.member_id]
    assert (await sc).assignment == plan[c.member_id]
    assert coord.describe(GROUP).state == "Stable"
    # A sync with a stale generation is refused.
    stale = await coord.sync(GROUP, gen - 1, b.member_id, {})
    assert stale.error_code == ErrorCode.ILLEGAL_GENERATION


async def form_group(coord: GroupCoordinator, n: int) -> list[JoinResult]:
    """n members, Stable, partition i assigned to member i."""
    first = await join(coord, client_id="m0")
    tasks = [start_join(coord, client_id=f"m{i}") for i in range(1, n)]
    await settle()
    if tasks:
        first = await join(coord, first.member_id, client_id="m0")
    results = [first] + [await t for t in tasks]
    gen = results[0].generation_id
    plan = {r.member_id: assignment_for(i) for i, r in enumerate(results)}
    syncs = [asyncio.ensure_future(coord.sync(GROUP, gen, r.member_id, plan)) for r in results[1:]]
    await coord.sync(GROUP, gen, results[0].member_id, plan)
    for s in syncs:
        assert (await s).error_code == ErrorCode.NONE
    return results


async def test_silent_member_expires_and_others_rebalance(coord: GroupCoordinator, clock: FakeClock) -> None:
    a, b, c = await form_group(coord, 3)
    gen = a.generation_id
    # a and b keep heartbeating, c goes silent.
    for _ in range(3):
        clock.advance(SESSION_MS / 1000 / 3)
        assert coord.heartbeat(GROUP, gen, a.member_id) == ErrorCode.NONE
        assert coord.heartbeat(GROUP, gen, b.member_id) == ErrorCode.NONE
        coord.check_timeouts()
    clock.advance(0.001)
    coord.check_timeouts()
    d = coord.describe(GROUP)
    assert c.member_id not in {m.member_id for m in d.members}
    assert d.state == "PreparingRebalance"
    assert coord.heartbeat(GROUP, gen, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat(GROUP, gen, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat(GROUP, gen, c.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    tb = start_join(coord, b.member_id)
    await settle()
    assert not tb.done()
    a2 = await join(coord, a.member_id)
    b2 = await tb
    assert a2.generation_id == b2.generation_id == gen + 1
    assert {m.member_id for m in a2.members} == {a.member_id, b.member_id}


async def test_member_that_does_not_rejoin_is_dropped_at_rebalance_timeout(
    coord: GroupCoordinator, clock: FakeClock
) -> None:
    a, b = await form_group(coord, 2)
    await coord.leave(GROUP, [])  # no-op
    td = start_join(coord, client_id="d")
    await settle()
    ta = start_join(coord, a.member_id)
    await settle()
    assert not ta.done() and not td.done()
    # b keeps heartbeating (so its session never expires) but never rejoins.
    for _ in range(2 * REBALANCE_MS // SESSION_MS + 1):
        clock.advance(SESSION_MS / 1000 / 2)
        coord.heartbeat(GROUP, a.generation_id, b.member_id)
        coord.check_timeouts()
        await settle()
    a2, d2 = await ta, await td
    assert a2.error_code == d2.error_code == ErrorCode.NONE
    assert {m.member_id for m in a2.members} == {a.member_id, d2.member_id}
    assert coord.heartbeat(GROUP, a2.generation_id, b.member_id) == ErrorCode.UNKNOWN_MEMBER_ID


async def test_leave_group_triggers_rebalance(coord: GroupCoordinator) -> None:
    a, b = await form_group(coord, 2)
    assert await coord.leave(GROUP, [b.member_id, "ghost"]) == {
        b.member_id: ErrorCode.NONE,
        "ghost": ErrorCode.UNKNOWN_MEMBER_ID,
    }
    assert coord.heartbeat(GROUP, a.generation_id, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    a2 = await join(coord, a.member_id)
    assert a2.generation_id == a.generation_id + 1 and [m.member_id for m in a2.members] == [a.member_id]
    # The last member leaving empties the group.
    await coord.leave(GROUP, [a.member_id])
    d = coord.describe(GROUP)
    assert d.state == "Empty" and d.members == []


async def test_leader_leaving_hands_leadership_over(coord: GroupCoordinator) -> None:
    a, b = await form_group(coord, 2)
    await coord.leave(GROUP, [a.member_id])
    b2 = await join(coord, b.member_id)
    assert b2.leader_id == b.member_id and [m.member_id for m in b2.members] == [b.member_id]


async def test_follower_sync_fails_when_rebalance_starts(coord: GroupCoordinator) -> None:
    a = await join(coord)
    tb = start_join(coord)
    await settle()
    a2 = await join(coord, a.member_id)
    b = await tb
    sb = asyncio.ensure_future(coord.sync(GROUP, b.generation_id, b.member_id, {}))
    await settle()
    # A third member joins before the leader syncs: b's parked sync is answered REBALANCE_IN_PROGRESS.
    tc = start_join(coord)
    await settle()
    assert (await sb).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    ta = start_join(coord, a2.member_id)
    tb2 = start_join(coord, b.member_id)
    await settle()
    results = [await ta, await tb2, await tc]
    assert {r.generation_id for r in results} == {a2.generation_id + 1}


async def test_commit_and_fetch_offsets(coord: GroupCoordinator) -> None:
    a, b = await form_group(coord, 2)
    gen = a.generation_id
    res = await coord.commit_offsets(GROUP, gen, a.member_id, {("t", 0): (10, "m0"), ("t", 1): (20, None)})
    assert res == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE}
    assert coord.fetch_offsets(GROUP, [("t", 0), ("t", 1), ("t", 9)]) == {
        ("t", 0): (10, "m0"),
        ("t", 1): (20, None),
        ("t", 9): (-1, ""),
    }
    assert coord.fetch_offsets(GROUP, None) == {("t", 0): (10, "m0"), ("t", 1): (20, None)}
    # Stale generation, unknown member, standalone commit into a group with members: all refused.
    assert await coord.commit_offsets(GROUP, gen - 1, a.member_id, {("t", 0): (5, "")}) == {
        ("t", 0): ErrorCode.ILLEGAL_GENERATION
    }
    assert await coord.commit_offsets(GROUP, gen, "ghost", {("t", 0): (5, "")}) == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }
    assert await coord.commit_offsets(GROUP, -1, "", {("t", 0): (5, "")}) == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert coord.fetch_offsets(GROUP, [("t", 0)]) == {("t", 0): (10, "m0")}
    # Metadata too large is refused per partition.
    big = await coord.commit_offsets(GROUP, gen, b.member_id, {("t", 0): (11, "x" * 5000), ("t", 1): (21, "")})
    assert big == {("t", 0): ErrorCode.OFFSET_METADATA_TOO_LARGE, ("t", 1): ErrorCode.NONE}
    # During CompletingRebalance commits wait for the sync: REBALANCE_IN_PROGRESS.
    await coord.leave(GROUP, [b.member_id])
    a2 = await join(coord, a.member_id)
    assert await coord.commit_offsets(GROUP, a2.generation_id, a.member_id, {("t", 0): (12, "")}) == {
        ("t", 0): ErrorCode.REBALANCE_IN_PROGRESS
    }


async def test_commit_checks_member_and_generation_before_the_rebalance_state(coord: GroupCoordinator) -> None:
    """Kafka's validateOffsetCommit order: member, then generation, then CompletingRebalance."""
    a, b = await form_group(coord, 2)
    await coord.leave(GROUP, [b.member_id])
    a2 = await join(coord, a.member_id)
    assert coord.describe(GROUP).state == "CompletingRebalance"
    commit = {("t", 0): (12, "")}
    assert await coord.commit_offsets(GROUP, a.generation_id, a.member_id, commit) == {
        ("t", 0): ErrorCode.ILLEGAL_GENERATION
    }
    assert await coord.commit_offsets(GROUP, a2.generation_id, b.member_id, commit) == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }
    assert await coord.commit_offsets(GROUP, -1, "", commit) == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert await coord.commit_offsets(GROUP, a2.generation_id, a.member_id, commit) == {
        ("t", 0): ErrorCode.REBALANCE_IN_PROGRESS
    }
    assert coord.fetch_offsets(GROUP, [("t", 0)]) == {("t", 0): (-1, "")}


async def test_commit_by_static_member_checks_its_instance_id(coord: GroupCoordinator) -> None:
    a = await static_join(coord, "", "instance-a")
    await coord.sync(GROUP, a.generation_id, a.member_id, {a.member_id: assignment_for(0)})
    commit = {("t", 0): (5, None)}
    gen = a.generation_id
    assert await coord.commit_offsets(GROUP, gen, a.member_id, commit, "instance-b") == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }
    a2 = await static_join(coord, "", "instance-a")
    assert await coord.commit_offsets(GROUP, gen, a.member_id, commit, "instance-a") == {
        ("t", 0): ErrorCode.FENCED_INSTANCE_ID
    }
    assert await coord.commit_offsets(GROUP, gen, a2.member_id, commit, "instance-a") == {
        ("t", 0): ErrorCode.NONE
    }


async def test_standalone_commit_without_membership(coord: GroupCoordinator) -> None:
    assert await coord.commit_offsets("solo", 5, "", {("t", 0): (1, None)}) == {("t", 0): ErrorCode.ILLEGAL_GENERATION}
    assert await coord.commit_offsets("solo", -1, "", {("t", 0): (7, "meta")}) == {("t", 0): ErrorCode.NONE}
    assert coord.fetch_offsets("solo", None) == {("t", 0): (7, "meta")}
    assert ("solo", "", "Empty") in coord.list_groups()
    assert coord.describe("solo").state == "Empty"
    assert coord.describe("never-seen").state == "Dead"


async def test_stop_answers_parked_requests(clock: FakeClock) -> None:
    c = GroupCoordinator(MemoryOffsetStore(), clock, settings=GroupSettings(initial_rebalance_delay_ms=3000))
    await c.start()
    t = start_join(c)
    await settle()
    assert not t.done(), "the initial rebalance delay holds the first join"
    await c.stop()
    assert (await t).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


async def advance(c: GroupCoordinator, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    c.check_timeouts()
    await settle()


async def test_initial_rebalance_delay_gathers_members(clock: FakeClock) -> None:
    """Kafka's InitialDelayedJoin: a 3 s window; a window in which members joined is followed by
    another one; the join completes at the end of the first window without a newcomer."""
    c = GroupCoordinator(MemoryOffsetStore(), clock, settings=GroupSettings(initial_rebalance_delay_ms=3000))
    await c.start()
    try:
        t1, t2 = start_join(c), start_join(c)
        await settle()
        assert not t1.done(), "everyone has joined, but the first rebalance waits for its window"
        await advance(c, clock, 2.0)
        t3 = start_join(c)
        await settle()
        await advance(c, clock, 1.0)  # t=3: members joined in the window, so a second window starts
        assert not t1.done()
        await advance(c, clock, 2.9)
        assert not t1.done()
        await advance(c, clock, 0.2)  # t=6.1: nobody joined in the second window (ended at t=6)
        r = [await asyncio.wait_for(t, 1) for t in (t1, t2, t3)]
        assert {x.generation_id for x in r} == {1}
        assert len(r[0].members) == 3
    finally:
        await c.stop()


async def test_initial_rebalance_delay_alone_and_bounded_by_the_rebalance_timeout(clock: FakeClock) -> None:
    c = GroupCoordinator(MemoryOffsetStore(), clock, settings=GroupSettings(initial_rebalance_delay_ms=3000))
    await c.start()
    try:
        alone = start_join(c)
        await settle()
        await advance(c, clock, 2.999)
        assert not alone.done()
        await advance(c, clock, 0.001)
        assert (await asyncio.wait_for(alone, 1)).generation_id == 1
        # Another group whose rebalance timeout (4 s) leaves 1 s after the first window: one more
        # window of 1 s, then the join completes although a member joined in it.
        first = asyncio.ensure_future(c.join("g2", "", None, "consumer", [("range", SUB)], SESSION_MS, 4000,
                                             "c", "h", False))
        await settle()
        await advance(c, clock, 2.0)
        second = asyncio.ensure_future(c.join("g2", "", None, "consumer", [("range", SUB)], SESSION_MS, 4000,
                                              "c", "h", False))
        await settle()
        await advance(c, clock, 1.0)
        assert not first.done()
        third = asyncio.ensure_future(c.join("g2", "", None, "consumer", [("range", SUB)], SESSION_MS, 4000,
                                             "c", "h", False))
        await settle()
        await advance(c, clock, 1.0)
        results = [await asyncio.wait_for(t, 1) for t in (first, second, third)]
        assert {r.generation_id for r in results} == {1} and len(results[0].members) == 3
    finally:
        await c.stop()


async def test_member_leaving_during_the_initial_delay_completes_the_join(clock: FakeClock) -> None:
    c = GroupCoordinator(MemoryOffsetStore(), clock, settings=GroupSettings(initial_rebalance_delay_ms=3000))
    await c.start()
    try:
        stays = start_join(c, require_known=True)
        await settle()
        pending = stays.result().member_id  # MEMBER_ID_REQUIRED: joins again with it
        joined = start_join(c, pending, require_known=True)
        other = await join(c, require_known=True)
        await settle()
        assert not joined.done()
        await c.leave(GROUP, [other.member_id])  # the pending id goes; everyone left has joined
        assert (await asyncio.wait_for(joined, 1)).generation_id == 1
    finally:
        await c.stop()


async def test_background_task_expires_members_with_real_clock() -> None:
    c = GroupCoordinator(MemoryOffsetStore(), settings=GroupSettings(min_session_timeout_ms=50), tick_interval_s=0.01)
    await c.start()
    try:
        r = await join(c, session_ms=100, rebalance_ms=100)
        await c.sync(GROUP, r.generation_id, r.member_id, {})
        deadline = asyncio.get_running_loop().time() + 5
        while c.describe(GROUP).members and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert c.describe(GROUP).state == "Empty"
        assert c.heartbeat(GROUP, r.generation_id, r.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        await c.stop()


async def static_join(coord: GroupCoordinator, member_id: str, instance: str) -> JoinResult:
    return await coord.join(
        GROUP, member_id, instance, "consumer", [("range", SUB)], SESSION_MS, REBALANCE_MS, "s", "h", True
    )


async def test_static_member_restart_keeps_its_assignment_without_a_rebalance(coord: GroupCoordinator) -> None:
    a = await static_join(coord, "", "instance-a")
    assert a.error_code == ErrorCode.NONE, "a static member never gets MEMBER_ID_REQUIRED"
    tb = start_join(coord, client_id="b")
    await settle()
    a = await static_join(coord, a.member_id, "instance-a")
    b = await tb
    gen = a.generation_id
    plan = {a.member_id: assignment_for(0), b.member_id: assignment_for(1)}
    sb = asyncio.ensure_future(coord.sync(GROUP, gen, b.member_id, {}))
    await coord.sync(GROUP, gen, a.member_id, plan)
    await sb
    # The process of the leader (a) restarts and joins again with the same instance id, no member id.
    a2 = await static_join(coord, "", "instance-a")
    assert a2.error_code == ErrorCode.NONE and a2.member_id != a.member_id
    assert a2.generation_id == gen, "no rebalance"
    assert a2.leader_id == a.member_id and a2.members == [], "the new id must not act as leader"
    assert coord.describe(GROUP).state == "Stable"
    assert coord.heartbeat(GROUP, gen, b.member_id) == ErrorCode.NONE
    s2 = await coord.sync(GROUP, gen, a2.member_id, {})
    assert s2.error_code == ErrorCode.NONE and s2.assignment == assignment_for(0)
    group = coord.group(GROUP)
    assert group is not None and group.leader_id == a2.member_id
    # The old incarnation is fenced: told so when it names its instance id (Heartbeat/SyncGroup v3+).
    assert coord.heartbeat(GROUP, gen, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, gen, a.member_id, "instance-a") == ErrorCode.FENCED_INSTANCE_ID
    assert (await coord.sync(GROUP, gen, a.member_id, {}, "instance-a")).error_code == ErrorCode.FENCED_INSTANCE_ID
    assert coord.heartbeat(GROUP, gen, a2.member_id, "instance-z") == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, gen, a2.member_id, "instance-a") == ErrorCode.NONE
    assert (await static_join(coord, a.member_id, "instance-a")).error_code == ErrorCode.FENCED_INSTANCE_ID
    assert (await static_join(coord, a2.member_id, "instance-z")).error_code == ErrorCode.UNKNOWN_MEMBER_ID


async def test_leave_by_instance_id_checks_in_kafkas_order(coord: GroupCoordinator) -> None:
    a = await static_join(coord, "", "instance-a")
    a2 = await static_join(coord, "", "instance-a")  # a restarted: a's id no longer holds instance-a
    pending = await join(coord, require_known=True)
    assert pending.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert await coord.leave_members(GROUP, [
        (a.member_id, "instance-a"),  # an old incarnation: fenced before "is it a member"
        (a2.member_id, "instance-z"),  # nobody holds instance-z
        ("", None),  # neither id
        (pending.member_id, "instance-a"),  # a pending id just goes, whatever instance it names
    ]) == (ErrorCode.NONE, [ErrorCode.FENCED_INSTANCE_ID, ErrorCode.UNKNOWN_MEMBER_ID,
                            ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.NONE])
    assert [m.member_id for m in coord.describe(GROUP).members] == [a2.member_id]
    assert await coord.leave_members(GROUP, [("", "instance-a")]) == (ErrorCode.NONE, [ErrorCode.NONE])
    assert coord.describe(GROUP).state == "Empty"
    assert await coord.leave_members("", [("", "instance-a")]) == (ErrorCode.INVALID_GROUP_ID, [])
    assert coord.heartbeat("", 1, "m") == ErrorCode.INVALID_GROUP_ID
    assert (await coord.sync("", 1, "m", {})).error_code == ErrorCode.INVALID_GROUP_ID


async def test_delete_offsets_of_a_group_with_members_of_another_protocol_type(coord: GroupCoordinator) -> None:
    await coord.commit_offsets(GROUP, -1, "", {("t", 0): (3, None)})
    joined = await coord.join(GROUP, "", None, "connect", [("default", b"")], SESSION_MS, REBALANCE_MS, "w", "h", False)
    assert joined.error_code == ErrorCode.NONE
    # Kafka cannot tell which topics a non-consumer group uses: nothing goes while it has members.
    assert await coord.delete_offsets(GROUP, [("t", 0)]) == (ErrorCode.NON_EMPTY_GROUP, {})
    assert await coord.delete_offsets("", [("t", 0)]) == (ErrorCode.INVALID_GROUP_ID, {})
    await coord.leave(GROUP, [joined.member_id])
    assert await coord.delete_offsets(GROUP, [("t", 0), ("t", 1)]) == (
        ErrorCode.NONE, {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE})
    assert coord.describe(GROUP).state == "Dead"


async def test_static_member_restart_while_completing_fences_and_rebalances(coord: GroupCoordinator) -> None:
    a = await join(coord, client_id="a")
    tb = asyncio.ensure_future(static_join(coord, "", "instance-b"))
    await settle()
    a = await join(coord, a.member_id, client_id="a")
    b = await tb
    sb = asyncio.ensure_future(coord.sync(GROUP, b.generation_id, b.member_id, {}))
    await settle()
    assert coord.describe(GROUP).state == "CompletingRebalance"
    tb2 = asyncio.ensure_future(static_join(coord, "", "instance-b"))
    await settle()
    assert (await sb).error_code == ErrorCode.FENCED_INSTANCE_ID, "the old incarnation's parked sync"
    assert coord.describe(GROUP).state == "PreparingRebalance"
    a2 = await join(coord, a.member_id, client_id="a")
    b2 = await tb2
    assert a2.generation_id == b2.generation_id == a.generation_id + 1
    assert b2.member_id != b.member_id and a2.leader_id == a.member_id
    assert {m.member_id for m in a2.members} == {a.member_id, b2.member_id}


async def test_delete_groups(coord: GroupCoordinator) -> None:
    r = await join(coord)
    await coord.commit_offsets("solo", -1, "", {("t", 0): (3, None)})
    assert await coord.delete_groups([GROUP, "solo", "nope"]) == {
        GROUP: ErrorCode.NON_EMPTY_GROUP,
        "solo": ErrorCode.NONE,
        "nope": ErrorCode.GROUP_ID_NOT_FOUND,
    }
    assert coord.fetch_offsets("solo", None) == {}
    assert "solo" not in {g for g, _, _ in coord.list_groups()}
    await coord.leave(GROUP, [r.member_id])
    assert await coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
    assert coord.describe(GROUP).state == "Dead"
    # The id can be used again: a fresh group starts.
    assert (await join(coord)).generation_id == 1


async def test_answers_hold_as_of_the_request_not_the_last_tick(coord: GroupCoordinator, clock: FakeClock) -> None:
    """A member whose session has ended is gone for DescribeGroups, ListGroups and DeleteGroups even
    before the periodic tick runs (Kafka's timers fire on time; librdkafka's test 0081 deletes its
    groups the moment the closed static members' sessions end). No check_timeouts() call here."""
    await form_group(coord, 1)
    clock.advance(SESSION_MS / 1000 + 0.001)
    assert coord.describe(GROUP).members == []
    assert (GROUP, "consumer", "Empty") in coord.list_groups()
    await form_group(coord, 1)
    clock.advance(SESSION_MS / 1000 + 0.001)
    assert await coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
