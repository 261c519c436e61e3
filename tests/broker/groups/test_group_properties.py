"""Random join/sync/heartbeat/leave/commit/restart/timeout/crash sequences against the group state machine.

The state machine is sans-IO, so the test plays every client itself and checks after each step:
the generation never decreases; every parked request is answered exactly once; a member is in at
most one of pending / parked join / parked sync; parked joins exist only in PreparingRebalance and
parked syncs only in CompletingRebalance; Empty means no members; the leader is a member; a static
instance id is held by at most one member; and in Stable every member holds exactly the assignment
the leader gave for that generation. The world stores what the group asks to store (rule 13) at once;
a broker crash brings the group back from the last record (group_records.restore_group), and the
same invariants hold from there on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.groups.group import Effects, Group, GroupSettings, GroupState, JoinResult, SyncResult
from broker.groups.group_records import (
    GroupMetadataRecord,
    decode_group_metadata,
    encode_group_metadata,
    record_of,
    restore_group,
)
from broker.protocol.kafka_codes import ErrorCode

CLIENTS = 5
STATIC_FROM = 3  # clients 3 and 4 are static members (group.instance.id)
SESSION_MS = 3_000
REBALANCE_MS = 5_000


@dataclass
class Client:
    member_id: str = ""
    generation: int = -1


@dataclass
class World:
    group: Group
    now: float = 0.0
    clients: list[Client] = field(default_factory=lambda: [Client() for _ in range(CLIENTS)])
    parked_join: set[str] = field(default_factory=set)
    parked_sync: set[str] = field(default_factory=set)
    given: dict[int, dict[str, bytes]] = field(default_factory=dict)  # generation -> leader's plan
    last_generation: int = 0
    counter: int = 0
    stored: GroupMetadataRecord | None = None  # the group's last metadata record

    def client_of(self, member_id: str) -> Client | None:
        return next((c for c in self.clients if c.member_id == member_id), None)

    def apply(self, effects: Effects) -> None:
        for mid, join_answer in effects.joins:
            assert mid in self.parked_join, f"join answer for {mid} that has no parked JoinGroup"
            self.parked_join.discard(mid)
            self.on_join(mid, join_answer)
        for mid, sync_answer in effects.syncs:
            assert mid in self.parked_sync, f"sync answer for {mid} that has no parked SyncGroup"
            self.parked_sync.discard(mid)
            self.on_sync(mid, sync_answer)
        store = effects.store
        if store is not None:  # the write succeeds at once (through the codec, as on disk)
            assert store.generation_id == self.group.generation_id
            self.stored = decode_group_metadata(encode_group_metadata(record_of(self.group, store, 0)))
            if store.why == "assignment":
                assert self.group.state is GroupState.COMPLETING_REBALANCE
                self.apply(self.group.assignment_stored(self.now, store.generation_id, dict(store.assignments),
                                                        ErrorCode.NONE))
            else:
                assert self.group.state is (GroupState.EMPTY if store.why == "empty" else GroupState.STABLE)

    def on_join(self, mid: str, r: JoinResult) -> None:
        client = self.client_of(mid)
        if r.error_code == ErrorCode.NONE:
            assert r.generation_id == self.group.generation_id
            assert r.member_id == mid
            if mid == r.leader_id:
                assert [m.member_id for m in r.members] == list(self.group.members)
            else:
                assert r.members == []
            if client is not None:
                client.generation = r.generation_id
        elif r.error_code == ErrorCode.UNKNOWN_MEMBER_ID and client is not None:
            client.member_id, client.generation = "", -1

    def on_sync(self, mid: str, r: SyncResult) -> None:
        if r.error_code == ErrorCode.NONE:
            gen = self.group.generation_id
            assert r.assignment == self.given[gen].get(mid, b"")

    def check(self) -> None:
        g = self.group
        assert g.generation_id >= self.last_generation
        self.last_generation = g.generation_id
        assert (g.state is GroupState.EMPTY) == (not g.members)
        assert (g.leader_id in g.members) if g.members else g.leader_id is None
        assert not set(g.pending) & set(g.members)
        instances = [m.group_instance_id for m in g.members.values() if m.group_instance_id]
        assert len(instances) == len(set(instances)), "two members hold one static instance id"
        for mid, m in g.members.items():
            assert not (m.awaiting_join and m.awaiting_sync), "member in two states"
            if m.awaiting_join:
                assert g.state is GroupState.PREPARING_REBALANCE
            if m.awaiting_sync:
                assert g.state is GroupState.COMPLETING_REBALANCE
            if g.state is GroupState.STABLE:
                assert m.assignment == self.given[g.generation_id].get(mid, b"")
        assert self.parked_join == {mid for mid, m in g.members.items() if m.awaiting_join}
        assert self.parked_sync == {mid for mid, m in g.members.items() if m.awaiting_sync}


def instance_of(i: int) -> str | None:
    return f"static-{i}" if i >= STATIC_FROM else None


def do_join(w: World, i: int, require_known: bool) -> None:
    c = w.clients[i]
    w.counter += 1
    instance = instance_of(i)
    holder = next((m.member_id for m in w.group.members.values() if instance and m.group_instance_id == instance), None)
    was_stable = w.group.state is GroupState.STABLE
    answer, mid, effects = w.group.join(
        w.now,
        member_id=c.member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=[("range", b"r%d" % i), ("roundrobin", b"rr")],
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS,
        client_id=f"c{i}",
        client_host="h",
        require_known_member_id=require_known,
        new_member_id=f"c{i}-{w.counter}",
    )
    if answer is None:
        # A repeated JoinGroup: the coordinator answers the old request itself.
        w.parked_join.add(mid)
        c.member_id = mid
        w.apply(effects)
        return
    w.apply(effects)
    if answer.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        c.member_id = answer.member_id
    elif answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
        c.member_id, c.generation = "", -1
    elif answer.error_code == ErrorCode.NONE:
        if c.member_id == "":
            # A restarted static member swapped in for its old id in a Stable group: same
            # generation, the old id's assignment, and the leader id as it was before the swap.
            assert holder is not None and was_stable and mid == answer.member_id != holder
            assert answer.leader_id != mid and answer.members == []
            plan = w.given[answer.generation_id]
            if holder in plan:
                plan[mid] = plan.pop(holder)
            c.member_id = mid
        c.generation = answer.generation_id
        assert answer.generation_id == w.group.generation_id


def do_sync(w: World, i: int, stale: bool) -> None:
    c = w.clients[i]
    gen = c.generation - 1 if stale else c.generation
    plan: dict[str, bytes] = {}
    if c.member_id and c.member_id == w.group.leader_id:
        # The leader leaves out one member on purpose sometimes: it must get empty bytes.
        members = list(w.group.members)
        plan = {mid: f"{gen}:{mid}".encode() for mid in members[: max(1, len(members) - (gen % 2))]}
        if w.group.state is GroupState.COMPLETING_REBALANCE and gen == w.group.generation_id:
            w.given[gen] = plan
    answer, effects = w.group.sync(w.now, gen, c.member_id, plan)
    if answer is None:
        w.parked_sync.add(c.member_id)
    w.apply(effects)
    if answer is not None:
        if gen != w.group.generation_id and c.member_id in w.group.members:
            assert answer.error_code == ErrorCode.ILLEGAL_GENERATION
        w.on_sync(c.member_id, answer)


def do_heartbeat(w: World, i: int, stale: bool) -> None:
    c = w.clients[i]
    gen = c.generation - 1 if stale else c.generation
    err = w.group.heartbeat(w.now, gen, c.member_id)
    if c.member_id not in w.group.members:
        assert err == ErrorCode.UNKNOWN_MEMBER_ID
    elif gen != w.group.generation_id:
        assert err == ErrorCode.ILLEGAL_GENERATION
    elif w.group.state is GroupState.PREPARING_REBALANCE:
        assert err == ErrorCode.REBALANCE_IN_PROGRESS
    else:
        assert err == ErrorCode.NONE


def expected_commit_error(g: Group, gen: int, member_id: str, instance: str | None) -> ErrorCode:
    """Kafka's validateOffsetCommit, step by step."""
    if gen < 0 and g.state is GroupState.EMPTY:
        return ErrorCode.NONE
    if gen >= 0 or member_id or instance:
        if instance:
            holder = next((m.member_id for m in g.members.values() if m.group_instance_id == instance), None)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in g.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if gen != g.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
    elif g.state is not GroupState.EMPTY:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if g.state is GroupState.COMPLETING_REBALANCE:
        return ErrorCode.REBALANCE_IN_PROGRESS
    return ErrorCode.NONE


