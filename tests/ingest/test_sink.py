"""The durable append path: routing into topics/partitions, dead letters, durability, backpressure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from broker.log.config import TopicConfig
from broker.log.memory import MemoryLogStore
from ingest.errors import SinkError
from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import KeySpec, RawMessage, RouteDefaults, RouteRule, SourceRef
from ingest.sink import DEFAULT_MAX_PENDING_BYTES, IngestSink
from tests.ingest.conftest import GatedLogStore, read_all, records

TCP = SourceRef("tcp", "default", "json")


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def _sink(store: MemoryLogStore, *, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> IngestSink:
    return IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), max_pending_bytes=max_pending_bytes)


async def test_records_land_in_murmur2_partition_of_their_key() -> None:
    store = MemoryLogStore(default_partitions=4)
    sink = _sink(store)
    lines = [f'{{"device_id": "dev-{i % 10}", "n": {i}}}'.encode() for i in range(200)]
    outcomes = await sink.write(TCP, [RawMessage(line) for line in lines])
    assert all(o.ok and len(o.placements) == 1 for o in outcomes)
    for i, outcome in enumerate(outcomes):
        placement = outcome.placements[0]
        assert placement.topic == "tcp"
        assert placement.partition == store.partition_for("tcp", f"dev-{i % 10}".encode())
    stored = records(store, "tcp")
    assert sorted(r.value for r in stored if r.value) == sorted(lines)
    by_device: dict[bytes, list[int]] = {}
    for rec in stored:
        assert rec.key is not None and rec.value is not None
        assert rec.header("source") == b"tcp:default"
        assert rec.header("device") == rec.key
        by_device.setdefault(rec.key, []).append(int(rec.value.split(b'"n": ')[1].rstrip(b"}")))
    assert all(ns == sorted(ns) for ns in by_device.values())  # per-key order kept


async def test_bad_messages_go_to_dead_letters_with_reason_source_device_and_bytes() -> None:
    store = MemoryLogStore()
    sink = _sink(store)
    msgs = [RawMessage(b'{"device_id": "a"}'), RawMessage(b"{broken", device="conn-1"), RawMessage(b'{"x": 1}')]
    outcomes = await sink.write(TCP, msgs)
    assert [o.ok for o in outcomes] == [True, False, True]
    assert outcomes[1].dead_letters[0].topic == "_dead_letters"
    (letter,) = records(store, "_dead_letters")
    assert letter.value == b"{broken"
    assert letter.header("reason") == outcomes[1].rejected[0].encode()
    assert b"invalid JSON" in (letter.header("reason") or b"")
    assert letter.header("source") == b"tcp:default"
    assert letter.header("device") == b"conn-1"
    assert len(records(store, "tcp")) == 2
    snap = {row["source"]: row for row in sink.health.snapshot() if row["type"] == "source"}
    assert snap["tcp:default"]["messages"] == 3 and snap["tcp:default"]["errors"] == 1


async def test_refused_append_becomes_dead_letter_not_loss() -> None:
    store = MemoryLogStore(default_config=TopicConfig(max_message_bytes=1024))
    sink = _sink(store)
    big = b'{"device_id": "a", "blob": "' + b"x" * 2000 + b'"}'
    (outcome,) = await sink.write(TCP, [RawMessage(big)])
    assert not outcome.ok and "exceeds max.message.bytes" in outcome.rejected[0]
    (letter,) = records(store, "_dead_letters")
    assert letter.header("truncated_from") == str(len(big)).encode()


async def test_unknown_topic_with_auto_create_off_is_dead_lettered() -> None:
    store = MemoryLogStore(auto_create_topics=False)
    store.create_topic("_dead_letters")
    sink = _sink(store)
    (outcome,) = await sink.write(TCP, [RawMessage(b'{"device_id": "a"}')])
    assert "unknown topic 'tcp'" in outcome.rejected[0]
    assert len(records(store, "_dead_letters")) == 1


MQTT = SourceRef("mqtt", "default")


async def test_ingest_from_dead_letters_what_the_log_refuses_and_stores_the_rest() -> None:
    # two subjects, one routed by plan to a topic whose records are too large: only its messages become
    # dead letters (with the MQTT topic and the client's headers), the other subject's are stored in order
    store = MemoryLogStore()
    store.create_topic("big", config=TopicConfig(max_message_bytes=1024))
    router = Router([RouteRule("big", "big", filter="big/#")], RouteDefaults())
    sink = IngestSink(store, router, HealthRegistry())
    msgs = [("big/a" if i % 3 == 0 else "ok/b", (b"x" * 2000 if i % 3 == 0 else b"%d" % i), 1_700_000_000_000 + i,
             (("mqtt.content_type", b"t"),)) for i in range(9)]
    await sink.ingest_from(MQTT, "client-1", msgs)
    stored = records(store, "mqtt")
    assert [r.value for r in stored] == [b"%d" % i for i in range(9) if i % 3]
    assert all(r.header("device") == b"client-1" and r.header("mqtt.content_type") == b"t" for r in stored)
    letters = records(store, "_dead_letters")
    assert len(letters) == 3 and all(letter.header("mqtt_topic") == b"big/a" for letter in letters)
    assert all(b"exceeds max.message.bytes" in (letter.header("reason") or b"") for letter in letters)
    assert sink.messages_written == 9 and sink.dead_lettered == 3 and sink.pending_bytes == 0
    snap = {row["source"]: row for row in sink.health.snapshot() if row["type"] == "source"}
    assert snap["mqtt:default"]["messages"] == 9 and snap["mqtt:default"]["errors"] == 3


async def test_ingest_from_spreads_keyless_records_as_ingest_does() -> None:
    # a rule without a key: each record takes the next partition (round-robin), not one per subject
    stores = []
    for through in ("ingest", "ingest_from"):
        store = MemoryLogStore(default_partitions=3)
        sink = IngestSink(store, Router([RouteRule("k", "keyless", key=KeySpec("none"))], RouteDefaults()),
                          HealthRegistry())
        msgs = [RawMessage(b"%d" % i, "a/b", "client-1", 1_700_000_000_000) for i in range(7)]
        if through == "ingest":
            await sink.ingest(MQTT, msgs)
        else:
            await sink.ingest_from(MQTT, "client-1", [(m.subject, m.payload, m.arrival_ms, m.headers) for m in msgs])
        stores.append({p: [r.value for r in recs] for p, recs in read_all(store, "keyless").items()})
    assert stores[0] == stores[1] and len([p for p, values in stores[1].items() if values]) == 3


async def test_ingest_from_an_unknown_topic_with_auto_create_off_is_dead_lettered() -> None:
    store = MemoryLogStore(auto_create_topics=False)
    store.create_topic("_dead_letters")
    sink = _sink(store)
    await sink.ingest_from(MQTT, "client-1", [("a/b", b"1", -1, ())])
    (letter,) = records(store, "_dead_letters")
    assert b"unknown topic 'mqtt'" in (letter.header("reason") or b"") and letter.header("mqtt_topic") == b"a/b"
    with pytest.raises(SinkError, match="dead-letter topic"):  # and when even that cannot be stored: raised
        await _sink(MemoryLogStore(auto_create_topics=False)).ingest_from(MQTT, "c", [("a/b", b"1", -1, ())])


async def test_dead_letter_failure_raises_so_the_caller_does_not_ack() -> None:
    store = MemoryLogStore(auto_create_topics=False)
    sink = _sink(store)
    with pytest.raises(SinkError, match="dead-letter topic"):
        await sink.write(TCP, [RawMessage(b"{broken")])
    assert sink.pending_bytes == 0


async def test_write_returns_only_after_the_durable_append() -> None:
    store = GatedLogStore()  # the disk's flush waits for the gate
    sink = _sink(store)
    task = asyncio.create_task(sink.write(TCP, [RawMessage(b'{"device_id": "a"}')]))
    await _until(lambda: store.has_topic("tcp") and store.partition("tcp", 0).high_watermark == 1)
    assert not task.done()  # the record is written but its flush has not returned
    assert sink.pending_bytes > 0
    store.gate.set()
    await task
    assert sink.pending_bytes == 0


async def test_backpressure_bounds_pending_bytes_and_loses_nothing() -> None:
    store = GatedLogStore()
    sink = _sink(store, max_pending_bytes=10_000)
    peak = 0

    async def writer(w: int) -> None:
        for n in range(20):
            batch = [RawMessage(f'{{"device_id": "w{w}", "n": {n}, "pad": "{"p" * 400}"}}'.encode())]
            await sink.write(TCP, batch)

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, sink.pending_bytes)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    writers = asyncio.gather(*(writer(w) for w in range(50)))
    await _until(lambda: sink.saturated and len(sink._waiters) > 0)  # the disk is stalled: writers queue up
    assert sink.pending_bytes <= 10_000
    store.gate.set()
    await writers
    watcher.cancel()
    assert peak <= 10_000
    assert len(records(store, "tcp")) == 50 * 20
    snap = sink.health.snapshot()[0]
    assert snap["pauses"] >= 1 and snap["paused_s"] > 0
    assert not sink.saturated
    await sink.wait_writable()


async def test_a_write_larger_than_the_budget_goes_through_alone() -> None:
    sink = _sink(MemoryLogStore(), max_pending_bytes=100)
    outcomes = await sink.write(TCP, [RawMessage(b'{"device_id": "a", "v": "' + b"z" * 500 + b'"}')])
    assert outcomes[0].ok


async def test_cancelled_waiter_gives_back_nothing_it_did_not_take() -> None:
    store = GatedLogStore()
    sink = _sink(store, max_pending_bytes=200)
    first = asyncio.create_task(sink.write(TCP, [RawMessage(b'{"device_id": "a"}' + b" " * 100)]))
    await _until(lambda: sink.pending_bytes > 0)
    second = asyncio.create_task(sink.write(TCP, [RawMessage(b'{"device_id": "b"}' + b" " * 100)]))
    await _until(lambda: len(sink._waiters) == 1)
    assert sink.saturated
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    store.gate.set()
    await first
    assert sink.pending_bytes == 0 and not sink.saturated


async def test_rules_route_mqtt_topics_with_fan_out() -> None:
    store = MemoryLogStore(default_partitions=3)
    router = Router(
        [
            RouteRule.from_mapping({"name": "all", "topic": "raw", "source": "mqtt", "continue": True}),
            RouteRule.from_mapping(
                {"name": "t", "topic": "temps", "filter": "s/+/t", "key": "level:1", "format": "json",
                 "time_field": "ts", "time_format": "epoch_ms"}
            ),
        ]
    )
    sink = IngestSink(store, router, HealthRegistry())
    mqtt = SourceRef("mqtt", "default")
    outcomes = await sink.write(
        mqtt, [RawMessage(b'{"ts": 1700000000000}', "s/d1/t", "c1"), RawMessage(b"not json", "s/d2/t", "c2")]
    )
    assert [p.topic for p in outcomes[0].placements] == ["raw", "temps"]
    assert outcomes[0].placements[1].partition == store.partition_for("temps", b"d1")
    assert [p.topic for p in outcomes[1].placements] == ["raw"] and not outcomes[1].ok
    (temp,) = records(store, "temps")
    assert temp.timestamp == 1_700_000_000_000 and temp.key == b"d1"
    (letter,) = records(store, "_dead_letters")
    assert letter.header("mqtt_topic") == b"s/d2/t" and letter.header("device") == b"c2"


async def test_dead_letter_of_a_device_name_with_a_lone_surrogate_is_stored() -> None:
    """A JSON device_id "\\ud800" is a str Python cannot encode as UTF-8: its dead letter used to raise
    UnicodeEncodeError out of ``write`` (the TCP connection closed with a traceback, nothing stored)."""
    store = MemoryLogStore()
    sink = IngestSink(store, Router([], RouteDefaults(sensors_topic="sensors")), HealthRegistry())
    line = b'{"device_id": "\\ud800", "sensor": "x"}'  # the sensor rule rejects it (no "ts")
    (outcome,) = await sink.write(TCP, [RawMessage(line)])
    assert outcome.rejected == ("route default-sensors-tcp: event time field 'ts' is missing",)
    (letter,) = records(store, "_dead_letters")
    assert letter.value == line
    assert letter.header("device") == "\ud800".encode("utf-8", "replace") == letter.key
