"""Arrival rate and burstiness of one source or device, in O(1) per write (pure: time comes in as an argument).

Messages are counted in 100 ms buckets. When a bucket closes, it is folded into an exponentially weighted
mean of messages per bucket and into a decaying peak (both forget with a 30 s time constant, and the empty
buckets since count as zeros). The mean is bias-corrected for the time since the first message, so a device
that started five seconds ago shows its real rate rather than a ramp from zero.

How a device is described (``state``; ``HealthRegistry.snapshot`` applies it, idle first):

- ``idle``: nothing arrived for ``ingest.idle_timeout_s`` (decided by the registry, not here);
- ``bursty``: at least ``BURST_MIN`` messages arrived within one 100 ms bucket recently, and that peak is at
  least ``BURST_RATIO`` times the mean per bucket (steady senders, however fast, have peak ≈ mean);
- ``slow``: the mean rate is below ``SLOW_FRACTION`` of the median rate of the non-idle devices of the same
  source (slow only means something next to peers: a lone device is never slow);
- ``active``: otherwise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["BUCKET_S", "BURST_MIN", "BURST_RATIO", "SLOW_FRACTION", "ArrivalRate", "bucket_of", "slow_devices"]

BUCKET_S = 0.1
TAU_S = 30.0
_KEEP = math.exp(-BUCKET_S / TAU_S)  # weight an older bucket keeps when a newer one closes
_GAIN = 1 - _KEEP
BURST_MIN = 5
BURST_RATIO = 4.0
SLOW_FRACTION = 0.25


def bucket_of(now_s: float) -> int:
    return int(now_s / BUCKET_S)


@dataclass(slots=True)
class ArrivalRate:
    first: int = -1  # bucket of the first message
    bucket: int = -1  # the open bucket
    count: int = 0  # messages in the open bucket
    mean: float = 0.0  # EWMA of messages per closed bucket (not bias-corrected)
    peak: float = 0.0  # decaying max of messages per closed bucket

    def add(self, bucket: int, messages: int) -> None:
        if bucket != self.bucket:
            if self.bucket < 0:
                self.first = bucket
            else:  # _folded inlined: this runs on the ingest path, once per device and 100 ms
                count = self.count
                mean = self.mean * _KEEP + count * _GAIN
                peak = self.peak * _KEEP
                if count > peak:
                    peak = float(count)
                gap = bucket - self.bucket
                if gap > 1:
                    decay = _KEEP ** (gap - 1)
                    mean *= decay
                    peak *= decay
                self.mean, self.peak = mean, peak
            self.bucket, self.count = bucket, 0
        self.count += messages

    def _folded(self, bucket: int) -> tuple[float, float]:
        """mean and peak once the open bucket and the empty ones up to ``bucket`` are closed."""
        gap = max(bucket - self.bucket, 1)
        mean = self.mean * _KEEP + self.count * (1 - _KEEP)
        peak = max(self.peak * _KEEP, float(self.count))
        decay = _KEEP ** (gap - 1)
        return mean * decay, peak * decay

    def read(self, bucket: int) -> tuple[float, float]:
        """(messages per second, peak messages in one bucket) as of ``bucket``; nothing is changed."""
        if self.bucket < 0:
            return 0.0, 0.0
        if bucket <= self.bucket:  # the open bucket is still filling: only closed ones count
            mean, peak, closed = self.mean, max(self.peak, float(self.count)), self.bucket - self.first
        else:
            (mean, peak), closed = self._folded(bucket), bucket - self.first
        if closed <= 0:
            return 0.0, peak
        mean /= 1 - _KEEP**closed  # bias correction: the EWMA started at zero ``closed`` buckets ago
        return mean / BUCKET_S, peak

    def bursty(self, bucket: int) -> bool:
        per_s, peak = self.read(bucket)
        return peak >= BURST_MIN and peak >= BURST_RATIO * per_s * BUCKET_S


def slow_devices(rates: dict[str, float]) -> set[str]:
    """Devices whose rate is below SLOW_FRACTION of the median of all the rates given (the non-idle ones)."""
    if len(rates) < 2:
        return set()
    bar = SLOW_FRACTION * statistics.median(rates.values())
    return {name for name, rate in rates.items() if rate < bar}
