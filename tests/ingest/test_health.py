"""Source health counters and idle detection, driven by a fake clock (no sleeping)."""

from __future__ import annotations

import json

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