def do_commit(w: World, i: int, stale: bool) -> None:
    c = w.clients[i]
    g = w.group
    gen = c.generation - 1 if stale else c.generation
    instance = instance_of(i)
    expected = expected_commit_error(g, gen, c.member_id, instance)
    err = g.validate_commit(w.now, gen, c.member_id, instance)
    assert err == expected, f"commit by {c.member_id!r} gen {gen} in {g.state}: {err!r}, Kafka says {expected!r}"
    member = g.members.get(c.member_id)
    if err == ErrorCode.NONE and member is not None and gen >= 0:
        # An accepted commit counts as a sign of life, like a heartbeat.
        assert member.session_deadline == w.now + SESSION_MS / 1000


def do_leave(w: World, i: int) -> None:
    c = w.clients[i]
    mid = c.member_id
    errors, effects = w.group.leave(w.now, [mid])
    w.apply(effects)
    assert mid not in w.group.members and mid not in w.group.pending
    assert errors[mid] in (ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID)
    c.member_id, c.generation = "", -1


def do_restart(w: World, i: int) -> None:
    """The client process crashes and comes back without its member id (its old member lingers)."""
    w.clients[i] = Client()


def do_crash(w: World) -> None:
    """The broker restarts: the group is what it last stored; parked requests die with the connections."""
    settings = w.group.settings
    w.group = Group("g", settings) if w.stored is None else restore_group("g", w.stored, settings, w.now)
    w.parked_join.clear()
    w.parked_sync.clear()
    w.last_generation = w.group.generation_id  # a generation nobody stored is rebalanced again
    if w.stored is not None and w.stored.members:
        assert w.group.state is GroupState.STABLE and w.group.leader_id == w.stored.leader_id
        assert {m.member_id: m.assignment for m in w.stored.members} == {
            mid: m.assignment for mid, m in w.group.members.items()}


