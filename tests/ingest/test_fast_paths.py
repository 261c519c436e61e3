"""The ingest hot path's shortcuts give exactly what the plain path gives.

- ``Router`` caches per-source decisions (rules per MQTT topic, log topics from templates, header
  tuples): a router that has routed many messages, with rules added and removed in between, routes
  like a freshly built one.
- ``IngestSink`` stores the records ``Router.route`` describes (value, key, headers, event time),
  per key in order, whether called through ``write``, ``ingest`` or ``ingest_from`` (one device's
  messages as tuples, routed by plans where there are plans); dead letters included.
- ``HealthRegistry.record_batch`` counts like one ``record`` per message.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log.memory import MemoryLogStore
from ingest.errors import RouteError
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import (
    _EPOCH_SCALE,
    KeySpec,
    RawMessage,
    Rejected,
    Routed,
    RouteDefaults,
    RouteRule,
    SourceRef,
    TimeSpec,
    event_time_ms,
)
from ingest.sink import _MAX_BATCH_BYTES, IngestSink
from tests.ingest.conftest import read_all, records

SOURCES = [SourceRef("mqtt", "default"), SourceRef("bridge", "b1"), SourceRef("tcp", "t1", "json")]
SUBJECTS = [None, "sensors/d1/temp", "sensors/d2/temp", "sensors/d1/hum", "a/b", "$SYS/load", "x"]
PAYLOADS = [
    b'{"device_id": "dev-1", "t": 1700000000123, "v": 1.5}',
    b'{"device_id": 7, "t": "2024-05-01T12:00:00Z"}',
    b'{"v": 2}',
    b"{broken",
    b"plain bytes",
]

rules = st.builds(
    RouteRule,
    name=st.sampled_from(["r1", "r2", "r3", "r4"]),
    topic=st.sampled_from(["out", "by-{1}", "sensors-{0}-{2}"]),
    source_kind=st.sampled_from(["*", "mqtt", "tcp", "bridge"]),
    source_name=st.sampled_from(["*", "default", "t1"]),
    filter=st.sampled_from([None, "sensors/+/temp", "sensors/#", "#", "a/b", "+/+"]),
    key=st.sampled_from([KeySpec(), KeySpec("topic"), KeySpec("level", "1"), KeySpec("field", "device_id"),
                         KeySpec("device"), KeySpec("none")]),
    time=st.sampled_from([TimeSpec(), TimeSpec("t", "epoch_ms"), TimeSpec("t", "rfc3339")]),
    format=st.sampled_from([None, "json", "raw"]),
    value=st.sampled_from(["original", "json"]),
    device=st.sampled_from([None, KeySpec("field", "device_id"), KeySpec("level", "1")]),
    fan_out=st.booleans(),
)
messages = st.builds(
    RawMessage,
    payload=st.sampled_from(PAYLOADS),
    subject=st.sampled_from(SUBJECTS),
    device=st.sampled_from([None, "client-a", "client-b"]),
    arrival_ms=st.just(1_700_000_000_000),
    headers=st.sampled_from([(), (("mqtt.content_type", b"text/plain"),)]),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("route"), st.sampled_from(SOURCES), messages),
        st.tuples(st.just("add"), rules, st.booleans()),
        st.tuples(st.just("remove"), st.sampled_from(["r1", "r2", "r3", "r4"]), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_a_long_lived_router_routes_like_a_fresh_one(ops: list[tuple[str, object, object]]) -> None:
    defaults = RouteDefaults("m", "t", "f")
    warm = Router([], defaults)
    for op, arg, extra in ops:
        if op == "add":
            assert isinstance(arg, RouteRule)
            if extra or arg.name not in {r.name for r in warm.rules}:
                warm.add_rule(arg, replace=True)
        elif op == "remove":
            if arg in {r.name for r in warm.rules}:
                warm.remove_rule(str(arg))
        else:
            assert isinstance(arg, SourceRef) and isinstance(extra, RawMessage)
            cold = Router(warm.rules, defaults)
            assert warm.route(arg, extra) == cold.route(arg, extra)
            # twice: the second time from the caches
            assert warm.route(arg, extra) == cold.route(arg, extra)


def test_rule_changes_take_effect_on_the_next_message() -> None:
    router = Router([], RouteDefaults())
    src = SourceRef("mqtt", "default")
    msg = RawMessage(b"1", "sensors/d1/temp", "c", 5)
    assert [r.topic for r in router.route(src, msg) if isinstance(r, Routed)] == ["mqtt"]
    router.add_rule(RouteRule("temps", "temps", filter="sensors/+/temp", key=KeySpec("level", "1")))
    (routed,) = router.route(src, msg)
    assert isinstance(routed, Routed) and (routed.topic, routed.key) == ("temps", b"d1")
    router.add_rule(RouteRule("first", "first-{1}", filter="sensors/#"), index=0)
    assert [r.topic for r in router.route(src, msg) if isinstance(r, Routed)] == ["first-d1"]
    router.remove_rule("first")
    router.remove_rule("temps")
    assert [r.topic for r in router.route(src, msg) if isinstance(r, Routed)] == ["mqtt"]


# ------------------------------------------------------------------------------------------ the sink


def _expected(router: Router, source: SourceRef, msgs: Sequence[RawMessage]) -> Counter[tuple[object, ...]]:
    want: Counter[tuple[object, ...]] = Counter()
    for msg in msgs:
        for r in router.route(source, msg):
            if isinstance(r, Routed):
                rec = r.record
                want[(r.topic, rec.value, rec.key, rec.headers, rec.timestamp)] += 1
    return want


def _stored(store: MemoryLogStore, skip: str) -> Counter[tuple[object, ...]]:
    got: Counter[tuple[object, ...]] = Counter()
    for topic in store.list_topics():
        if topic.name != skip:
            for rec in records(store, topic.name):
                got[(topic.name, rec.value, rec.key, rec.headers, rec.timestamp)] += 1
    return got


async def _through_sink(
    rule_list: list[RouteRule], source: SourceRef, msgs: list[RawMessage], call: str
) -> MemoryLogStore:
    store = MemoryLogStore(default_partitions=3)
    sink = IngestSink(store, Router(rule_list, RouteDefaults()), HealthRegistry())
    half = len(msgs) // 2
    for part in (msgs[:half], msgs[half:]):  # two calls: caches carry over between writes
        if call == "ingest":
            await sink.ingest(source, part)
        elif call == "write":
            await sink.write(source, part)
        else:  # one call per device, its messages in order
            for device in dict.fromkeys(m.device for m in part):
                await sink.ingest_from(source, device, [(m.subject, m.payload, m.arrival_ms, m.headers)
                                                        for m in part if m.device == device])
    assert sink.messages_written == len(msgs)
    return store


@settings(max_examples=60, deadline=None)
@given(
    rule_list=st.lists(rules, max_size=3, unique_by=lambda r: r.name),
    source=st.sampled_from(SOURCES),
    msgs=st.lists(messages, min_size=1, max_size=25),
)
def test_the_sink_stores_what_the_router_describes(
    rule_list: list[RouteRule], source: SourceRef, msgs: list[RawMessage]
) -> None:
    want = _expected(Router(rule_list, RouteDefaults()), source, msgs)
    dead_counts = []
    for call in ("write", "ingest", "ingest_from"):
        store = asyncio.run(_through_sink(rule_list, source, msgs, call))
        assert _stored(store, "_dead_letters") == want
        dead_counts.append(len(records(store, "_dead_letters")))
        for partitions in read_all(store, "_dead_letters").values():
            for letter in partitions:
                assert letter.header("reason") and letter.header("source") == source.label.encode()
        # keyed records: the partition of their key, in arrival order
        for topic in store.list_topics():
            for p, recs in read_all(store, topic.name).items():
                for rec in recs:
                    if rec.key is not None and topic.name != "_dead_letters":
                        assert store.partition_for(topic.name, rec.key) == p
    rejected = sum(
        1 for m in msgs for r in Router(rule_list, RouteDefaults()).route(source, m) if isinstance(r, Rejected)
    )
    assert dead_counts == [rejected, rejected, rejected]


async def test_per_key_order_and_batches_split_below_the_size_limit() -> None:
    store = MemoryLogStore(default_partitions=2)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry())
    src = SourceRef("mqtt", "default")
    payload = b"x" * 2000
    msgs = [RawMessage(payload + b"%06d" % i, f"dev/{i % 3}", f"c{i % 3}", 1_700_000_000_000 + i) for i in range(900)]
    await sink.ingest(src, msgs)  # ~1.8 MB in one call: more than one RecordBatch per partition
    stored = records(store, "mqtt")
    assert len(stored) == 900
    for dev in range(3):
        mine = [r for r in stored if r.key == f"dev/{dev}".encode()]
        assert [r.value for r in mine] == [m.payload for m in msgs if m.subject == f"dev/{dev}"]
        assert all(r.header("device") == f"c{dev}".encode() for r in mine)
    for log in store.partitions("mqtt"):
        data = log.read(log.log_start_offset, 1 << 40)
        sizes = []
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            sizes.append(size)
            pos += size
        assert max(sizes) <= _MAX_BATCH_BYTES + 64 * 1024
        assert 2 <= len(sizes) <= 5  # 0.6-1.2 MB per partition: split, but not record by record


async def test_ingest_counts_health_and_in_flight_like_write() -> None:
    clock = [1000.0]
    results = []
    for use_ingest in (False, True):
        health = HealthRegistry(clock=lambda: clock[0])
        sink = IngestSink(MemoryLogStore(), Router([], RouteDefaults()), health, clock=lambda: clock[0])
        src = SourceRef("tcp", "t1", "json")
        msgs = [RawMessage(b'{"device_id": "d%d"}' % (i % 4)) for i in range(10)] + [RawMessage(b"{bad", device="z")]
        if use_ingest:
            await sink.ingest(src, msgs)
        else:
            await sink.write(src, msgs)
        results.append((health.snapshot(), sink.messages_written, sink.dead_lettered, sink.pending_bytes))
    assert results[0] == results[1]
    rows = {(r["type"], r.get("device")): r for r in results[0][0]}
    assert rows[("source", None)]["messages"] == 11 and rows[("source", None)]["errors"] == 1
    assert rows[("source", None)]["in_flight"] == 0
    assert rows[("device", "d1")]["messages"] == 3 and rows[("device", "z")]["errors"] == 1


# ------------------------------------------------------------------------------------------ health

device_batches = st.lists(st.tuples(st.sampled_from([None, "a", "b", "c", "d"]), st.integers(0, 500)), max_size=30)


@settings(max_examples=100)
@given(batches=st.lists(device_batches, max_size=5), limit=st.integers(1, 4))
def test_record_batch_counts_like_one_record_per_message(
    batches: list[list[tuple[str | None, int]]], limit: int
) -> None:
    now = [50.0]
    one, many = (HealthRegistry(clock=lambda: now[0], max_devices_per_source=limit) for _ in range(2))
    src = SourceRef("mqtt", "default")
    for batch in batches:
        now[0] += 1.0
        per_device: dict[str | None, list[int]] = {}
        for device, nbytes in batch:
            one.record(src, device, nbytes)
            counts = per_device.setdefault(device, [0, 0])
            counts[0] += 1
            counts[1] += nbytes
        many.record_batch(src, per_device)
    assert one.snapshot() == many.snapshot()


# ------------------------------------------------------------------------------------------ event time


@given(value=st.integers(min_value=-(2**70), max_value=2**70), fmt=st.sampled_from(list(_EPOCH_SCALE)))
def test_integer_event_times_convert_like_their_decimal_text(value: int, fmt: str) -> None:
    # ints take a shortcut in event_time_ms; the same number as text goes the general way
    def outcome(v: object) -> int | str:
        try:
            return event_time_ms(v, fmt)
        except RouteError:
            return "error"

    assert outcome(value) == outcome(str(value))
