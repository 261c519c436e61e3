"""Counter rates between console refreshes, with time passed in."""

from __future__ import annotations

from sluice.console.rates import RateTracker


def test_rate_over_the_window() -> None:
    rates = RateTracker(window_s=10)
    assert rates.observe("t", 100, now=0.0) is None
    assert rates.observe("t", 110, now=1.0) == 10.0
    for second in range(2, 30):
        rate = rates.observe("t", 100 + 10 * second, now=float(second))
    assert rate == 10.0
    assert rates.observe("t", 390, now=30.0) is not None  # a slowdown shows within the window
    assert rates.observe("t", 390, now=45.0) == 0.0


def test_counter_going_back_starts_over_and_keys_are_bounded() -> None:
    rates = RateTracker(window_s=10, max_keys=3)
    rates.observe("t", 500, now=0.0)
    assert rates.observe("t", 5, now=1.0) is None  # topic recreated: no negative rate
    for key in range(10):
        rates.observe(key, 1, now=2.0)
    assert len(rates._samples) == 3
