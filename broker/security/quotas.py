"""Per-principal produce quotas (bytes per second), measured and enforced as Kafka's ClientQuotaManager does.

Rules:
- Each principal has a quota: its override, else the default; 0 means none. Every connection of one
  principal shares it (Kafka's ``/config/users/<user>`` quota; unauthenticated connections all count as
  ``ANONYMOUS``).
- The rate is Kafka's sampled ``Rate``: bytes recorded into ``samples`` windows of ``window_s`` (Kafka's
  ``quota.window.num`` = 11 and ``quota.window.size.seconds`` = 1); the rate is their sum over the time they
  span, counted as at least ``samples - 1`` whole windows so a first burst is not judged over a few
  milliseconds.
- Each Produce request's size is recorded, then if the rate is over the quota the throttle time is
  ``(rate - quota) / quota * window span`` (Kafka's ``QuotaUtils.throttleTime``): how long the principal must
  stay silent for its rate to fall back to the quota (approximately: as in Kafka, a burst keeps counting
  until its window is ``samples`` windows old). The request is still served; the answer carries
  ``throttle_time_ms`` and the connection is muted for that long (``broker/server/kafka.py``).

Sans-IO: time comes from the ``clock`` given at construction.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["ProduceQuotas", "SampledRate"]


@dataclass
class SampledRate:
    """Bytes per second over the last ``samples`` windows of ``window_s`` seconds (Kafka's SampledStat Rate)."""

    samples: int = 11
    window_s: float = 1.0
    _windows: deque[list[float]] = field(default_factory=deque)  # [start, bytes], oldest first

    def record(self, value: float, now: float) -> None:
        windows = self._windows
        if not windows or now - windows[-1][0] >= self.window_s:
            windows.append([now, 0.0])
        windows[-1][1] += value
        self._purge(now)

    def _purge(self, now: float) -> None:
        expire_age = self.samples * self.window_s  # Kafka's purgeObsoleteSamples
        while self._windows and now - self._windows[0][0] >= expire_age:
            self._windows.popleft()

    def span(self, now: float) -> float:
        """Seconds the rate is measured over (Kafka's Rate.windowSize)."""
        self._purge(now)
        elapsed = now - self._windows[0][0] if self._windows else 0.0
        full = int(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed

    def rate(self, now: float) -> float:
        span = self.span(now)
        return sum(w[1] for w in self._windows) / span if span > 0 else 0.0


class ProduceQuotas:
    def __init__(self, default_bytes_per_s: int = 0, overrides: Mapping[str, int] | None = None, *,
                 samples: int = 11, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.default = default_bytes_per_s
        self.overrides = dict(overrides or {})
        self._samples = samples
        self._window_s = window_s
        self._clock = clock
        self._rates: dict[str, SampledRate] = {}
        self.throttled = 0  # Produce answers that carried a throttle time
        self.throttle_ms_total = 0

    @property
    def enabled(self) -> bool:
        return self.default > 0 or any(v > 0 for v in self.overrides.values())

    def quota_of(self, principal: str) -> int:
        return self.overrides.get(principal, self.default)

    def record(self, principal: str, size: int) -> int:
        """Record a Produce request of ``size`` bytes by ``principal``; the throttle time in ms (0: within quota)."""
        quota = self.quota_of(principal)
        if quota <= 0:
            return 0
        now = self._clock()
        rate = self._rates.get(principal)
        if rate is None:
            rate = self._rates[principal] = SampledRate(self._samples, self._window_s)
        rate.record(size, now)
        observed = rate.rate(now)
        if observed <= quota:
            return 0
        throttle_ms = round((observed - quota) / quota * rate.span(now) * 1000)
        if throttle_ms > 0:
            self.throttled += 1
            self.throttle_ms_total += throttle_ms
        return throttle_ms
