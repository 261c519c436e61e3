"""Source health counters and idle detection, driven by a fake clock (no sleeping)."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ingest.arrivals import ArrivalRate, bucket_of
from ingest.health import OVERFLOW_DEVICE, HealthRegistry
from ingest.routing import SourceRef

SRC = SourceRef("tcp", "default")


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_counters_per_source_and_device() -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock, idle_timeout_s=60)
    health.record(SRC, "d1", 10)
    health.record(SRC, "d1", 5)
    health.record(SRC, "d2", 7)
    health.record(SRC, None, 3)
    health.error(SRC, "d2", "bad line")
    health.add_in_flight(SRC, 4)
    rows = health.snapshot()
    json.dumps(rows)  # JSON-ready
    source = rows[0]
    assert source["type"] == "source" and source["source"] == "tcp:default"
    assert (source["messages"], source["bytes"], source["errors"]) == (4, 25, 1)
    assert source["last_error"] == "bad line" and source["in_flight"] == 4
    assert source["last_seen_ms"] == 1_000_000
    devices = {row["device"]: row for row in rows[1:]}
    assert devices["d1"]["messages"] == 2 and devices["d1"]["bytes"] == 15
    assert devices["d2"]["errors"] == 1


def test_idle_detection_follows_the_clock() -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock, idle_timeout_s=30)
    health.register(SRC)
    assert not health.is_idle(SRC)  # registered just now
    clock.now += 31
    assert health.is_idle(SRC)  # never sent anything for longer than the timeout
    health.record(SRC, "d1", 1)
    clock.now += 20
    health.record(SRC, "d2", 1)
    assert not health.is_idle(SRC)
    clock.now += 15
    assert health.is_idle(SRC, "d1") and not health.is_idle(SRC, "d2")
    assert health.idle_devices(SRC) == ["d1"]
    flags = {row.get("device"): row["idle"] for row in health.snapshot()}
    assert flags == {None: False, "d1": True, "d2": False}
    clock.now += 31
    assert health.is_idle(SRC)
    assert health.is_idle(SourceRef("tcp", "never-registered"))


def test_paused_time_and_connections() -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock)
    health.connection_opened(SRC)
    health.connection_opened(SRC)
    health.pause_started(SRC)
    clock.now += 2
    health.pause_started(SRC)  # a second reader paused while the first still is: one pause
    clock.now += 1
    assert health.snapshot()[0]["paused_s"] == 3.0 and health.snapshot()[0]["paused"]
    health.pause_ended(SRC)
    health.pause_ended(SRC)
    health.pause_ended(SRC)  # unbalanced end is ignored
    clock.now += 5
    with health.paused(SRC):
        clock.now += 0.5
    health.connection_closed(SRC)
    row = health.snapshot()[0]
    assert row["paused_s"] == 3.5 and row["pauses"] == 2 and not row["paused"]
    assert (row["connections"], row["connections_total"]) == (1, 2)


def test_device_count_is_bounded() -> None:
    health = HealthRegistry(clock=FakeClock(), max_devices_per_source=3)
    for i in range(10):
        health.record(SRC, f"d{i}", 1)
    entry = health.source(SRC)
    assert entry is not None
    assert sorted(entry.devices) == [OVERFLOW_DEVICE, "d0", "d1", "d2"]
    assert entry.devices[OVERFLOW_DEVICE].messages == 7
    assert sum(d.messages for d in entry.devices.values()) == 10


# The device counts of a write wait in the open 100 ms bucket and are folded in when it closes or the
# registry is read. Checked against a model that applies every write to its devices at once (what the
# registry did before): counters, last seen, arrival buckets and the order devices were created in (which
# decides who lands in the overflow device), whatever the interleaving of writes, errors, clock steps and
# reads.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.dictionaries(st.sampled_from([None, "a", "b", "c", "d", "e"]),
                                                    st.tuples(st.integers(1, 9), st.integers(0, 99)), max_size=4)),
        st.tuples(st.just("error"), st.sampled_from([None, "a", "c", "f"])),
        st.tuples(st.just("tick"), st.sampled_from([0.001, 0.03, 0.1, 0.25, 2.0])),
        st.tuples(st.just("read"), st.sampled_from(["source", "snapshot", "idle"])),
    ),
    max_size=40,
)


@settings(max_examples=200)
@given(steps=_steps, limit=st.integers(1, 6))
# two devices over the cap share OVERFLOW_DEVICE; the later write's last seen was overwritten by the other's
@example(steps=[("write", {None: (1, 0), "a": (1, 0), "b": (1, 0), "c": (1, 0)}), ("tick", 0.001),
                ("write", {None: (1, 0), "b": (1, 0)})], limit=1)
def test_devices_count_as_if_every_write_were_applied_at_once(steps: list[tuple[str, object]], limit: int) -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock, max_devices_per_source=limit)
    model: dict[str, list[object]] = {}  # device -> [messages, bytes, errors, last seen, ArrivalRate]

    def device(name: str) -> list[object]:
        if name not in model and len(model) >= limit:
            name = OVERFLOW_DEVICE
        return model.setdefault(name, [0, 0, 0, None, ArrivalRate()])

    for kind, arg in steps:
        if kind == "write":
            assert isinstance(arg, dict)
            if arg:
                health.record_batch(SRC, {name: list(counts) for name, counts in arg.items()})
            for name, (messages, nbytes) in arg.items():
                if name is not None:
                    row = device(name)
                    row[0], row[1], row[3] = int(row[0]) + messages, int(row[1]) + nbytes, clock.now  # type: ignore[call-overload]
                    rate = row[4]
                    assert isinstance(rate, ArrivalRate)
                    rate.add(bucket_of(clock.now), messages)
        elif kind == "error":
            health.error(SRC, arg if isinstance(arg, str) else None, "bad")
            if isinstance(arg, str):
                row = device(arg)
                row[2] = int(row[2]) + 1  # type: ignore[call-overload]
        elif kind == "tick":
            assert isinstance(arg, float)
            clock.now += arg
        elif arg == "snapshot":
            health.snapshot()
        elif arg == "idle":
            health.idle_devices(SRC)
        entry = health.source(SRC) if kind == "read" and arg == "source" else None
        if entry is not None:
            assert list(entry.devices) == list(model)
    entry = health.source(SRC)
    got = {} if entry is None else {
        name: [d.messages, d.bytes, d.errors, d.last_seen, d.arrivals] for name, d in entry.devices.items()}
    assert list(got) == list(model)
    assert got == model