def do_time(w: World, seconds: float) -> None:
    w.now += seconds
    w.apply(w.group.tick(w.now))
    nxt = w.group.next_deadline()
    assert nxt is None or nxt > w.now, "tick left an overdue deadline behind"


def do_round(w: World, leader_first: bool) -> None:
    """Every member behaves like a well-written client for one round."""
    for i, c in enumerate(w.clients):
        g = w.group
        if c.member_id not in g.members:
            continue
        if c.member_id == g.leader_id and not leader_first:
            continue
        if g.state is GroupState.PREPARING_REBALANCE and c.member_id not in w.parked_join:
            do_join(w, i, False)
        elif g.state is GroupState.COMPLETING_REBALANCE and c.member_id not in w.parked_sync:
            if c.generation == g.generation_id:
                do_sync(w, i, False)
        elif c.member_id not in w.parked_join and c.member_id not in w.parked_sync:
            do_heartbeat(w, i, False)
    if not leader_first:
        leader = next((i for i, c in enumerate(w.clients) if c.member_id and c.member_id == w.group.leader_id), None)
        completing = w.group.state is GroupState.COMPLETING_REBALANCE
        if leader is not None and completing and w.clients[leader].generation == w.group.generation_id:
            do_sync(w, leader, False)
    do_time(w, 0.5)


