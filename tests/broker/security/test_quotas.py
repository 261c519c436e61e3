"""Produce quotas as Kafka's ClientQuotaManager measures them (sampled rate, throttle formula), on a fake clock."""

from __future__ import annotations

from broker.security import ProduceQuotas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_within_quota_is_never_throttled() -> None:
    clock = Clock()
    quotas = ProduceQuotas(1000, clock=clock)
    for _ in range(100):
        assert quotas.record("alice", 900) == 0  # 900 B every second for 100 s: under 1000 B/s
        clock.now += 1
    assert quotas.throttled == 0


def test_a_burst_is_throttled_by_kafkas_formula_and_decays() -> None:
    clock = Clock()
    quotas = ProduceQuotas(1000, clock=clock)
    # 20,000 B at once: judged over at least 10 windows (10 s) -> 2,000 B/s, twice the quota:
    # throttle = (2000 - 1000) / 1000 * 10 s = 10 s
    assert quotas.record("alice", 20_000) == 10_000
    assert quotas.throttled == 1 and quotas.throttle_ms_total == 10_000
    clock.now += 5
    assert quotas.record("alice", 1) > 0  # still over: 20,001 B over 10 s
    clock.now += 6  # the burst's window is 11 windows old: forgotten (Kafka's purgeObsoleteSamples)
    assert quotas.record("alice", 1) == 0


def test_principals_have_their_own_rates_and_overrides() -> None:
    clock = Clock()
    quotas = ProduceQuotas(1000, {"bulk": 0, "tiny": 100}, clock=clock)
    assert quotas.record("bulk", 10**9) == 0  # 0 = unlimited for this principal
    assert quotas.record("alice", 5_000) == 0  # 500 B/s over 10 s
    assert quotas.record("bob", 5_000) == 0  # bob does not share alice's rate
    assert quotas.record("tiny", 5_000) == 40_000  # 500 B/s against 100: (500 - 100) / 100 * 10 s
    assert ProduceQuotas().enabled is False and ProduceQuotas(0, {"x": 5}).enabled is True


def test_old_windows_are_forgotten() -> None:
    clock = Clock()
    quotas = ProduceQuotas(1000, samples=3, window_s=1.0, clock=clock)
    assert quotas.record("alice", 5_000) > 0
    clock.now += 5  # beyond 3 windows: the burst no longer counts
    assert quotas.record("alice", 1_000) == 0
