"""Rates of growing counters (high watermarks, bytes stored, bytes fetched) between console refreshes.

The console samples each counter when a page renders (every couple of seconds while someone looks) and
shows the change over the last ``window_s`` seconds. Time is passed in, so tests need no sleeps. Keys not
sampled for a window are forgotten, and at most ``max_keys`` are kept (the oldest sampled go first), so a
broker with many partitions does not grow this without bound.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable

__all__ = ["RateTracker"]


class RateTracker:
    def __init__(self, *, window_s: float = 10.0, max_keys: int = 50_000) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._samples: OrderedDict[Hashable, deque[tuple[float, float]]] = OrderedDict()

    def observe(self, key: Hashable, value: float, now: float) -> float | None:
        """Record ``value`` at ``now``; the rate per second over the window (None until two samples)."""
        samples = self._samples.pop(key, None)
        if samples is None:
            samples = deque()
        self._samples[key] = samples  # most recently sampled last
        if samples and value < samples[-1][1]:
            samples.clear()  # the counter went back (topic recreated, records deleted): start over
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((now, value))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        self._forget(now)
        first_t, first_v = samples[0]
        elapsed = now - first_t
        if elapsed <= 0:
            return None
        return (value - first_v) / elapsed

    def _forget(self, now: float) -> None:
        while self._samples:
            key, samples = next(iter(self._samples.items()))
            if len(self._samples) <= self.max_keys and now - samples[-1][0] < self.window_s:
                break
            del self._samples[key]