joins = st.tuples(st.just("join"), st.integers(0, CLIENTS - 1), st.booleans())
rounds = st.tuples(st.just("round"), st.just(0), st.booleans())
ops = st.one_of(
    joins,
    joins,
    rounds,
    rounds,
    rounds,
    st.tuples(st.just("sync"), st.integers(0, CLIENTS - 1), st.booleans()),
    st.tuples(st.just("heartbeat"), st.integers(0, CLIENTS - 1), st.booleans()),
    st.tuples(st.just("commit"), st.integers(0, CLIENTS - 1), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, CLIENTS - 1), st.booleans()),
    st.tuples(st.just("restart"), st.integers(0, CLIENTS - 1), st.booleans()),
    st.tuples(st.just("crash"), st.just(0), st.booleans()),
    st.tuples(st.just("time"), st.sampled_from([0.5, 1.0, 2.9, 3.1, 6.0]), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, min_size=5, max_size=80), st.sampled_from([0, 2_000]))
def test_invariants_hold_for_random_sequences(steps: list[tuple[str, float, bool]], delay_ms: int) -> None:
    w = World(Group("g", GroupSettings(initial_rebalance_delay_ms=delay_ms)))
    for op, arg, flag in steps:
        run_step(w, op, arg, flag)


@settings(max_examples=100, deadline=None)
@given(st.lists(ops, max_size=40))
def test_group_settles_when_everyone_cooperates(steps: list[tuple[str, float, bool]]) -> None:
    """After any history, members that rejoin and sync get a Stable group within one rebalance timeout."""
    w = World(Group("g"))
    for op, arg, flag in steps:
        if op == "time":
            do_time(w, float(arg))
        elif op == "join":
            do_join(w, int(arg), flag)
        elif op == "leave":
            do_leave(w, int(arg))
        w.check()
    live = [i for i, c in enumerate(w.clients) if c.member_id in w.group.members]
    if not live:
        return
    for i in live:
        if w.clients[i].member_id not in w.parked_join:
            do_join(w, i, False)
    if w.group.state is GroupState.PREPARING_REBALANCE:
        do_time(w, REBALANCE_MS / 1000)  # every live member is parked, so none of them expires
    assert w.group.state is GroupState.COMPLETING_REBALANCE
    for i in sorted(live, key=lambda i: w.clients[i].member_id == w.group.leader_id):  # leader last
        do_sync(w, i, False)
    w.check()
    assert w.group.state is GroupState.STABLE


def run_step(w: World, op: str, arg: float, flag: bool) -> None:
    if op == "time":
        do_time(w, float(arg))
    elif op == "round":
        do_round(w, flag)
    elif op == "leave":
        do_leave(w, int(arg))
    elif op == "restart":
        do_restart(w, int(arg))
    elif op == "crash":
        do_crash(w)
    else:
        {"join": do_join, "sync": do_sync, "heartbeat": do_heartbeat, "commit": do_commit}[op](w, int(arg), flag)
    w.check()


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.sampled_from([0, 2_000]))
def test_invariants_hold_for_long_random_histories(rnd: random.Random, delay_ms: int) -> None:
    """Long histories (hypothesis's lists stay short): mostly cooperative rounds, with churn."""
    w = World(Group("g", GroupSettings(initial_rebalance_delay_ms=delay_ms)))
    kinds = ["round"] * 6 + ["join"] * 3 + ["sync", "heartbeat", "commit", "leave", "time", "restart", "crash"]
    for _ in range(300):
        op = rnd.choice(kinds)
        arg = rnd.choice([0.5, 1.0, 2.9, 3.1, 6.0]) if op == "time" else rnd.randrange(CLIENTS)
        run_step(w, op, arg, rnd.random() < 0.3)
