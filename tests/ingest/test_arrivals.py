"""Arrival rates and device states (active, slow, idle, bursty) from the health registry, on a fake clock.

The senders mirror ``sluice simulate``'s profiles: steady 10/s, slow 1/s, bursty 20 at once every 2 s.
"""

from __future__ import annotations

from ingest.arrivals import ArrivalRate, bucket_of, slow_devices
from ingest.health import HealthRegistry
from ingest.routing import SourceRef

SRC = SourceRef("mqtt", "default")


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def drive(health: HealthRegistry, clock: FakeClock, seconds: float, profiles: dict[str, str]) -> None:
    """Advance the clock in 100 ms steps, sending per profile at each step (as cli_simulate does)."""
    for step in range(int(seconds * 10)):
        for device, profile in profiles.items():
            batch = {"steady": 1, "slow": 1 if step % 10 == 0 else 0, "bursty": 20 if step % 20 == 0 else 0}[profile]
            if batch:
                health.record_batch(SRC, {device: [batch, 40 * batch]})
        clock.now += 0.1


def devices(health: HealthRegistry) -> dict[str, dict[str, object]]:
    return {str(r["device"]): r for r in health.snapshot() if r["type"] == "device"}


def test_states_of_the_simulated_profiles() -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock, idle_timeout_s=5)
    drive(health, clock, 3, {"gone": "steady"})
    drive(health, clock, 20, {"steady": "steady", "slow": "slow", "bursty": "bursty"})
    rows = devices(health)
    assert {name: row["state"] for name, row in rows.items()} == {
        "gone": "idle",
        "steady": "active",
        "slow": "slow",
        "bursty": "bursty",
    }
    assert 9 <= float(rows["steady"]["rate_per_s"]) <= 11  # type: ignore[arg-type]
    assert 0.8 <= float(rows["slow"]["rate_per_s"]) <= 1.2  # type: ignore[arg-type]
    assert 8 <= float(rows["bursty"]["rate_per_s"]) <= 12  # type: ignore[arg-type]
    source = health.snapshot(devices=False)[0]
    assert source["state"] == "bursty" and 18 <= source["rate_per_s"] <= 24


def test_a_lone_slow_device_is_active_and_a_fast_steady_one_is_not_bursty() -> None:
    clock = FakeClock()
    health = HealthRegistry(clock=clock, idle_timeout_s=60)
    drive(health, clock, 10, {"only": "slow"})
    assert devices(health)["only"]["state"] == "active"
    for _ in range(100):  # 60 messages per 100 ms: fast, but steady
        health.record_batch(SRC, {"fast": [60, 600]})
        clock.now += 0.1
    assert devices(health)["fast"]["state"] == "active"


def test_rate_is_right_early_and_decays_when_silent() -> None:
    rate = ArrivalRate()
    now = 0.0
    for _ in range(30):  # 3 s at 10/s
        rate.add(bucket_of(now), 1)
        now += 0.1
    per_s, _ = rate.read(bucket_of(now))
    assert 9 <= per_s <= 11  # bias-corrected: not a ramp from zero
    for _ in range(570):  # a minute at 10/s in all
        rate.add(bucket_of(now), 1)
        now += 0.1
    later, _ = rate.read(bucket_of(now + 30))
    assert 3.0 <= later <= 3.7  # 30 s of silence (the time constant): about a third of the rate is left
    assert rate.read(bucket_of(now)) == rate.read(bucket_of(now))  # reading changes nothing


def test_slow_needs_peers() -> None:
    assert slow_devices({"a": 1.0}) == set()
    assert slow_devices({"a": 1.0, "b": 10.0, "c": 10.0}) == {"a"}
    assert slow_devices({"a": 8.0, "b": 10.0, "c": 12.0}) == set()
